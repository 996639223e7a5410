"""The decode's read of the KV cache: the bounded read (SamplerConfig.decode_window="used": each
row, while it samples, its prompt and its suffix up to the last filled block) and the same on
pages ("paged": decode_cache="paged", pages of `--page` slots, the XLA read on CPU) against the
full read of every reserved slot ("capacity", the read before issue 48), in the same run, on
the same prompts, greedy tokens checked equal.

A toy-scale rollout on this CPU: `--prompts` prompts of about `--prompt` tokens, `--samples`
samples each, a first turn and `--turns` tool rounds of `--new` tokens each (the suffix cache
reserved for the whole episode up front, as the RL rollouts reserve it), tool responses of
about `--response` tokens. Per read: the rollout's seconds (best of `--repeats` after a
warm-up episode that compiles), generated tokens per second, and the cache slots a decode
step reads at the episode's last step.

    python bench/decode.py [--model CHECKPOINT|PRESET] [--prompts 4 --samples 4 --prompt 900 --new 256 --turns 3]

The model: the toy main job's trained checkpoint (notebooks/assets/toy_paragrpo) with the toy
recipe's 128-slot attention blocks; a preset name runs it randomly initialised.

Then, at the attention level, the paged read (paravt_jax/sampling/pages.py: the same caches in
pages of `--page` slots, each prompt's full pages shared by its samples, the XLA read blockwise
over blocks of pages) beside today's contiguous read of the bounded decode (its prompt and its
suffix, two partial attentions merged), on one layer of the "used" episode's final caches and
the same queries, outputs checked equal: the seconds of one read each (best of `--repeats` x 20
calls): the attention's share of the rollout arms' difference.

`--compiled LAYERS` also compiles one decode step of the 8B's shapes (64 rows x 20,480 suffix
slots, 8 prompts x 16,384 prefix slots, bf16) with LAYERS decoder layers for `--target`
(cpu: XLA:CPU on this machine; tpu: libtpu for one v5p chip, minutes to compile) and prints
XLA's bytes per step and the analytic attention bytes the time plan adds; as the recipes'
rollouts compile it (no top-p / top-k branch) unless `--truncation`.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine, print_table  # noqa: E402

# the decode reads measured: name -> SamplerConfig fields
READS = {"capacity": dict(decode_window="capacity"), "used": dict(decode_window="used"),
         "paged": dict(decode_window="used", decode_cache="paged")}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = os.path.join(ROOT, "notebooks", "assets", "toy_paragrpo")  # the toy main job's final model


def episode(sampler, prompts, args, seed: int = 0):
    """One greedy episode: generate, then args.turns extends with tool responses of random
    lengths. Returns (every turn's SampleOutput, the final state)."""
    from paravt_jax.sampling import SamplingParams
    from paravt_jax.text.inputs import encode_ids

    rng = np.random.default_rng(seed)
    sampling = SamplingParams(max_new_tokens=args.new)
    reserve = [(args.response, args.new)] * args.turns
    out, state = sampler.generate(prompts, num_samples=args.samples, sampling=sampling, reserve=reserve)
    outs = [out]
    for _ in range(args.turns):
        lengths = rng.integers(max(args.response // 4, 1), args.response + 1, state.num_rows)
        chunks = [encode_ids(rng.integers(0, 900, n).tolist(), int(state.chunk_start[b]))
                  for b, n in enumerate(lengths)]
        out, state = sampler.extend(state, chunks, sampling=sampling)
        outs.append(out)
    return outs, state


def rollouts(model, prompts, args) -> dict:
    """read -> (best episode seconds, the outputs, the final state) with READS[read]; the reads'
    episodes interleaved (a machine's load drifts alike over all)."""
    from paravt_jax.sampling import Sampler, SamplerConfig

    samplers = {name: Sampler(model, SamplerConfig(decode_page=args.page, **fields)) for name, fields in READS.items()}
    results = {w: (float("inf"), *episode(s, prompts, args)) for w, s in samplers.items()}  # warm-up: compiles
    for _ in range(args.repeats):
        for window, sampler in samplers.items():
            start = time.perf_counter()
            outs, state = episode(sampler, prompts, args)
            results[window] = (min(results[window][0], time.perf_counter() - start), outs, state)
    return results


def attention_reads(state, backend, page: int, repeats: int) -> tuple[float, float, float]:
    """(contiguous read s, paged XLA read s, largest output difference) of one decode step's
    attention over layer 0 of `state`'s caches, every row attending, random queries."""
    import functools

    import jax
    import jax.numpy as jnp

    from paravt_jax.sampling import pages as PG

    prefix, suffix = state.prefix, state.suffix
    rows, kv_heads, head_dim, _ = suffix.keys[0].shape
    heads = 4 * kv_heads  # any multiple of the KV heads: the read's cost scales with it alike
    q = jnp.asarray(np.random.default_rng(2).normal(size=(rows, heads, head_dim)), suffix.keys[0].dtype)
    active = jnp.ones(rows, bool)
    layer = (prefix.keys[0], prefix.values[0], suffix.keys[0], suffix.values[0])
    pools, table = PG.paginate(prefix.valid, suffix.valid, page, [layer])
    # the caches, pools and table are arguments, as in the decode (constants would let XLA fold
    # the page table into the gathers)
    contiguous = functools.partial(jax.jit(lambda q, layer, prefix_valid, valid, active: PG.contiguous_read(
        q, *layer[:2], prefix_valid, *layer[2:], valid, active, backend.decode_block)),
        layer=layer, prefix_valid=prefix.valid, valid=suffix.valid, active=active)
    paged = functools.partial(jax.jit(lambda q, pool, table: PG.xla_read(
        q, pool, table, max(backend.decode_block // page, 1))[0]), pool=pools[0], table=table)
    want, got = np.asarray(contiguous(q)), np.asarray(paged(q))
    seconds = []
    for read in (contiguous, paged):
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(20):
                out = read(q)
            out.block_until_ready()
            best = min(best, (time.perf_counter() - start) / 20)
        seconds.append(best)
    return seconds[0], seconds[1], float(np.max(np.abs(got - want)))


def compiled_step(layers: int, target: str, truncation: bool = False):
    """XLA's bytes and FLOPs per decode step and the analytic attention bytes, 8B shapes; the
    sampling's top-p / top-k branch compiled only under `truncation` (the recipes' rollouts
    do not truncate)."""
    import dataclasses

    import jax

    from paravt_jax.infra import sharding as sh
    from paravt_jax.models.qwen3_vl import preset
    from paravt_jax.planner.memory import SamplerPrograms
    from paravt_jax.sampling.sampler import SamplerConfig

    config = preset("8b")
    config = config.replace(text=dataclasses.replace(config.text, num_hidden_layers=layers),
                            dtype="bfloat16", param_dtype="bfloat16")
    if target == "tpu":
        from paravt_jax.planner.targets import tpu_devices

        mesh = sh.make_mesh({"data": 1}, tpu_devices("v5p:2x2x1")[:1])
        programs = SamplerPrograms(config, SamplerConfig(), mesh)
    else:
        mesh = sh.make_mesh({"data": 1}, jax.devices()[:1])
        programs = SamplerPrograms(config, SamplerConfig(), mesh, platform="gpu")
    start = time.perf_counter()
    stats = programs.decode(64, 20480, 8, 16384, 2048, truncation=truncation)
    return stats, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=TOY, help="a checkpoint directory or a model preset")
    parser.add_argument("--block", type=int, default=128, help="model.attention_block (the toy recipe's 128)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=900, help="tokens of the longest prompt")
    parser.add_argument("--new", type=int, default=256, help="tokens per assistant turn")
    parser.add_argument("--turns", type=int, default=3, help="tool rounds after the first turn")
    parser.add_argument("--response", type=int, default=64, help="tokens of the longest tool response")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--page", type=int, default=16, help="slots per page of the paged read")
    parser.add_argument("--compiled", type=int, default=0, help="decoder layers of the 8B-shaped step (0: skip)")
    parser.add_argument("--target", choices=("cpu", "tpu"), default="cpu")
    parser.add_argument("--truncation", action="store_true",
                        help="--compiled: with the sampling's top-p / top-k branch (a rollout that truncates)")
    args = parser.parse_args()

    from paravt_jax.models.qwen3_vl import init_model, load_pretrained, preset
    from paravt_jax.sampling.backend import backend_policy
    from paravt_jax.text.inputs import encode_ids

    print(f"machine: {machine()}")
    if os.path.isdir(args.model):  # a checkpoint: the toy main job's trained model by default
        model = load_pretrained(args.model, attention_block=args.block)
    else:  # a preset, randomly initialised: its near-flat logits may tie, and a tie can flip
        model = init_model(preset(args.model, attention_block=args.block), seed=0)
    rng = np.random.default_rng(1)
    # prompts from a third of the longest to the longest: prefixes of different lengths
    lengths = np.linspace(max(args.prompt // 3, 1), args.prompt, args.prompts).astype(int)
    prompts = [encode_ids(rng.integers(0, 900, n).tolist(), 0) for n in lengths]
    results = rollouts(model, prompts, args)
    base = results["capacity"]
    for window, (_, outs, _) in results.items():
        for turn, (got, want) in enumerate(zip(outs, base[1])):
            if got.tokens != want.tokens:
                row = next(b for b, (x, y) in enumerate(zip(got.tokens, want.tokens)) if x != y)
                step = next((i for i, (x, y) in enumerate(zip(got.tokens[row], want.tokens[row])) if x != y),
                            min(len(got.tokens[row]), len(want.tokens[row])))
                raise SystemExit(f"decode read {window}: greedy tokens differ from the full read at turn {turn}, "
                                 f"row {row}, step {step}: log-probs there {got.logprobs[row][step]:.6f} vs "
                                 f"{want.logprobs[row][step]:.6f}")
            worst = max((float(np.max(np.abs(a - b))) for a, b in zip(got.logprobs, want.logprobs) if len(a)),
                        default=0.0)
            if worst > 1e-4:
                raise SystemExit(f"decode read {window}: log-probs differ by {worst:.2e} at turn {turn}")
    rows = []
    for window, (seconds, outs, state) in results.items():
        tokens = sum(int(o.lengths.sum()) for o in outs)
        read = state.suffix.capacity if window == "capacity" else state.write_index
        rows.append([window, f"{seconds:.3f}", tokens, f"{tokens / seconds:,.0f}",
                     f"{state.prefix.capacity} + {read} of {state.suffix.capacity}",
                     f"{base[0] / seconds:.2f}x"])
    print_table(f"Decode reads: {os.path.basename(args.model)}, {args.prompts} prompts x {args.samples} samples, "
                f"prompts "
                f"{lengths.min()}-{lengths.max()} tokens, {1 + args.turns} turns of {args.new} tokens "
                "(greedy, same tokens and log-probs)",
                ["decode read", "rollout s", "tokens", "tokens/s", "slots read at the last step (prefix + suffix)",
                 "speed-up"], rows)
    state = results["used"][2]
    contiguous, paged, worst = attention_reads(state, backend_policy(), args.page, args.repeats)
    tolerance = 1e-4 if state.suffix.keys[0].dtype == np.float32 else 2e-2
    if worst > tolerance:
        raise SystemExit(f"the paged read differs from the contiguous read by {worst:.2e}")
    print_table(f"One decode step's attention, layer 0 of the used episode's final caches ({state.num_rows} rows, "
                f"prefix {state.prefix.capacity} + suffix {state.suffix.capacity} slots, {state.write_index} "
                f"written; pages of {args.page}; outputs within {worst:.1e})",
                ["read", "ms per call", "paged/contiguous"],
                [["contiguous (prefix + suffix merged)", f"{contiguous * 1e3:.3f}", "1.00x"],
                 ["paged, XLA", f"{paged * 1e3:.3f}", f"{paged / contiguous:.2f}x"]])
    if args.compiled:
        stats, seconds = compiled_step(args.compiled, args.target, args.truncation)
        branch = "with" if args.truncation else "without"
        print_table(f"One decode step, 8B shapes with {args.compiled} layers, {branch} the top-p / top-k branch "
                    f"({stats.compiler}, compiled in "
                    f"{seconds:.0f} s)", ["XLA GB/step", "analytic attention GB/step", "XLA TFLOP", "attention"],
                    [[f"{stats.bytes_accessed / 1e9:.2f}", f"{stats.kernel_text_bytes / 1e9:.2f}",
                      f"{stats.flops / 1e12:.3f}", ", ".join(stats.attention)]])


if __name__ == "__main__":
    main()
