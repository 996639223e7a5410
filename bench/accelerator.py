"""Accelerator checks in one command: what a lent GPU / TPU must show, in about 8 minutes.

  1. greedy tokens of the `tiny` model on the accelerator equal to the CPU's (same weights);
  2. prefill and decode tokens/s of an 8B-shaped text model (random bf16 weights, as many
     decoder layers as fit in half the device's memory) against the chip's HBM roofline
     (decode: every step reads the weights and the KV cache once);
  3. train-step tokens/s and MFU at each --lengths with each --attention implementation (a
     kernel the platform has not is listed as such, not substituted);
  4. the peak device memory of each train step against the planner's number for the same
     program (XLA's memory_analysis of the compiled gradient step: temporaries + arguments +
     outputs, what `paravt-jax plan` reads).

Prints one table per check and writes them all as JSON to --out (default $OUT, else
./accelerator): accelerator.json.

    python bench/accelerator.py                       # on the accelerator host
    python bench/accelerator.py --smallest --out /tmp/a   # CPU: tiny widths, seconds

Works on jax 0.10 and 0.11 (stable APIs only: jit, lower/compile, memory_analysis, memory_stats).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine, print_table  # noqa: E402

# device_kind substrings -> time_plan.CHIPS keys
CHIP_KINDS = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"), ("v5 lite", "v5e"), ("v5e", "v5e"),
              ("v5p", "v5p"), ("TPU v5", "v5p"), ("v6", "v6e"), ("TPU v4", "v4"))


def chip_of(device):
    from paravt_jax.planner.time_plan import CHIPS

    kind = getattr(device, "device_kind", "")
    for needle, name in CHIP_KINDS:
        if needle.lower() in kind.lower():
            return CHIPS[name]
    return None


def memory_limit(device) -> int | None:
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    return int(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else None


def peak_in_use(device) -> int | None:
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


def greedy_parity(new_tokens: int) -> dict:
    """The tiny model's greedy tokens on the default device and on the CPU (same seed, same weights)."""
    import jax

    from paravt_jax.models.qwen3_vl import init_model, preset
    from paravt_jax.sampling import SamplingParams, generate

    prompts = [[5, 17, 42, 99, 7, 300], [11, 12, 13]]
    here = generate(init_model(preset("tiny"), seed=0), prompts, SamplingParams(max_new_tokens=new_tokens)).tokens
    with jax.default_device(jax.devices("cpu")[0]):
        cpu = generate(init_model(preset("tiny"), seed=0), prompts, SamplingParams(max_new_tokens=new_tokens)).tokens
    same = [list(a) == list(b) for a, b in zip(here, cpu)]
    return dict(device=jax.devices()[0].platform, rows=len(prompts), new_tokens=new_tokens, equal=all(same),
                tokens_device=[list(map(int, t)) for t in here], tokens_cpu=[list(map(int, t)) for t in cpu])


def text_config(name: str, layers: int, attention: str = "auto"):
    from paravt_jax.models.qwen3_vl import preset

    config = preset(name, param_dtype="bfloat16", dtype="bfloat16", remat=True, attention=attention)
    return config.replace(text=dataclasses.replace(config.text, num_hidden_layers=layers)).validate()


def parameter_bytes(config) -> int:
    from flax import nnx

    from paravt_jax.models.qwen3_vl.hf_io import abstract_model

    _, params, _ = nnx.split(abstract_model(config), nnx.Param, ...)
    return sum(int(np.prod(v.get_value().shape)) * v.get_value().dtype.itemsize for _, v in nnx.to_flat_state(params))


