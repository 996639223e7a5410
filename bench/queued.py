"""Many single-turn prompts (a tool round's sub-agent calls) through a few decode rows: calls of
`--slots` prompts one after another, each as long as its longest sample, against one call whose
rows take the next waiting prompt as their sample ends (Sampler.sample_queued, issue 48's rows
refilled), in the same run, on the same prompts, every prompt's tokens checked equal.

`--prompts` prompts of `--prompt`/2 to `--prompt` tokens, sampled at temperature 1 with a budget
of `--new` tokens and stop ids drawn from the model's own most frequent tokens so that the
samples end after about `--mean` tokens on average (a spread of lengths, as summaries have). Per
arm: seconds (best of `--repeats` after a warm-up that compiles), generated tokens per second,
and the decode row-steps the rows spent (rows x steps of each decode, a row idle or not).

    python bench/queued.py [--model CHECKPOINT|PRESET] [--prompts 48 --slots 16 --prompt 300 --new 128 --mean 32]

The model: the toy main job's trained checkpoint (notebooks/assets/toy_paragrpo); a preset name
runs it randomly initialised.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine, print_table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = os.path.join(ROOT, "notebooks", "assets", "toy_paragrpo")


def load(name: str):
    from paravt_jax.models.qwen3_vl import init_model, load_pretrained, preset

    if name == "trained":
        return load_pretrained(TOY)
    if os.path.isdir(name):
        return load_pretrained(name)
    return init_model(preset(name), seed=0)


def stop_ids_for(sampler, prompts, sampling, mean: int) -> tuple[int, ...]:
    """Up to 8 tokens the model emits, the most frequent whose shares of the emitted tokens add
    up to at most about 1 / mean, so that a sample stops after about `mean` tokens."""
    out, _ = sampler.generate(prompts, sampling=sampling, row_ids=list(range(len(prompts))))
    counts = collections.Counter(t for row in out.tokens for t in row)
    total, share, stops = sum(counts.values()), 0.0, []
    for token, n in counts.most_common():
        if len(stops) < 8 and share + n / total <= 1.2 / mean:
            stops.append(token)
            share += n / total
    return tuple(stops)


def sampling_parser(prompts: int) -> argparse.ArgumentParser:
    """The arguments this bench and bench/turns.py share: the model, the prompts and their
    length, the budget, the mean sample the stop ids aim at, the repeats."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="trained", help="'trained' (the toy main job's), a checkpoint or a preset")
    parser.add_argument("--prompts", type=int, default=prompts)
    parser.add_argument("--prompt", type=int, default=300)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--mean", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    return parser


def random_prompts(rng, count: int, length: int, vocab: int) -> list:
    """`count` prompts of `length` / 2 to `length` random token ids below min(vocab, 900)."""
    from paravt_jax.text.inputs import encode_ids

    return [encode_ids(rng.integers(0, min(vocab, 900), int(n)).tolist(), 0)
            for n in rng.integers(max(length // 2, 1), length + 1, count)]


def best_of(arms: dict, repeats: int) -> dict:
    """name -> (the best seconds of `repeats` runs after a warm-up that compiles, then what the
    arm's function returns: its tokens and row-steps)."""
    results = {}
    for name, fn in arms.items():
        fn()  # compiles
        best = None
        for _ in range(repeats):
            start = time.perf_counter()
            out = fn()
            seconds = time.perf_counter() - start
            best = seconds if best is None else min(best, seconds)
        results[name] = (best, *out)
    return results


def speed_rows(results: dict, generated: int, baseline: str) -> list[list[str]]:
    """The table's rows of `best_of`'s results (the first arm the baseline): seconds, tokens a
    second, decode row-steps and speed-up; exits non-zero if an arm's tokens differ from it."""
    first = next(iter(results))
    rows = []
    for name, (seconds, tokens, row_steps) in results.items():
        if tokens != results[first][1]:
            raise SystemExit(f"{name}: other tokens than {baseline}")
        rows.append([name, f"{seconds:.3f}", f"{generated / seconds:,.0f}", f"{row_steps:,}",
                     f"{results[first][0] / seconds:.2f}x"])
    return rows


def main():
    parser = sampling_parser(prompts=48)
    parser.add_argument("--slots", type=int, default=16)
    args = parser.parse_args()

    from paravt_jax.sampling import Sampler, SamplerConfig, SamplingParams
    from paravt_jax.sampling.calls import PromptShape

    print(f"machine: {machine()}")
    model = load(args.model)
    rng = np.random.default_rng(0)
    prompts = random_prompts(rng, args.prompts, args.prompt, model.config.text.vocab_size)
    sampler = Sampler(model, SamplerConfig(prompt_packing=True))
    shape = PromptShape(rows=args.slots, width=args.prompt)
    sampling = SamplingParams(max_new_tokens=args.new, temperature=1.0)
    stops = stop_ids_for(sampler, prompts[:args.slots], sampling, args.mean)
    sampling = SamplingParams(max_new_tokens=args.new, temperature=1.0, stop_ids=stops)
    ids = list(range(len(prompts)))

    def one_after_another():
        tokens, row_steps = [], 0
        for start in range(0, len(prompts), args.slots):
            out, _ = sampler.generate(prompts[start:start + args.slots], sampling=sampling, seed=1,
                                      row_ids=ids[start:start + args.slots], shape=shape)
            tokens += out.tokens
            row_steps += out.row_steps
        return tokens, row_steps

    def refilled(refill_at):
        def run():
            out = sampler.sample_queued(prompts, args.slots, sampling=sampling, seed=1, row_ids=ids, shape=shape,
                                        refill_at=refill_at)
            return out.tokens, out.row_steps
        return run

    arms = {"calls of --slots prompts, one after another": one_after_another,
            "one call, rows refilled as samples end": refilled(1),
            f"one call, refilled {max(args.slots // 4, 1)} rows at a time (the default)": refilled(0)}
    results = best_of(arms, args.repeats)
    reference = results[next(iter(arms))][1]
    generated = sum(len(t) for t in reference)
    lengths = np.array([len(t) for t in reference])
    rows = speed_rows(results, generated, "the calls one after another")
    print(f"{len(prompts)} prompts of {args.prompt // 2}-{args.prompt} tokens, {args.slots} rows, "
          f"budget {args.new}, stop ids {list(stops)}: samples of {lengths.min()}-{lengths.max()} tokens "
          f"(mean {lengths.mean():.1f}, {generated:,} in all); the same tokens in every arm")
    print_table("sub-agent-like calls: rows refilled vs calls one after another",
                ["arm", "seconds", "tokens/s", "decode row-steps", "speed-up"], rows)


if __name__ == "__main__":
    main()
