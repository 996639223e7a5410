"""Train-step memory and throughput (forward + backward + AdamW update) for PPO on text sequences,
per attention implementation (model.attention).

Memory table: for every preset, length and implementation, the gradient step's peak from XLA's
memory analysis of the compiled program (temporaries + arguments + outputs; compiled, not run),
and its ratio to the peak at the first length: how memory grows with the sequence.
Throughput table: at each --speed-lengths length, the full step timed for each implementation
side by side (tokens/s, step seconds, compile seconds), and MFU = model FLOPs (6 x matmul
params x tokens + causal attention) / time against the measured fp32 matmul rate.

    python bench/train_step.py [--presets tiny,small125m] [--lengths 2048,8192] [--remat]
        [--attention blockwise,dense] [--speed-lengths 1024,2048] [--batch 1] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine, print_table  # noqa: E402


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def build(name: str, length: int, batch: int, attention: str, remat: bool, rng):
    """(TrainStep, state, micro-batches) for `batch` rows of `length` tokens (64 prompt
    tokens, the rest trained)."""
    from paravt_jax.models.qwen3_vl import init_model, preset
    from paravt_jax.rl.objective import StepConfig, policy_head, policy_loss
    from paravt_jax.text.inputs import encode_ids
    from paravt_jax.train.batch import micro_batches, pack
    from paravt_jax.train.step import OptimizerConfig, TrainStep

    model = init_model(preset(name, remat=remat, attention=attention), seed=0)
    step = TrainStep(model, OptimizerConfig(learning_rate=1e-5), policy_loss(StepConfig()),
                     policy_head(StepConfig()))
    seqs = []
    for _ in range(batch):
        prompt = encode_ids(rng.integers(0, 900, 64).tolist(), 0, trainable=False)
        seqs.append(prompt.extend(encode_ids(rng.integers(0, 900, length - 64).tolist(), 64, True)))
    packed = pack(seqs, multiple=min(1024, length))
    adv = rng.standard_normal(packed.input_ids.shape).astype(np.float32) * packed.loss_mask
    zero = np.zeros(packed.input_ids.shape, np.float32)
    batches = micro_batches(packed, 1, model.config.vision,
                            {"advantages": adv, "behaviour_logp": zero, "prox_logp": zero})
    return model, step, batches


def grad_peak(step, state, batches) -> int | None:
    """Bytes of the compiled gradient step (temporaries + arguments + outputs), or None."""
    import jax

    mem = jax.jit(step._grads).lower(state.params, batches[0].device_tree()).compile().memory_analysis()
    if mem is None:
        return None
    return mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes


def mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.0f}"


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--presets", default="tiny,small125m")
    parser.add_argument("--lengths", default="2048,8192", help="memory table lengths (compiled only)")
    parser.add_argument("--speed-lengths", default="1024,2048", help="timed lengths ('' = none)")
    parser.add_argument("--attention", default="blockwise,dense", help="implementations compared")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps after the first (0: time the first)")
    parser.add_argument("--remat", action="store_true")
    args = parser.parse_args(argv)

    import jax

    from sampler import measure_machine, model_costs

    _, _, rate = measure_machine()
    print(f"machine: {machine()}; jax fp32 matmul {rate / 1e9:.0f} GFLOP/s; remat {'on' if args.remat else 'off'}")
    rng = np.random.default_rng(0)
    attentions = args.attention.split(",")
    lengths = ints(args.lengths)

    memory_rows = []
    for name in args.presets.split(","):
        for attention in attentions:
            first = None
            for length in lengths:
                _, step, batches = build(name, length, args.batch, attention, args.remat, rng)
                peak = grad_peak(step, step.init_state(), batches)
                first = first or peak
                ratio = "n/a" if peak is None else f"{peak / first:.2f}x"
                memory_rows.append([name, attention, length, args.batch, mib(peak), ratio])
                print(memory_rows[-1], flush=True)
                jax.clear_caches()

    speed_rows = []
    for name in args.presets.split(","):
        for length in ints(args.speed_lengths):
            row = [name, length, args.batch]
            for attention in attentions:
                model, step, batches = build(name, length, args.batch, attention, args.remat, rng)
                state = step.init_state()
                start = time.perf_counter()
                try:
                    state, _ = step.step(state, batches)  # compiles the jitted pieces
                except jax.errors.JaxRuntimeError as e:
                    row += ["OOM", str(e).split(":")[0], "-"]
                    jax.clear_caches()
                    continue
                compile_s = time.perf_counter() - start
                times = [compile_s]  # --repeats 0: the first step, compile included
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    state, _ = step.step(state, batches)
                    times.append(time.perf_counter() - start)
                t = min(times[1:] or times)
                tokens = args.batch * length
                params, _, layers, _ = model_costs(model.config)
                qd = model.config.text.num_attention_heads * model.config.text.head_dim
                flops = 6 * params * tokens + 6 * layers * args.batch * length * length * qd  # causal
                row += [f"{tokens / t:,.0f}", f"{t:.2f} / {compile_s:.0f}", f"{100 * flops / t / rate:.0f}%"]
                print(row, flush=True)
                jax.clear_caches()
            speed_rows.append(row)

    print_table(f"Gradient step peak (XLA memory analysis, fp32, remat {'on' if args.remat else 'off'})",
                ["preset", "attention", "length", "batch", "grad-step peak MiB", f"vs {lengths[0]}"],
                memory_rows)
    if speed_rows:
        header = ["preset", "length", "batch"]
        for attention in attentions:
            header += [f"{attention} tokens/s", f"{attention} step / compile s", f"{attention} MFU"]
        print_table("PPO train step (fp32, prox log-prob pass + forward + backward + AdamW)", header,
                    speed_rows)


if __name__ == "__main__":
    main()
