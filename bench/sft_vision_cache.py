"""SFT with a frozen vision tower: the pixels encoded at every step against the features cached
once per example (sft.cache_vision_features), in one process, on the same rows and model.

    python bench/sft_vision_cache.py                                     # the toy rows and the dense rows
    python bench/sft_vision_cache.py --sets dense --rows 64 --steps 10   # one set, more steps
    python bench/sft_vision_cache.py --config configs/paragrpo.py:tiny --sets toy --rows 4 --batch 2 \\
        --steps 3 --set data.builtin_root=DIR                             # the suite's size

Sets: `toy` is the preset as it is (the main job's SFT rows: K = 4); `dense` is the shortcut-prior
cold start of docs/toy_task.md's table "What a dense cold start costs" (K drawn from 4 to 64,
direct answers from K = 32 at 0.75, 1024-token rows, 4 rows and 256 frames a micro-batch).
For each set the bench takes the rows the run's first steps would draw (`--rows`, in the run's
order, then re-indexed: each row's K is drawn again, from the same choices) and trains `--steps`
steps on them in both arms from the same model, the tower frozen in both. The first rows /
batch steps read every example (and, cached, encode it): the run's first epoch. The steps after
it are what the rest of a long SFT is made of: every example read and encoded before.

Prints per set and arm: the median step seconds of the first epoch (without step 0, which
compiles) and of the steps after it,
the encoding's seconds and frames, and the kept features' host memory (MiB per example, and
for every row of the set at the mean of the rows read); then how far the arms' losses are apart
(the same math; the features are computed in other calls than the steps' vision passes, so the
last bits differ) and the estimate for the set's whole SFT (`sft.steps` steps: the first epoch
of the whole set's rows, then the rest at the steady step).
"""
from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import importlib.util
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine, print_table  # noqa: E402

# the dense cold start of docs/toy_task.md (its best layout: 1024-token rows, 4 a micro-batch)
DENSE = {"sft.nframes_choices": (4, 8, 16, 32, 64), "sft.direct_from_nframes": 32, "sft.direct_share": 0.75,
         "sft.train_width": 1024, "sft.max_tokens_per_micro_batch": 4 * 1024, "sft.train_frames": 256}
SETS = {"toy": {}, "dense": DENSE}


