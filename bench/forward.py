"""Forward latency and tokens/s: ours (jit, steady state) vs transformers PyTorch fp32 on the
same weights, same inputs, same run. Compile time is reported separately.

    python bench/forward.py [--presets tiny,small125m] [--batch 1,4] [--length 256]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from common import hf_peer, machine, print_table, timeit  # noqa: E402


def inputs(config, batch: int, length: int, seed: int = 0):
    """Each row: text, one 256x256 image (64 LLM tokens), text; total `length` tokens."""
    rng = np.random.default_rng(seed)
    c = config
    grid = (1, 16, 16)
    n_image = 64
    rows, pixels = [], []
    for _ in range(batch):
        before = rng.integers(0, 256, 8).tolist()
        after = rng.integers(0, 256, length - 8 - n_image - 2).tolist()
        rows.append(before + [c.vision_start_token_id] + [c.image_token_id] * n_image
                    + [c.vision_end_token_id] + after)
        pixels.append(rng.standard_normal((256, 1536)).astype(np.float32))
    ids = np.array(rows)
    return dict(input_ids=ids, attention_mask=np.ones_like(ids),
                mm_token_type_ids=(ids == c.image_token_id).astype(np.int64),
                pixel_values=np.concatenate(pixels), image_grid_thw=np.array([grid] * batch))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--presets", default="tiny,small125m")
    parser.add_argument("--batch", default="1,4")
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    shortest = 8 + 64 + 2 + 1  # text, the image's 64 tokens with its two markers, text
    if args.length < shortest:
        parser.error(f"--length={args.length}: each row holds a 64-token image; give at least {shortest}")

    import jax
    import torch

    from paravt_jax.models.qwen3_vl import init_model, preset

    print(f"machine: {machine()}, torch {torch.__version__} ({torch.get_num_threads()} threads)")
    rows = []
    for name in args.presets.split(","):
        model = init_model(preset(name), seed=0)
        peer = hf_peer(model)
        for batch in (int(b) for b in args.batch.split(",")):
            x = inputs(model.config, batch, args.length)
            ours_first, ours_s = timeit(lambda: jax.block_until_ready(model(**x).logits), args.repeats)
            tx = {k: torch.tensor(v) for k, v in x.items()}

            def run_peer():
                with torch.no_grad():
                    return peer(**tx).logits

            _, peer_s = timeit(run_peer, args.repeats)
            diff = float(np.abs(np.asarray(model(**x).logits) - run_peer().numpy()).max())
            tokens = batch * args.length
            rows.append([name, batch, args.length, f"{ours_s * 1e3:.1f}", f"{tokens / ours_s:,.0f}",
                         f"{peer_s * 1e3:.1f}", f"{tokens / peer_s:,.0f}", f"{peer_s / ours_s:.2f}x",
                         f"{ours_first - ours_s:.2f}", f"{diff:.1e}"])
    print_table("Forward pass (fp32, one 256x256 image per row)",
                ["preset", "batch", "length", "ours ms", "ours tok/s", "HF ms", "HF tok/s",
                 "speed-up", "our compile s", "max |dlogit|"], rows)


if __name__ == "__main__":
    main()
