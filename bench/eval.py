"""Evaluation throughput: samples per minute on the synthetic benchmark with the tiny model,
batched (many samples per sampler call) vs one sample at a time, through the real driver
(video decode, prompt, greedy sampler, scoring, result files).

Each configuration runs once to compile (its bucket shapes) and is then timed on a fresh
output directory, so the table shows steady throughput; compile time is reported apart.

    python bench/eval.py [--samples 16] [--batch 8] [--max-new-tokens 64] [--question-type mcq]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine, print_table  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--nframes", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompt-mode", default="agentic_general")
    parser.add_argument("--question-type", default="mcq", choices=("mcq", "tvg", "oe"))
    args = parser.parse_args()

    from paravt_jax.agent.protocol import PromptFormat
    from paravt_jax.data.builtin import ensure_builtin
    from paravt_jax.eval import datasets, driver
    from paravt_jax.models.qwen3_vl import load_pretrained
    from paravt_jax.sampling import Sampler, SamplerConfig
    from paravt_jax.text.tokenizer import Tokenizer

    assets = ensure_builtin(os.path.join("artifacts", "bench_eval"), num_train=2, num_eval=3 * args.samples)
    model = load_pretrained(assets.model_dir)
    tokenizer = Tokenizer.from_directory(assets.model_dir)
    benchmark = datasets.load_benchmark("synthetic", os.path.join(assets.data_dir, "rl_eval.parquet"),
                                        assets.data_dir)
    # One question type, like every real benchmark (the driver batches per type, so a mixed
    # set would pad partial batches).
    samples = [s for s in benchmark.samples if s.question_type == args.question_type][:args.samples]
    benchmark = dataclasses.replace(benchmark, samples=tuple(samples))
    print(f"machine: {machine()}; {len(benchmark.samples)} synthetic {args.question_type} samples, K={args.nframes}, "
          f"{args.max_new_tokens} new tokens per turn, prompt mode {args.prompt_mode}", flush=True)
    rows, speeds = [], {}
    for batch in (1, args.batch):
        prompt = dataclasses.replace(PromptFormat.reference_eval(), overview_max_pixels=96 * 160)
        config = driver.DriverConfig(prompt_mode=args.prompt_mode, nframes=args.nframes, max_turns=3,
                                     max_new_tokens=args.max_new_tokens, batch_size=batch,
                                     crop_max_pixels=96 * 160, prompt=prompt)
        sampler = Sampler(model, SamplerConfig(min_chunk_bucket=64))
        with tempfile.TemporaryDirectory() as warm, tempfile.TemporaryDirectory() as timed:
            start = time.perf_counter()
            driver.run_dataset(sampler, tokenizer, benchmark, config, warm, log=lambda _: None)
            first = time.perf_counter() - start
            start = time.perf_counter()
            summary = driver.run_dataset(sampler, tokenizer, benchmark, config, timed, log=lambda _: None)
            seconds = time.perf_counter() - start
        speeds[batch] = 60.0 * len(benchmark.samples) / seconds
        rows.append([batch, f"{speeds[batch]:.1f}", f"{seconds:.1f}", f"{max(first - seconds, 0.0):.1f}",
                     f"{summary['avg_context_tokens']:.0f}", f"{summary['avg_turns']:.2f}",
                     f"{summary['avg_tool_calls']:.2f}"])
    print_table("eval driver: samples per minute (tiny model, synthetic benchmark)",
                ["batch", "samples/min", "wall s", "compile s (approx)", "context tokens", "turns",
                 "tool calls"], rows)
    print(f"\nbatched / one at a time: {speeds[args.batch] / speeds[1]:.2f}x")


if __name__ == "__main__":
    main()
