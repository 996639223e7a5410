"""The rollout's vision pass and prefill on a mesh: one vision pass over every frame of a row
group on every device (`SamplerConfig(vision_shards=False)`, the baseline) against one pass per
shard of rows (each device encodes the frames of the cache rows it holds, the default), on a
mesh of this process's devices.

For the first prompt prefill (one video per prompt) and a tool-response extend (crop frames on
every row): the per-device bytes of the vision and prefill programs from XLA's memory analysis
(temporaries, and arguments; compiled, not run) for both layouts side by side, and the greedy
tokens of a whole generate + extend under each layout (they must be equal).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/rollout_shards.py \
        [--preset tiny] [--mesh data=1,fsdp=8,tensor=1] [--samples 2] [--frames 8] [--crops 4]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine, print_table  # noqa: E402


def tokenizer():
    from paravt_jax.text.tokenizer import train_tokenizer

    return train_tokenizer(["the red circle appears at twelve seconds"] * 20)


def prompts(tok, count: int, frames: int, rng) -> list:
    """`count` prompts, each a video of `frames` 64 x 96 frames and a question."""
    from paravt_jax.text import chat
    from paravt_jax.text.inputs import encode

    out = []
    for _ in range(count):
        video = (rng.random((frames, 64, 96, 3)) * 255).astype(np.uint8)
        times = np.linspace(0.0, frames - 1.0, frames).tolist()
        out.append(encode(chat.render(chat.paravt_messages("where is the circle?", video, times, tools=(),
                                                           visual="video"), add_generation_prompt=True), tok))
    return out


def crop_responses(tok, starts, crops: int, rng) -> list:
    """One tool response per row at its chunk start: `crops` 64 x 64 crop frames as images."""
    from paravt_jax.text import chat
    from paravt_jax.text.inputs import encode

    out = []
    for start in starts:
        frames = (rng.random((crops, 64, 64, 3)) * 255).astype(np.uint8)
        response = chat.frames_as_images(frames, np.arange(crops, dtype=float).tolist())
        messages = chat.tool_response_messages([response])
        out.append(encode(chat.render(messages, add_generation_prompt=True), tok, start_position=int(start)))
    return out


def program_bytes(fn, *args, **kwargs) -> tuple[int, int]:
    """(temporaries, arguments) per device of `fn` compiled for these arguments."""
    mem = fn.lower(*args, **kwargs).compile().memory_analysis()
    return mem.temp_size_in_bytes, mem.argument_size_in_bytes


def group_bytes(sampler, chunks, rows: int, prompts: int, width: int, capacity: int, prefix=None,
                write_index: int = 0) -> dict[str, tuple[int, int]]:
    """Per-device bytes of the vision and prefill programs of the first row group of a prefill of
    `chunks` into `rows` rows, as Sampler.prefill splits and runs it."""
    from paravt_jax.sampling import prefill as prefill_program
    from paravt_jax.sampling import programs
    from paravt_jax.sampling.kv_cache import RowGroup

    shards = sampler.row_shards(rows, prompts)
    group = sampler.prefill_group(rows, rows // prompts, width, shards)
    chunks = list(chunks) + [None] * (rows - len(chunks))
    part = [chunks[r] for r in RowGroup(0, group // shards, shards).order(rows)]
    vision = sampler.vision_inputs(part, group, width, 0, shards)
    out = {"vision": program_bytes(programs.vision, sampler.graphdef, sampler.params, vision.pixel_values,
                                   vision.meta, vision.mesh)}
    chunk = sampler.prefill_chunk(part, group, width, 0, write_index, 0, shards)
    cache = sampler.empty_cache(rows, capacity)
    plan = sampler.prefill_plan(rows, capacity, write_index, width, group, shards)
    out["prefill"] = program_bytes(prefill_program.prefill, sampler.graphdef, sampler.params, sampler.weights,
                                   cache, prefix, chunk, plan=plan)
    return out


def measure(model, mesh, vision_shards: bool, args, tok) -> tuple[dict, list]:
    """({(call, program): bytes}, the greedy tokens of a generate + extend) under one layout."""
    from paravt_jax.sampling import Sampler, SamplerConfig, SamplingParams
    from paravt_jax.sampling.chunks import chunk_width
    from paravt_jax.sampling.kv_cache import turn_capacity

    rng = np.random.default_rng(0)
    sampler = Sampler(model, SamplerConfig(vision_shards=vision_shards), mesh=mesh)
    batch = prompts(tok, args.prompts, args.frames, rng)
    greedy = SamplingParams(max_new_tokens=4)
    out, state = sampler.generate(batch, num_samples=args.samples, sampling=greedy, seed=0)
    responses = crop_responses(tok, state.chunk_start[:state.num_rows], args.crops, rng)
    # the measured extend writes the responses alone (no pending token) into a fresh suffix
    rows, width = state.suffix.valid.shape[0], chunk_width(responses, sampler.config.min_chunk_bucket)
    prompt_width = chunk_width(batch, sampler.config.min_chunk_bucket)
    result = {("prompt", k): v for k, v in group_bytes(sampler, batch, len(batch), len(batch), prompt_width,
                                                       prompt_width).items()}
    capacity = turn_capacity(state.suffix.capacity, width, greedy.max_new_tokens, sampler.config.cache_multiple)
    result.update({("extend", k): v for k, v in group_bytes(sampler, responses, rows, len(batch), width,
                                                            capacity, state.prefix).items()})
    tokens = list(out.tokens)
    out, _ = sampler.extend(state, responses, sampling=greedy, seed=1)
    return result, tokens + list(out.tokens)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--mesh", default="data=1,fsdp=-1,tensor=1", help="axis sizes (-1: the rest)")
    parser.add_argument("--prompts", type=int, default=0, help="prompts (0: one per batch device)")
    parser.add_argument("--samples", type=int, default=2, help="samples per prompt")
    parser.add_argument("--frames", type=int, default=8, help="video frames per prompt")
    parser.add_argument("--crops", type=int, default=4, help="crop frames per row in the tool response")
    args = parser.parse_args(argv)

    import jax

    from paravt_jax.infra import sharding as sh
    from paravt_jax.models.qwen3_vl import init_model, preset

    sizes = {k: int(v) for k, v in (x.split("=") for x in args.mesh.split(","))}
    rest = len(jax.devices()) // max(1, np.prod([s for s in sizes.values() if s > 0]))
    sizes = {k: (rest if v == -1 else v) for k, v in sizes.items()}
    mesh = sh.make_mesh(sizes)
    args.prompts = args.prompts or sh.batch_devices(mesh)
    print(f"machine: {machine()}; {len(jax.devices())} {jax.devices()[0].platform} devices; mesh "
          + " ".join(f"{k}={v}" for k, v in sizes.items()) + f"; {args.prompts} prompts x {args.samples} samples, "
          f"{args.frames} frames per prompt, {args.crops} crops per row")
    model = init_model(preset(args.preset), seed=0, mesh=mesh)
    tok = tokenizer()
    replicated, tokens_r = measure(model, mesh, False, args, tok)
    sharded, tokens_s = measure(model, mesh, True, args, tok)
    rows = []
    for key in replicated:
        (t1, a1), (t2, a2) = replicated[key], sharded[key]
        rows.append([key[0], key[1], f"{t1 / 2**20:,.2f}", f"{t2 / 2**20:,.2f}", f"{a1 / 2**20:,.2f}",
                     f"{a2 / 2**20:,.2f}", f"{(t1 + a1) / max(t2 + a2, 1):.2f}x"])
    print_table(f"The rollout's vision and prefill ({args.preset}): replicated vs per shard of rows "
                "(MiB per device from XLA's memory analysis, one row group)",
                ["call", "program", "temps repl.", "temps shard", "args repl.", "args shard", "repl. / shard"], rows)
    print(f"greedy tokens equal under both layouts: {tokens_r == tokens_s}")


if __name__ == "__main__":
    main()
