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


def build_model(config, default_dir: str | None = None):
    """The configured checkpoint, else the built-in tiny checkpoint directory."""
    from paravt_jax import sharding as sh
    from paravt_jax.models.qwen3_vl import init_model, load_pretrained, preset

    m = config.model
    mesh = sh.make_mesh(dict(config.mesh))
    # The built-in checkpoint stands in for `tiny`; other presets without a checkpoint are
    # randomly initialised (benchmarks, memory checks).
    directory = m.checkpoint or (default_dir if m.preset == "tiny" else None)
    if directory:
        return load_pretrained(directory, dtype=m.param_dtype, compute_dtype=m.dtype, mesh=mesh,
                               remat=m.remat, scan_layers=m.scan_layers)
    knobs = dict(param_dtype=m.param_dtype, dtype=m.dtype, remat=m.remat, scan_layers=m.scan_layers)
    return init_model(preset(m.preset, **knobs), seed=config.seed, mesh=mesh)


def builtin_assets(config):
    from paravt_jax.data.builtin import ensure_builtin

    d = config.data
    return ensure_builtin(d.builtin_root, seed=config.seed, num_train=d.num_train,
                          num_eval=d.num_eval, durations=tuple(d.durations))


def first_prompt(config, tokenizer, data_dir: str):
    """The ParaVT prompt for the first held-out synthetic question: K overview frames as
    images, each after its `<t seconds>` text, the question, and the `<think>` prefix."""
    import json
    import os

    import pyarrow.parquet as pq

    from paravt_jax.text import chat
    from paravt_jax.text.inputs import encode
    from paravt_jax.video import read_frames

    row = pq.read_table(os.path.join(data_dir, "rl_eval.parquet")).to_pylist()[0]
    video = os.path.join(data_dir, row["videos"][0]["video"])
    question = row["prompt"][0]["content"].replace("<video>", "").strip()
    d = config.demo
    clip = read_frames(video, nframes=d.frames, min_pixels=d.min_pixels, max_pixels=d.max_pixels)
    messages = chat.paravt_messages(question, clip.frames, clip.timestamps,
                                    video_name=os.path.basename(video))
    segments = chat.render(messages, add_generation_prompt=True, assistant_prefix="<think>\n")
    return encode(segments, tokenizer), json.loads(row["extra_info"]), video


def forward_command(config) -> dict:
    import jax

    from paravt_jax.text.inputs import check_against_model
    from paravt_jax.text.tokenizer import Tokenizer

    t0 = time.perf_counter()
    assets = builtin_assets(config)
    setup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = build_model(config, default_dir=assets.model_dir)
    load_s = time.perf_counter() - t0
    tokenizer = Tokenizer.from_directory(config.model.checkpoint or assets.model_dir)
    check_against_model(tokenizer, model.config)
    inputs, info, video = first_prompt(config, tokenizer, assets.data_dir)
    kwargs = inputs.model_kwargs()
    times = []
    for _ in range(max(2, config.demo.repeats)):
        start = time.perf_counter()
        out = model(**kwargs)
        jax.block_until_ready(out.logits)
        times.append(time.perf_counter() - start)
    logits = np.asarray(out.logits)
    summary = {
        "devices": f"{jax.device_count()} x {jax.devices()[0].platform}",
        "model": config.model.checkpoint or f"built-in tiny ({assets.model_dir})",
        "video": f"{video} ({config.demo.frames} overview frames)",
        "question type / answer": f"{info['question_type']} / {info['answer']}",
        "input_ids": tuple(kwargs["input_ids"].shape),
        "image tokens": int((inputs.mm_token_type_ids == 1).sum()),
        "pixel_values": tuple(inputs.pixel_values.shape),
        "image_grid_thw": inputs.image_grid_thw[0].tolist(),
        "logits": tuple(logits.shape), "logits_finite": bool(np.isfinite(logits).all()),
        "greedy next token": repr(tokenizer.decode([int(logits[0, -1].argmax())])),
        "assets_s": round(setup_s, 3), "model_load_s": round(load_s, 3),
        "first_call_s (compile)": round(times[0], 3),
        "steady_call_ms (median)": round(1e3 * float(np.median(times[1:])), 2),
        "tokens_per_s": round(inputs.length / float(np.median(times[1:])), 1),
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
    # sys_argv lets ml_collections register the --config.* override flags of this argv.
    config_flags.DEFINE_config_file("config", DEFAULT_CONFIG + ":tiny", "config file[:arg]",
                                    flag_values=flag_values, sys_argv=argv)
    flag_values(argv)
    COMMANDS[command](flag_values.config)


if __name__ == "__main__":
    main()
