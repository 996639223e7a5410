"""The train step's vision pass: one replicated pass over every frame of a micro-batch (the
baseline) against a pass per shard of rows (each batch device encodes its own rows' frames,
train/batch.py `shard_vision`), on a mesh of this process's devices.

For each frames-per-row count: the gradient program's per-device memory from XLA's memory
analysis (temporaries, and arguments + outputs + temporaries; compiled, not run) and the
policy-gradient step timed (gradients of one micro-batch of one row per batch device, after a
compiling first call), for both layouts side by side, and their ratio.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/vision_shards.py \
        [--preset tiny] [--mesh data=1,fsdp=8,tensor=1] [--frames 8,32] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine, print_table  # noqa: E402


def sequences(rows: int, frames: int, rng) -> list:
    """`rows` episodes, each a prompt of `frames` 64 x 96 frames and 32 trained tokens."""
    from paravt_jax.text import chat
    from paravt_jax.text.inputs import encode, encode_ids
    from paravt_jax.text.tokenizer import train_tokenizer

    tok = train_tokenizer(["the red circle appears at twelve seconds"] * 20)
    out = []
    for _ in range(rows):
        video = (rng.random((frames, 64, 96, 3)) * 255).astype(np.uint8)
        times = np.linspace(0.0, frames - 1.0, frames).tolist()
        prompt = encode(chat.render(chat.paravt_messages("where is the circle?", video, times, tools=()),
                                    add_generation_prompt=True), tok)
        out.append(prompt.extend(encode_ids(rng.integers(0, 900, 32).tolist(), prompt.next_position, True)))
    return out


def measure(step, state, batch, repeats: int) -> tuple[int, int, float, float]:
    """(temporaries, total bytes per device, best step seconds, compile seconds) of the gradients."""
    import jax

    placed = step._place(batch)
    start = time.perf_counter()
    compiled = step._grads.lower(state.params, placed).compile()
    compile_s = time.perf_counter() - start
    mem = compiled.memory_analysis()
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        jax.block_until_ready(step._grads(state.params, placed))
        times.append(time.perf_counter() - start)
    total = mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes
    return mem.temp_size_in_bytes, total, min(times[1:] or times), compile_s


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--mesh", default="data=1,fsdp=-1,tensor=1", help="axis sizes (-1: the rest)")
    parser.add_argument("--frames", default="8,32", help="frames per row")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls after the first")
    args = parser.parse_args(argv)

    import jax

    from paravt_jax.infra import sharding as sh
    from paravt_jax.models.qwen3_vl import init_model, preset
    from paravt_jax.rl.objective import StepConfig, policy_head, policy_loss
    from paravt_jax.train.batch import micro_batches, pack
    from paravt_jax.train.step import OptimizerConfig, TrainStep

    sizes = {k: int(v) for k, v in (x.split("=") for x in args.mesh.split(","))}
    rest = len(jax.devices()) // max(1, np.prod([s for s in sizes.values() if s > 0]))
    sizes = {k: (rest if v == -1 else v) for k, v in sizes.items()}
    mesh = sh.make_mesh(sizes)
    shards = sh.batch_devices(mesh)
    print(f"machine: {machine()}; {len(jax.devices())} {jax.devices()[0].platform} devices; mesh "
          + " ".join(f"{k}={v}" for k, v in sizes.items()) + f" ({shards} batch devices, one row each)")
    model = init_model(preset(args.preset), seed=0, mesh=mesh)
    step = TrainStep(model, OptimizerConfig(learning_rate=1e-5), policy_loss(StepConfig()), policy_head(StepConfig()),
                     mesh=mesh)
    state = step.init_state()
    rng = np.random.default_rng(0)
    rows = []
    for frames in [int(x) for x in args.frames.split(",") if x]:
        packed = pack(sequences(shards, frames, rng))
        zero = np.zeros(packed.input_ids.shape, np.float32)
        adv = rng.standard_normal(packed.input_ids.shape).astype(np.float32) * packed.loss_mask
        extras = {"advantages": adv, "behaviour_logp": zero, "prox_logp": zero}
        results = {}
        for name, count in (("replicated", 1), ("per shard", shards)):
            batch = micro_batches(packed, 1, model.config.vision, extras, vision_shards=count)[0]
            results[name] = measure(step, state, batch, args.repeats)
            print(frames, name, results[name], flush=True)
        (t1, m1, s1, c1), (t2, m2, s2, c2) = results["replicated"], results["per shard"]
        rows.append([frames, packed.input_ids.shape[1], f"{t1 / 2**20:,.1f}", f"{t2 / 2**20:,.1f}",
                     f"{m1 / 2**20:,.1f}", f"{m2 / 2**20:,.1f}", f"{s1:.3f} / {c1:.1f}", f"{s2:.3f} / {c2:.1f}",
                     f"{s1 / s2:.2f}x"])
        jax.clear_caches()
    print_table(f"Gradients of one micro-batch ({args.preset}, {shards} rows): vision replicated vs per shard "
                "(MiB per device from XLA's memory analysis; seconds measured)",
                ["frames/row", "tokens/row", "temps repl.", "temps shard", "total repl.", "total shard",
                 "repl. step / compile s", "shard step / compile s", "speed-up"], rows)


if __name__ == "__main__":
    main()
