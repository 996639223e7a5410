"""Evaluation driver config (`paravt-jax eval`): model, benchmarks, and the protocol (the
`driver` section, shaped like paravt_jax.eval.settings.DriverConfig).

    paravt-jax eval --config=configs/eval.py:synthetic --output_dir=runs/eval
    paravt-jax eval --config=configs/eval.py:paravt_8b --config.model.checkpoint=/ckpt/ParaVT-8B \\
        --config.root=/data/bench --config.datasets=videomme,lvbench --config.driver.nframes=32 \\
        --output_dir=runs/eval8b

Presets: synthetic (the built-in tiny model on held-out synthetic videos; minutes on a CPU),
paravt_8b (the reference protocol: K=64, 3 rounds, 5 calls, 2048 tokens, bf16).
Benchmark paths default to the reference's layout under `root` (an HF_HOME-like folder);
set `benchmarks.<name>.annotations` / `.video_dir` (absolute) to point anywhere else.
"""
import os

import ml_collections

from paravt_jax.config import section
from paravt_jax.configs import base
from paravt_jax.eval.settings import DriverConfig

ALL = "videomme,videomme_wsub,longvideobench,lvbench,mlvu,mmvu,charades"


def benchmarks() -> ml_collections.ConfigDict:
    """Local copies in the reference's layout (annotation parquet/arrow + video folder).
    Relative paths are taken under `root`; absolute ones as they are."""
    j = os.path.join
    return ml_collections.ConfigDict({
        "videomme": dict(annotations=j("datasets", "Video-MME"), video_dir=j("videomme", "data"), subtitle_dir=""),
        "videomme_wsub": dict(annotations=j("datasets", "Video-MME"), video_dir=j("videomme", "data"),
                              subtitle_dir=j("videomme", "subtitle")),
        "longvideobench": dict(annotations=j("datasets", "LongVideoBench"),
                               video_dir=j("datasets", "longvideobench", "videos"), subtitle_dir=""),
        "lvbench": dict(annotations=j("datasets", "LVBench"), video_dir=j("lvbench"), subtitle_dir=""),
        "mlvu": dict(annotations=j("datasets", "MLVU_dev"), video_dir=j("MLVU", "video"), subtitle_dir=""),
        "mmvu": dict(annotations=j("datasets", "MMVU"), video_dir=j("MMVU"), subtitle_dir=""),
        "charades": dict(annotations=j("datasets", "charades_sta"), video_dir=j("charades_sta", "Charades_v1_480"),
                         subtitle_dir=""),
        "synthetic": dict(annotations="", video_dir="", subtitle_dir=""),  # empty: the built-in held-out set
    })


def get_config(arg: str = "synthetic") -> ml_collections.ConfigDict:
    preset = arg or "synthetic"
    if preset not in ("synthetic", "paravt_8b"):
        raise ValueError(f"configs/eval.py preset {preset!r}: expected synthetic or paravt_8b")
    c = base.get_config("tiny" if preset == "synthetic" else "8b")
    c.preset = preset
    c.output_dir = ""  # --output_dir overrides
    c.root = ""
    c.datasets = "synthetic" if preset == "synthetic" else ALL  # comma-separated
    c.limit = 0  # samples per dataset (0 = all); --limit overrides
    # A benchmark whose missing videos exceed this share of its samples is refused (a mistyped
    # video_dir); below it the missing samples are skipped and counted in the summary.
    c.max_missing_videos = 0.02
    # The protocol of every benchmark (paravt_jax.eval.settings.DriverConfig; its defaults are
    # the reference driver's, docs/eval.md): prompt mode, K, tool rounds and calls, token
    # budgets, batch size, crop budgets, and the rollout's prompt format and tool protocol at
    # their reference_eval() presets (driver.prompt, driver.protocol: agent/protocol.py).
    c.driver = section(DriverConfig())
    # Charades-STA's own protocol, as the reference: its prompt mode, and its overview: "video" =
    # one Qwen3-VL video item (the reference sends the video file, which the server decodes to
    # driver.prompt.overview_video_frames frames resized within the checkpoint's video budget
    # driver.prompt.overview_video_min_pixels..overview_video_max_pixels) | "images" = K bare image items like
    # the other benchmarks.
    c.grounding_prompt_mode = "agentic_minimal"
    c.grounding_visual = "video"  # video | images
    if preset == "synthetic":  # the tiny model was trained on 96x160 frames and short turns
        c.driver.nframes, c.driver.max_new_tokens, c.driver.batch_size = 16, 96, 4
        c.driver.prompt.overview_min_pixels = c.driver.crop_min_pixels = 784
        c.driver.prompt.overview_max_pixels = c.driver.crop_max_pixels = 96 * 160
        # one resize: two stages would scale the tiny frames up to >= 65,536 pixels each
        c.driver.prompt.overview_sizing = c.driver.crop_sizing = "single"
    else:
        c.model.param_dtype = c.model.dtype = "bfloat16"
    c.benchmarks = benchmarks()
    return c
