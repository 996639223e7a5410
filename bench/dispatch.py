"""Parallel vs sequential tool turns on a synthetic 10-minute video with the tiny model.

K crops answered in ONE turn (one dispatcher run, one batched sub-agent call, one cache
extension, one policy turn) vs the same K crops over K turns (LongVT-style), measuring wall
time and the context length (tokens) each path ends with. The policy's own turns are real
sampler calls with a fixed budget of tokens (a random tiny model does not write tool calls by
itself, so the call texts are scripted; everything else is the real pipeline).

    python bench/dispatch.py [--minutes 10] [--max-k 5]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine, print_table  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--max-k", type=int, default=5)
    parser.add_argument("--turn-tokens", type=int, default=48, help="policy tokens per turn")
    args = parser.parse_args()

    from paravt_jax.agent.dispatch import CropDispatcher, CropTask, DispatchConfig
    from paravt_jax.agent.responses import subagent_responses
    from paravt_jax.agent.rollout import RolloutConfig, sampling_params
    from paravt_jax.agent.tools import ToolCall
    from paravt_jax.data.builtin import ensure_builtin
    from paravt_jax.data.synthetic import make_video, write_video
    from paravt_jax.models.qwen3_vl import load_pretrained
    from paravt_jax.sampling import Sampler, SamplerConfig, SamplingParams
    from paravt_jax.text import chat
    from paravt_jax.text.inputs import encode
    from paravt_jax.text.tokenizer import Tokenizer
    from paravt_jax.video import read_frames

    print(f"machine: {machine()}")
    assets = ensure_builtin()
    tok = Tokenizer.from_directory(assets.model_dir)
    model = load_pretrained(assets.model_dir)
    sampler = Sampler(model, SamplerConfig(min_chunk_bucket=64, min_batch_bucket=1))
    config = RolloutConfig(mode="subagent", subagent_max_tokens=32, temperature=0.0)
    with tempfile.TemporaryDirectory() as tmp:
        video = make_video(11, args.minutes * 60)
        path = write_video(os.path.join(tmp, "long.mp4"), video.duration, list(video.events), fps=4.0,
                           height=360, width=640, seed=11)
        clip = read_frames(path, nframes=16)
        prompt = encode(chat.render(chat.paravt_messages("When does the red circle appear?", clip.frames,
                                                         clip.timestamps), add_generation_prompt=True,
                                    assistant_prefix="<think>\n"), tok)
        windows = [(60.0 * i + 5, 60.0 * i + 20) for i in range(args.max_k)]
        sampling = SamplingParams(max_new_tokens=args.turn_tokens)

        def tool_turn(state, calls, dispatcher, seed):
            tasks = [CropTask(0, k, path, video.duration, ToolCall("crop_video", {"start_time": s, "end_time": e}))
                     for k, (s, e) in enumerate(calls)]
            results = dispatcher.run(tasks)
            texts, _ = subagent_responses(results, sampler, tok,
                                          sampling_params(config, tok, config.subagent_max_tokens),
                                          config.subagent_shape, seed)
            segments = [chat.Text("<|im_end|>\n")] + chat.render(chat.tool_response_messages(texts),
                                                                 add_generation_prompt=True,
                                                                 assistant_prefix="<think>\n")
            chunk = encode(segments, tok, start_position=int(state.chunk_start[0]))
            _, state = sampler.extend(state, [chunk], seed=seed, sampling=sampling)
            return state

        def parallel(k, dispatcher):
            _, state = sampler.generate([prompt], sampling=sampling)
            state = tool_turn(state, windows[:k], dispatcher, 1)
            return state

        def sequential(k, dispatcher):
            _, state = sampler.generate([prompt], sampling=sampling)
            for i in range(k):
                state = tool_turn(state, windows[i:i + 1], dispatcher, 1 + i)
            return state

        rows = []
        with CropDispatcher(DispatchConfig(max_workers=5, max_parallel=5)) as dispatcher:
            for k in range(1, args.max_k + 1):
                for fn in (parallel, sequential):  # warm-up compiles
                    fn(k, dispatcher)
                start = time.perf_counter()
                par_state = parallel(k, dispatcher)
                par = time.perf_counter() - start
                start = time.perf_counter()
                seq_state = sequential(k, dispatcher)
                seq = time.perf_counter() - start
                par_tokens = int(par_state.cached_tokens()[0]) + 1
                seq_tokens = int(seq_state.cached_tokens()[0]) + 1
                rows.append([k, f"{par:.2f}", f"{seq:.2f}", f"{seq / par:.2f}x", par_tokens, seq_tokens,
                             f"{seq_tokens / par_tokens:.2f}x"])
                print(rows[-1], flush=True)
    print_table(f"K crops: one parallel turn vs K sequential turns ({args.minutes:.0f}-min video, tiny model, "
                f"{args.turn_tokens} policy tokens per turn, sub-agent summaries of <= 32 tokens)",
                ["K", "parallel s", "sequential s", "time ratio", "parallel context tokens",
                 "sequential context tokens", "context ratio"], rows)


if __name__ == "__main__":
    main()