def fitting_layers(name: str, device, requested: int) -> int:
    """`requested`, or (0) as many layers as keep the weights within half the device memory; at
    least the DeepStack layers (the vision features enter the first ones)."""
    from paravt_jax.models.qwen3_vl import preset

    full = preset(name)
    least = len(full.vision.deepstack_visual_indexes)
    if requested:
        return max(requested, least)
    limit = memory_limit(device)
    if limit is None:
        return least
    low, high = parameter_bytes(text_config(name, least)), parameter_bytes(text_config(name, least + 1))
    per_layer = high - low
    return max(least, min(full.text.num_hidden_layers, least + int((limit / 2 - low) // per_layer)))


def sampler_speed(config, rows: int, prompt: int, steps: int, chip) -> dict:
    """Prefill and decode tokens/s of the Sampler (greedy, no stop) against the HBM roofline."""
    from paravt_jax.models.qwen3_vl import init_model
    from paravt_jax.sampling import Sampler, SamplingParams
    from paravt_jax.text.inputs import encode_ids

    model = init_model(config, seed=0)
    sampler = Sampler(model)
    rng = np.random.default_rng(0)
    prompts = [encode_ids(rng.integers(0, 1000, prompt).tolist(), 0, trainable=False) for _ in range(rows)]

    def run(new):
        start = time.perf_counter()
        out, _ = sampler.generate(prompts, sampling=SamplingParams(max_new_tokens=new))
        np.asarray(out.lengths)
        return time.perf_counter() - start

    run(1), run(steps)  # compile both
    prefill = min(run(1) for _ in range(2))
    total = min(run(steps) for _ in range(2))
    decode = max(total - prefill, 1e-9)
    t = config.text
    weights = parameter_bytes(config)
    cache = 2 * t.num_hidden_layers * rows * (prompt + steps) * t.num_key_value_heads * t.head_dim * 2
    roofline = rows / ((weights + cache) / chip.hbm_bytes_per_s) if chip else None
    measured = rows * (steps - 1) / decode
    return dict(layers=t.num_hidden_layers, rows=rows, prompt=prompt, steps=steps, weight_bytes=weights,
                prefill_tokens_per_s=rows * prompt / prefill, decode_tokens_per_s=measured,
                decode_roofline_tokens_per_s=roofline,
                decode_fraction_of_roofline=(measured / roofline) if roofline else None)


def train_speed(config, length: int, chip, device, repeats: int) -> dict:
    """One train step (gradients + AdamW) on one row of `length` tokens: tokens/s, MFU, the peak
    memory in use against the compiled gradient program's memory analysis."""

    from paravt_jax.models.qwen3_vl import init_model
    from paravt_jax.rl.objective import StepConfig, policy_head, policy_loss
    from paravt_jax.text.inputs import encode_ids
    from paravt_jax.train.batch import micro_batches, pack
    from paravt_jax.train.step import OptimizerConfig, TrainStep

    rng = np.random.default_rng(0)
    model = init_model(config, seed=0)
    step = TrainStep(model, OptimizerConfig(learning_rate=1e-6), policy_loss(StepConfig()), policy_head(StepConfig()))
    row = encode_ids(rng.integers(0, 1000, 64).tolist(), 0, trainable=False).extend(
        encode_ids(rng.integers(0, 1000, length - 64).tolist(), 64, True))
    packed = pack([row], multiple=min(1024, length))
    extras = {"advantages": rng.standard_normal(packed.input_ids.shape).astype(np.float32) * packed.loss_mask,
              "behaviour_logp": np.zeros(packed.input_ids.shape, np.float32),
              "prox_logp": np.zeros(packed.input_ids.shape, np.float32)}
    batches = micro_batches(packed, 1, config.vision, extras)
    state = step.init_state()
    analysis = step._grads.lower(state.params, batches[0].device_tree()).compile().memory_analysis()
    planned = (analysis.temp_size_in_bytes + analysis.argument_size_in_bytes + analysis.output_size_in_bytes
               if analysis is not None else None)
    start = time.perf_counter()
    state, _ = step.step(state, batches)
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        state, _ = step.step(state, batches)
        times.append(time.perf_counter() - start)
    seconds = min(times or [first])
    t = config.text
    matmul = parameter_bytes(config) / 2 - t.vocab_size * t.hidden_size  # bf16 weights, less the embedding
    attention = 6 * t.num_hidden_layers * length * length * t.num_attention_heads * t.head_dim  # causal fwd+bwd
    flops = 6 * matmul * length + attention
    return dict(length=length, attention=config.attention, seconds=seconds, first_seconds=first,
                tokens_per_s=length / seconds, mfu=(flops / seconds / chip.flops) if chip else None,
                peak_bytes_in_use=peak_in_use(device), planned_gradient_bytes=planned)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "accelerator"), help="directory of accelerator.json")
    parser.add_argument("--preset", default="8b", help="model preset whose widths the speed checks use")
    parser.add_argument("--layers", type=int, default=0, help="decoder layers (0: as many as fit)")
    parser.add_argument("--lengths", default="4096,16384", help="train-step lengths")
    parser.add_argument("--attention", default="dense,blockwise,cudnn")
    parser.add_argument("--rows", type=int, default=8, help="sampler rows")
    parser.add_argument("--prompt", type=int, default=4096, help="prefill tokens per row")
    parser.add_argument("--steps", type=int, default=128, help="decode steps")
    parser.add_argument("--new-tokens", type=int, default=16, help="greedy parity tokens")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--smallest", action="store_true",
                        help="CPU test: tiny widths, 2 layers, 128 tokens, 2 rows x 32 + 4 steps")
    args = parser.parse_args(argv)
    if args.smallest:
        args.preset, args.layers, args.lengths, args.rows, args.prompt, args.steps = "tiny", 2, "128", 2, 32, 4
        args.new_tokens, args.repeats = 4, 1

    import jax

    from paravt_jax.models.qwen3_vl.fused_attention import KERNEL_PLATFORMS

    device = jax.devices()[0]
    chip = chip_of(device)
    print(f"machine: {machine()}; device {getattr(device, 'device_kind', device.platform)}; "
          f"peaks: {'n/a (no chip table entry)' if chip is None else chip}", flush=True)
    results: dict = dict(machine=machine(), jax=jax.__version__, device_kind=getattr(device, "device_kind", ""),
                         chip=dataclasses.asdict(chip) if chip else None)

    parity = greedy_parity(args.new_tokens)
    results["greedy_parity"] = parity
    print_table("Greedy tokens of tiny: this device vs CPU", ["device", "rows", "new tokens", "equal"],
                [[parity["device"], parity["rows"], parity["new_tokens"], parity["equal"]]])

    layers = fitting_layers(args.preset, device, args.layers)
    speed = sampler_speed(text_config(args.preset, layers), args.rows, args.prompt, args.steps, chip)
    results["sampler"] = speed
    fmt = lambda x, spec=",.0f": "n/a" if x is None else format(x, spec)
    print_table(f"Sampler, {args.preset} widths x {layers} layers (random bf16 weights)",
                ["rows", "prompt", "steps", "prefill tok/s", "decode tok/s", "HBM roofline tok/s", "of roofline"],
                [[args.rows, args.prompt, args.steps, fmt(speed["prefill_tokens_per_s"]),
                  fmt(speed["decode_tokens_per_s"]), fmt(speed["decode_roofline_tokens_per_s"]),
                  fmt(speed["decode_fraction_of_roofline"], ".1%")]])

    rows, train = [], []
    for length in [int(x) for x in args.lengths.split(",") if x]:
        for attention in args.attention.split(","):
            needs = KERNEL_PLATFORMS.get(attention)
            if needs and needs != device.platform:
                train.append(dict(length=length, attention=attention, skipped=f"{attention} runs on {needs} only"))
                rows.append([length, attention, "-", "-", "-", "-", f"n/a: {needs} only"])
                continue
            try:
                r = train_speed(text_config(args.preset, layers, attention), length, chip, device, args.repeats)
            except jax.errors.JaxRuntimeError as e:  # out of memory: recorded, the next case runs
                train.append(dict(length=length, attention=attention, error=str(e).split("\n")[0][:200]))
                rows.append([length, attention, "-", "-", "-", "-", "error (OOM?)"])
                jax.clear_caches()
                continue
            train.append(r)
            rows.append([length, attention, fmt(r["tokens_per_s"]), fmt(r["mfu"], ".1%"),
                         fmt(r["peak_bytes_in_use"] and r["peak_bytes_in_use"] / 2**30, ".2f"),
                         fmt(r["planned_gradient_bytes"] and r["planned_gradient_bytes"] / 2**30, ".2f"), "ok"])
            jax.clear_caches()
    results["train"] = train
    print_table(f"Train step, {args.preset} widths x {layers} layers, 1 row (peak: device peak so far, GiB; "
                "planned: the gradient program's memory analysis, GiB)",
                ["length", "attention", "tokens/s", "MFU", "peak GiB", "planned GiB", "status"], rows)

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "accelerator.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(f"written {path}")
    if not parity["equal"]:
        print("greedy tokens differ from the CPU's", file=sys.stderr)
        raise SystemExit(1)
    return results


if __name__ == "__main__":
    main()
