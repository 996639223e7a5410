"""`paravt-jax <command> --config=FILE[:ARG] [--config.field=value ...]`.

Commands: forward (the main job until the trainer lands: load the model, build a synthetic
video prompt, run and time a forward pass).
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "configs", "base.py")


def build_model(config):
    from paravt_jax import sharding as sh
    from paravt_jax.models.qwen3_vl import init_model, load_pretrained, preset

    m = config.model
    knobs = dict(param_dtype=m.param_dtype, dtype=m.dtype, remat=m.remat, scan_layers=m.scan_layers)
    mesh = sh.make_mesh(dict(config.mesh))
    if m.checkpoint:
        return load_pretrained(m.checkpoint, dtype=m.param_dtype, compute_dtype=m.dtype, mesh=mesh,
                               remat=m.remat, scan_layers=m.scan_layers)
    return init_model(preset(m.preset, **knobs), seed=config.seed, mesh=mesh)


def demo_video_prompt(model_config, demo):
    """A user turn with a synthetic video: per temporal group `<t seconds>` + pads.

    Text is byte-encoded (ids 0-255); special ids come from the model config.
    """
    from paravt_jax.data.synthetic import Event, render_frames
    from paravt_jax.video.frames import llm_tokens, pad_to_temporal, patchify

    times = np.arange(demo.frames) / demo.fps
    events = [Event(start=times[len(times) // 3], end=times[2 * len(times) // 3], color="red",
                    shape="circle")]
    frames = pad_to_temporal(render_frames(times, events, demo.height, demo.width, seed=0))
    pixel_values, grid = patchify(frames)
    c = model_config
    text = lambda s: list(s.encode())
    ids = text("user\n") + [c.vision_start_token_id]
    per_group = llm_tokens((1, grid[1], grid[2]))
    for g in range(int(grid[0])):
        stamp = (times[min(2 * g, len(times) - 1)] + times[min(2 * g + 1, len(times) - 1)]) / 2
        ids += text(f"<{stamp:.1f} seconds>") + [c.vision_start_token_id]
        ids += [c.video_token_id] * per_group + [c.vision_end_token_id]
    ids += [c.vision_end_token_id] + text("When does the red circle appear?")
    return np.array([ids]), pixel_values, grid[None]


def forward_command(config) -> dict:
    import jax

    t0 = time.perf_counter()
    model = build_model(config)
    load_s = time.perf_counter() - t0
    ids, pixel_values, grid = demo_video_prompt(model.config, config.demo)
    times = []
    for _ in range(max(2, config.demo.repeats)):
        start = time.perf_counter()
        out = model(input_ids=ids, pixel_values_videos=pixel_values, video_grid_thw=grid)
        jax.block_until_ready(out.logits)
        times.append(time.perf_counter() - start)
    summary = {
        "devices": f"{jax.device_count()} x {jax.devices()[0].platform}",
        "model": config.model.checkpoint or f"preset {config.model.preset} (random init)",
        "input_ids": tuple(ids.shape), "pixel_values_videos": tuple(pixel_values.shape),
        "video_grid_thw": grid.tolist(), "logits": tuple(out.logits.shape),
        "logits_finite": bool(np.isfinite(np.asarray(out.logits)).all()),
        "next_token": int(np.asarray(out.logits)[0, -1].argmax()),
        "model_build_s": round(load_s, 3), "first_call_s (compile)": round(times[0], 3),
        "steady_call_ms (median)": round(1e3 * float(np.median(times[1:])), 2),
        "tokens_per_s": round(ids.size / float(np.median(times[1:])), 1),
    }
    width = max(len(k) for k in summary)
    print("paravt-jax forward pass on the built-in synthetic video prompt")
    for key, value in summary.items():
        print(f"  {key:<{width}}  {value}")
    if not summary["logits_finite"]:
        raise SystemExit("forward produced non-finite logits")
    return summary


COMMANDS = {"forward": forward_command}


def main(argv: list[str] | None = None) -> None:
    from absl import flags
    from ml_collections import config_flags

    argv = list(sys.argv if argv is None else argv)
    command = "forward"
    if len(argv) > 1 and not argv[1].startswith("-"):
        command = argv.pop(1)
    if command not in COMMANDS:
        raise SystemExit(f"unknown command {command!r}; choose from {sorted(COMMANDS)}")
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", DEFAULT_CONFIG + ":tiny", "config file[:arg]",
                                    flag_values=flag_values)
    flag_values(argv)
    COMMANDS[command](flag_values.config)


if __name__ == "__main__":
    main()