def load_config(spec: str):
    """configs/<file>.py:<preset> -> its ConfigDict."""
    path, _, preset = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location("bench_config", os.path.join(ROOT, path)
                                                         if not os.path.isabs(path) else path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(preset)


def with_overrides(config, overrides: dict):
    config = copy.deepcopy(config)
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = config
        for name in parents:
            node = node[name]
        node[leaf] = value
    return config


def parse_value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def chosen_rows(sft_config, kinds, count: int) -> list[int]:
    """The first `count` distinct rows the run's steps draw (its curriculum included)."""
    from paravt_jax.sft.trainer import curriculum_rows, step_rows

    first = curriculum_rows(tuple(kinds), sft_config)
    seen: dict[int, None] = {}
    index = 0
    while len(seen) < count and index < 10_000:
        for row in step_rows(index, sft_config, len(kinds), first):
            seen.setdefault(row, None)
        index += 1
    return list(seen)[:count]


def run_arm(inputs, picked: list[int], sft_config, cached: bool, workdir: str) -> list[dict]:
    from paravt_jax.sft.trainer import train_sft

    config = dataclasses.replace(sft_config, cache_vision_features=cached, first_steps=0, first_kinds=())
    model = copy.deepcopy(inputs.model)
    _, result = train_sft(model, inputs.tokenizer, [inputs.sft.rows[i] for i in picked], inputs.video_root,
                          workdir, config)
    return result.history


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def arm_rows(name: str, histories: dict, picked: int, sft_config, total_rows: int) -> list[list]:
    """One table row per arm. The first epoch's median leaves out step 0 (the compiles) when
    the epoch has more steps. The estimate: `sft.steps` steps, those of the whole set's first
    epoch (every row read, and encoded) at the first epoch's median, the others at the later
    median."""
    epoch = -(-picked // sft_config.batch_size)
    whole_epoch = min(sft_config.steps, -(-total_rows // sft_config.batch_size))
    rows = []
    for cached, history in histories.items():
        first = median(h["step_s"] for h in history[1:epoch] or history[:1])  # step 0 also compiles
        later = median(h["step_s"] for h in history[epoch:])
        later_cpu = median(h["step_cpu_s"] for h in history[epoch:])
        later_grads = median(h["grads_s"] for h in history[epoch:])
        per_example = history[-1].get("vision_cache_mib", 0.0) / picked
        estimate = first * whole_epoch + later * (sft_config.steps - whole_epoch)
        rows.append([name, "cached" if cached else "pixels", f"{first:.2f}", f"{later:.2f}", f"{later_cpu:.2f}",
                     f"{later_grads:.2f}",
                     f"{sum(h.get('vision_encode_s', 0.0) for h in history):.1f}",
                     str(sum(int(h.get("vision_frames_encoded", 0)) for h in history)),
                     f"{per_example:.3f}" if cached else "-", f"{per_example * total_rows:.0f}" if cached else "-",
                     f"{estimate / 60:.1f}"])
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/paragrpo.py:toy")
    parser.add_argument("--sets", default="toy,dense", help=f"comma-separated, of {sorted(SETS)}")
    parser.add_argument("--rows", type=int, default=32, help="rows per set (the run's first draws)")
    parser.add_argument("--batch", type=int, default=0, help="rows a step (0: the preset's sft.batch_size)")
    parser.add_argument("--steps", type=int, default=6, help="steps per arm")
    parser.add_argument("--set", action="append", default=[], help="key=value config overrides, both arms")
    args = parser.parse_args(argv)
    from paravt_jax.cli.assembly import setup
    from paravt_jax.run_config import build_run

    base = with_overrides(load_config(args.config),
                          {k: parse_value(v) for k, v in (item.split("=", 1) for item in args.set)})
    base.sft.optimizer.frozen = ("visual",)  # the cache's premise, in both arms
    if args.batch:
        base.sft.batch_size = args.batch
    inputs = setup(build_run(base))
    table = []
    for name in args.sets.split(","):
        if name not in SETS:
            raise SystemExit(f"sft_vision_cache: unknown set {name!r}; choose from {sorted(SETS)}")
        config = build_run(with_overrides(base, SETS[name])).sft
        picked = chosen_rows(config, inputs.sft.kinds, args.rows)
        epoch = -(-len(picked) // config.batch_size)
        histories = {}
        with tempfile.TemporaryDirectory(prefix="paravt-sft-vision-cache-") as tmp:
            for cached in (False, True):
                histories[cached] = run_arm(inputs, picked, dataclasses.replace(config, steps=args.steps),
                                            cached, os.path.join(tmp, f"{name}-{cached}"))
        table += arm_rows(name, histories, len(picked), config, len(inputs.sft.rows))
        pairs = list(zip(histories[False], histories[True]))
        apart = {key: max(abs(a[key] - b[key]) / max(abs(a[key]), 1e-9) for a, b in pairs)
                 for key in ("loss", "grad_norm")}
        same = [i for i, (a, b) in enumerate(pairs) if (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"])]
        print(f"[bench] {name}: {len(picked)} rows, {config.batch_size} a step, first epoch {epoch} steps; over "
              f"{len(pairs)} steps the arms' losses are apart by at most {apart['loss']:.2e} relative, gradient "
              f"norms by {apart['grad_norm']:.2e}; the same bits at {len(same)} steps", flush=True)
    print(f"\n{machine()}; {args.config}, {args.steps} SFT steps an arm")
    print_table("SFT step: pixels every step vs vision features cached once",
                ["rows", "arm", "first-epoch step s", "later step s", "later step CPU s", "later grads s",
                 "encode s", "frames encoded",
                 "cache MiB an example", f"cache MiB, all {len(inputs.sft.rows)} rows", "estimated SFT minutes"],
                table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
