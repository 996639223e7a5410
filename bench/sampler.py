"""Sampler throughput: ours (jit, KV cache) vs transformers `generate` on the same weights,
with each figure set against its roofline floor on this machine.

Prefill: prompt 512, one new token. Decode: prompt 16, 128 new tokens (greedy, no stop).
Floor = max(bytes read / measured read bandwidth, FLOPs / measured matmul rate), where the
bytes are the weights a step multiplies (decoder projections and lm head; the embedding
table is only gathered from) plus the cache rows in use, the read bandwidth is a jitted sum
over 256 MB and the matmul rate a jitted 1024^3 fp32 matmul. Each cell reports the best of
--repeats timed runs (after a warm-up) for both sides.

    python bench/sampler.py [--presets tiny,small125m] [--batches 1,8,32]

The last table sets the shared-prefix cache layout against the copied one (every sample its
own copy of the prompt's keys and values) in the same run: cache bytes and decode tokens/s.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from common import best_time, hf_peer, machine, print_table, steady_times  # noqa: E402


def measure_machine():
    """(copy bandwidth (read + write), read bandwidth, fp32 matmul rate) of this machine."""
    import jax
    import jax.numpy as jnp

    a = np.ones(64 * 1024 * 1024 // 4, np.float32)  # 64 MB
    b = np.empty_like(a)
    copy = 2 * a.nbytes / best_time(lambda: np.copyto(b, a))
    big = jnp.ones(256 * 1024 * 1024 // 4, jnp.float32)  # 256 MB: far beyond the caches
    total = jax.jit(jnp.sum)
    read = big.nbytes / best_time(lambda: total(big).block_until_ready())  # noqa: F821 (called before the del)
    del big
    m = jnp.ones((1024, 1024), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    rate = 2 * 1024**3 / best_time(lambda: f(m).block_until_ready(), repeats=10)
    return copy, read, rate


def decode_gemm_rates(m=32, k=768, n=2048, reps=20):
    """FLOP/s of [m, k] x [k, n] fp32 matmuls at batch-32 decode's shape, 20 weights (126 MB,
    streamed from memory as in a decode step) per jitted call so dispatch does not count,
    for jax and torch: the rate that the floor's 1024^3 figure assumes and few-row matmuls
    do not reach on this CPU."""
    import jax
    import jax.numpy as jnp
    import torch

    x, w = np.ones((m, k), np.float32), np.ones((reps, n, k), np.float32)
    jx, jw = jnp.asarray(x), [jnp.asarray(w[i]) for i in range(reps)]  # separate buffers
    f = jax.jit(lambda a, b: [jnp.einsum("mi,oi->mo", a, wi) for wi in b])
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    rates = []
    for fn in (lambda: jax.block_until_ready(f(jx, jw)),
               lambda: [torch.nn.functional.linear(tx, tw[i]) for i in range(reps)]):
        rates.append(2 * m * k * n * reps / best_time(fn))
    return rates


def cache_bytes(state) -> int:
    """Bytes of a SamplerState's live cache buffers: the prompt prefixes and the rows' suffixes."""
    import jax

    return sum(a.nbytes for a in jax.tree.leaves((state.prefix, state.suffix)))


def model_costs(config):
    """(decoder matmul parameters, lm head parameters, layers, KV width)."""
    t = config.text
    d, f, layers = t.hidden_size, t.intermediate_size, t.num_hidden_layers
    qd, kvd = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    per_layer = d * (qd + 2 * kvd) + qd * d + 3 * d * f
    return layers * per_layer, d * t.vocab_size, layers, kvd


def floors(config, batch, prompt, new, bandwidth, rate):
    decoder, head, layers, kvd = model_costs(config)
    weight_bytes = 4 * (decoder + head)
    t = config.text
    qd = t.num_attention_heads * t.head_dim
    # prefill: all prompt tokens through the decoder (causal attention), logits for the last
    flops = 2 * decoder * batch * prompt + 2 * head * batch + 4 * layers * batch * prompt * prompt * qd / 2
    prefill = max(weight_bytes / bandwidth, flops / rate)
    # decode: every step reads all weights plus each row's cache
    total = 0.0
    for step in range(new):
        length = prompt + step
        cache_bytes = 2 * 4 * layers * batch * length * kvd
        flops = 2 * (decoder + head) * batch + 4 * layers * batch * length * qd
        total += max((weight_bytes + cache_bytes) / bandwidth, flops / rate)
    return prefill, total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--presets", default="tiny,small125m")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per cell (best is reported)")
    args = parser.parse_args()

    import jax
    import torch

    from paravt_jax.models.qwen3_vl import init_model, preset
    from paravt_jax.sampling import Sampler, SamplerConfig, SamplingParams
    from paravt_jax.text.inputs import encode_ids

    copy, bandwidth, rate = measure_machine()
    print(f"machine: {machine()}; read bandwidth {bandwidth / 1e9:.1f} GB/s (copy {copy / 1e9:.1f} GB/s "
          f"read+write), jax fp32 matmul {rate / 1e9:.0f} GFLOP/s; torch {torch.__version__} "
          f"({torch.get_num_threads()} threads)")
    ours_32, torch_32 = decode_gemm_rates()
    print(f"fp32 matmul at batch-32 decode's shape [32, 768] x [768, 2048]: jax {ours_32 / 1e9:.0f}, "
          f"torch {torch_32 / 1e9:.0f} GFLOP/s")
    rng = np.random.default_rng(0)
    rows = []
    group_rows = []
    layout_rows = []
    for name in args.presets.split(","):
        model = init_model(preset(name), seed=0)
        peer = hf_peer(model)
        sampler = Sampler(model, SamplerConfig(min_chunk_bucket=16))
        for batch in (int(b) for b in args.batches.split(",")):
            for phase, prompt_len, new in (("prefill", args.prompt, 1), ("decode", 16, args.new)):
                ids = rng.integers(0, 900, (batch, prompt_len))
                prompts = [encode_ids(r.tolist(), 0) for r in ids]
                start = time.perf_counter()
                out, _ = sampler.generate(prompts, sampling=SamplingParams(max_new_tokens=new))
                first = time.perf_counter() - start
                assert all(len(t) == new for t in out.tokens)
                ours = min(steady_times(lambda: sampler.generate(prompts, sampling=SamplingParams(max_new_tokens=new)),
                                          args.repeats))
                tid = torch.tensor(ids)
                with torch.no_grad():
                    peer.generate(input_ids=tid[:, :8], max_new_tokens=2, do_sample=False)  # warm
                    theirs = min(steady_times(lambda: peer.generate(  # noqa: F821 (deleted after the loop)
                        input_ids=tid, attention_mask=torch.ones_like(tid), max_new_tokens=new,
                        min_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0), args.repeats))
                prefill_floor, decode_floor = floors(model.config, batch, prompt_len, new, bandwidth, rate)
                floor = prefill_floor if phase == "prefill" else decode_floor
                tokens = batch * (prompt_len if phase == "prefill" else new)
                rows.append([name, phase, batch, f"{tokens / ours:,.0f}", f"{tokens / theirs:,.0f}",
                             f"{theirs / ours:.2f}x", f"{tokens / floor:,.0f}", f"{ours / floor:.1f}x",
                             f"{theirs / floor:.1f}x",
                             f"{first - ours:.1f}"])
                print(rows[-1], flush=True)
        # G = 8 samples of one prompt: one prefill + cache row copies vs 8 prefills
        ids = rng.integers(0, 900, (1, args.prompt))
        prompt = encode_ids(ids[0].tolist(), 0)
        for _ in range(2):  # the second run is the measured one
            start = time.perf_counter()
            sampler.generate([prompt], num_samples=8, sampling=SamplingParams(max_new_tokens=1))
            shared = time.perf_counter() - start
            start = time.perf_counter()
            sampler.generate([prompt] * 8, num_samples=1, sampling=SamplingParams(max_new_tokens=1))
            separate = time.perf_counter() - start
        group_rows.append([name, args.prompt, f"{shared * 1e3:.0f}", f"{separate * 1e3:.0f}",
                           f"{separate / shared:.2f}x"])
        # the same G = 8 samples decoding args.new tokens with the shared-prefix layout and with
        # the copied layout (every sample its own copy of the prompt's keys and values)
        measured = {}
        for layout, shared_prefix in (("shared", True), ("copied", False)):
            layout_sampler = Sampler(model, SamplerConfig(min_chunk_bucket=16, shared_prefix=shared_prefix))
            call = functools.partial(layout_sampler.generate, [prompt], num_samples=8,
                                     sampling=SamplingParams(max_new_tokens=args.new))
            _, state = call()  # the warm-up compiles; its cache is the one measured
            size = cache_bytes(state)
            del state
            measured[layout] = (size, min(steady_times(call, args.repeats)))
        (shared_bytes, shared_s), (copied_bytes, copied_s) = measured["shared"], measured["copied"]
        layout_rows.append([name, args.prompt, args.new, f"{shared_bytes / 2**20:.1f}", f"{copied_bytes / 2**20:.1f}",
                            f"{copied_bytes / shared_bytes:.2f}x", f"{8 * args.new / shared_s:,.0f}",
                            f"{8 * args.new / copied_s:,.0f}"])
        del peer
        jax.clear_caches()
    print_table(f"Sampler (fp32; prefill = prompt {args.prompt}, 1 new token; decode = prompt 16, "
                f"{args.new} new tokens; tokens/s)",
                ["preset", "phase", "batch", "ours tok/s", "HF tok/s", "ours/HF", "floor tok/s",
                 "ours vs floor", "HF vs floor", "our compile s"], rows)
    print_table("G = 8 samples sharing one prompt (prefill + 1 token)",
                ["preset", "prompt", "shared prefill ms", "8 prefills ms", "speed-up"], group_rows)
    print_table("G = 8 samples of one prompt: KV cache bytes (live buffers after generate) and decode "
                "tokens/s, shared prompt prefix vs one copy of the prompt per sample",
                ["preset", "prompt", "new", "shared MiB", "copied MiB", "copied/shared", "shared tok/s",
                 "copied tok/s"], layout_rows)


if __name__ == "__main__":
    main()
