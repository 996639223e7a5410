"""The packed prompt prefill (SamplerConfig.prompt_packing) against the right-padded one, in the
same run, on the same prompts: a generate() call's seconds (its prefill and one sampled token),
the token slots each computes, and whether both sample the same greedy tokens.

Calls of the toy RL rollout, with its fixed sizes (configs/paragrpo.py:toy, rl.shapes):
  subagent       16 prompt rows of 288 tokens, 16 prompts of 152-208 tokens (a crop of 1-8 frames:
                 152 tokens and 8 a frame; the toy's 4-second windows are 4 frames, 176)
  subagent_part  the same call with 5 prompts (a round's last call: its other rows padding)
  first_turn     4 prompt rows of 1,024 tokens; prompts of ~930, ~480 and ~100 tokens (K = 64, 32, 4)
Text prompts of those lengths (the vision pass is the same in both layouts, and not timed here).

    python bench/prompt_packing.py [--model CHECKPOINT|PRESET] [--repeats 5] [--calls subagent,subagent_part,first_turn]

The model: the toy main job's trained checkpoint (notebooks/assets/toy_paragrpo); a preset name
runs it randomly initialised. Exits non-zero when the two layouts sample other tokens.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine, print_table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = os.path.join(ROOT, "notebooks", "assets", "toy_paragrpo")
# call -> (prompt rows, width, prompt lengths drawn as (low, high, count) or given)
CALLS = {"subagent": (16, 288, (152, 209, 16)), "subagent_part": (16, 288, (152, 209, 5)),
         "first_turn": (4, 1024, [930, 480, 100, 104])}


def load(name: str):
    from paravt_jax.models.qwen3_vl import init_model, load_pretrained, preset

    if os.path.isdir(name):
        return load_pretrained(name, dtype="float32", attention_block=128)  # the toy preset's blocks
    return init_model(preset(name, attention_block=128), seed=0)


def call_prompts(call: str, seed: int):
    from paravt_jax.text.inputs import encode_ids

    rows, _, lengths = CALLS[call]
    rng = np.random.default_rng(seed)
    if isinstance(lengths, tuple):
        low, high, count = lengths
        lengths = rng.integers(low, high, count).tolist()
    return [encode_ids(rng.integers(0, 900, n).tolist(), 0) for n in lengths]


def measure(model, call: str, repeats: int) -> list:
    from paravt_jax.sampling import Sampler, SamplerConfig, SamplingParams
    from paravt_jax.sampling.calls import PromptShape
    from paravt_jax.sampling.chunks import pack_rows
    from paravt_jax.sampling.sampler import packed_rows

    rows, width, _ = CALLS[call]
    shape = PromptShape(rows, width, 0)
    prompts = call_prompts(call, 0)
    sampling = SamplingParams(max_new_tokens=1)
    samplers = {packing: Sampler(model, SamplerConfig(prompt_packing=packing)) for packing in (False, True)}
    tokens = {p: s.generate(prompts, sampling=sampling, shape=shape)[0].tokens for p, s in samplers.items()}  # compiles
    best = {p: float("inf") for p in samplers}
    for _ in range(repeats):  # the layouts interleaved: a machine's load drifts alike over both
        for packing, sampler in samplers.items():
            start = time.perf_counter()
            sampler.generate(prompts, sampling=sampling, shape=shape)
            best[packing] = min(best[packing], time.perf_counter() - start)
    used = pack_rows([p.length for p in prompts], width)[1]
    packed = min(n for n in packed_rows(rows) if n >= used)
    real = sum(p.length for p in prompts)
    if tokens[False] != tokens[True]:
        raise SystemExit(f"[bench] {call}: the packed prefill sampled other tokens than the padded one")
    return [[call, "padded", f"{rows} x {width}", rows * width, real, f"{best[False]:.4f}", "1.00x", "yes"],
            [call, "packed", f"{packed} x {width}", packed * width, real, f"{best[True]:.4f}",
             f"{best[False] / best[True]:.2f}x", "yes"]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=TOY if os.path.isdir(TOY) else "toy")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per layout (the best is reported)")
    parser.add_argument("--calls", default="subagent,subagent_part,first_turn")
    args = parser.parse_args(argv)
    calls = [c for c in args.calls.split(",") if c]
    unknown = [c for c in calls if c not in CALLS]
    if unknown or args.repeats < 1:
        parser.error(f"--calls: expected some of {sorted(CALLS)}, got {unknown}; --repeats >= 1")
    model = load(args.model)
    print(f"[bench] {machine()}; model {args.model}")
    rows = [row for call in calls for row in measure(model, call, args.repeats)]
    print_table("The packed prompt prefill against the right-padded one (generate(), one token)",
                ["call", "layout", "rows x width", "token slots", "prompt tokens", "best s", "speed-up",
                 "same tokens"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
