"""Train-step throughput (forward + backward + AdamW update) for PPO on text sequences.

Tokens/s, compile time (separate), peak memory from XLA's memory analysis of the compiled
gradient step, and MFU = model FLOPs (6 x matmul params x tokens + attention) / time against the
measured fp32 matmul rate of this machine.

    python bench/train_step.py [--presets tiny,small125m] [--lengths 1024,4096] [--batch 1]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine, print_table  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--presets", default="tiny,small125m")
    parser.add_argument("--lengths", default="1024,4096")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--remat", action="store_true")
    args = parser.parse_args()

    import jax

    from sampler import measure_machine, model_costs
    from paravt_jax.models.qwen3_vl import init_model, preset
    from paravt_jax.train.batch import micro_batches, pack
    from paravt_jax.rl.objective import StepConfig, policy_head, policy_loss
    from paravt_jax.train.step import OptimizerConfig, TrainStep
    from paravt_jax.text.inputs import encode_ids

    _, rate = measure_machine()
    print(f"machine: {machine()}; jax fp32 matmul {rate / 1e9:.0f} GFLOP/s")
    rng = np.random.default_rng(0)
    rows = []
    for name in args.presets.split(","):
        for length in (int(x) for x in args.lengths.split(",")):
            model = init_model(preset(name, remat=args.remat), seed=0)
            step = TrainStep(model, OptimizerConfig(learning_rate=1e-5), policy_loss(StepConfig()),
                             policy_head(StepConfig()))
            state = step.init_state()
            seqs = []
            for _ in range(args.batch):
                prompt = encode_ids(rng.integers(0, 900, 64).tolist(), 0, trainable=False)
                seqs.append(prompt.extend(encode_ids(rng.integers(0, 900, length - 64).tolist(), 64, True)))
            packed = pack(seqs, multiple=1024)
            adv = rng.standard_normal(packed.input_ids.shape).astype(np.float32) * packed.loss_mask
            zero = np.zeros(packed.input_ids.shape, np.float32)
            batches = micro_batches(packed, 1, model.config.vision,
                                    {"advantages": adv, "behaviour_logp": zero, "prox_logp": zero})
            tree = batches[0].device_tree()
            start = time.perf_counter()
            compiled = jax.jit(step._grads).lower(state.params, tree).compile()
            mem = compiled.memory_analysis()
            peak = None if mem is None else (mem.temp_size_in_bytes + mem.argument_size_in_bytes
                                             + mem.output_size_in_bytes)
            try:
                state, _ = step.step(state, batches)  # compiles the jitted pieces
            except jax.errors.JaxRuntimeError as e:
                rows.append([name, length, args.batch, "OOM", "-", "-", "n/a" if peak is None else
                             f"{peak / 2**20:,.0f}", str(e).split(":")[0]])
                print(rows[-1], flush=True)
                jax.clear_caches()
                continue
            compile_s = time.perf_counter() - start
            times = []
            for _ in range(3):
                start = time.perf_counter()
                state, metrics = step.step(state, batches)
                times.append(time.perf_counter() - start)
            t = min(times)
            tokens = args.batch * length
            params, _, layers, _ = model_costs(model.config)
            qd = model.config.text.num_attention_heads * model.config.text.head_dim
            flops = 6 * params * tokens + 6 * layers * args.batch * length * length * qd  # fwd+bwd, causal
            rows.append([name, length, args.batch, f"{tokens / t:,.0f}", f"{t:.2f}", f"{compile_s:.1f}",
                         "n/a" if peak is None else f"{peak / 2**20:,.0f}", f"{100 * flops / t / rate:.0f}%"])
            print(rows[-1], flush=True)
            jax.clear_caches()
    print_table("PPO train step (fp32, prox log-prob pass + forward + backward + AdamW)",
                ["preset", "length", "batch", "tokens/s", "step s", "compile s", "grad-step peak MiB", "MFU"],
                rows)


if __name__ == "__main__":
    main()
