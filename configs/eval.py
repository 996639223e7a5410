"""Evaluation driver config (`paravt-jax eval`): model, prompt mode, protocol, benchmarks.

    paravt-jax eval --config=configs/eval.py:synthetic --output_dir=runs/eval
    paravt-jax eval --config=configs/eval.py:paravt_8b --config.model.checkpoint=/ckpt/ParaVT-8B \\
        --config.root=/data/bench --config.datasets=videomme,lvbench --output_dir=runs/eval8b

Presets: synthetic (the built-in tiny model on held-out synthetic videos; minutes on a CPU),
paravt_8b (the reference protocol: K=64, 3 rounds, 5 calls, 2048 tokens, bf16).
Benchmark paths default to the reference's layout under `root` (an HF_HOME-like folder);
set `benchmarks.<name>.annotations` / `.video_dir` (absolute) to point anywhere else.
"""
import os

import ml_collections

from paravt_jax.configs import base

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
    c.prompt_mode = "agentic_general"  # direct | reasoning | agentic_general | agentic_minimal
    c.grounding_prompt_mode = "agentic_minimal"  # Charades-STA, as the reference
    c.dispatch = "parallel"  # parallel | sequential
    c.nframes = 64
    c.max_turns = 3
    c.max_parallel = 5
    c.max_new_tokens = 2048
    c.mcq_answer_tokens = 64
    c.grounding_answer_tokens = 128
    c.batch_size = 8
    # The reference protocol (docs/eval.md): frame budgets as its processors leave them, bare
    # overview images, crops as images before "<tool_response>\nN frames from S.Ss to E.Es.\n
    # </tool_response>", a missing end_time = start + 10 s, calls past max_parallel dropped, a
    # turn without a valid call is the answer, " The video path for this video is: NAME" unless
    # the question names a video path. Our variants: see the comments of DriverConfig.
    c.overview_min_pixels = 100352
    c.overview_max_pixels = 602112
    c.crop_min_pixels = 65536
    c.crop_max_pixels = 81920
    c.think_prefix = False
    c.overview_timestamps = False
    # Charades-STA's overview: "video" = one Qwen3-VL video item (the reference sends the video
    # file, which the server decodes to 32 frames resized within the checkpoint's video budget
    # of 4096..25165824 total pixels) | "images" = K bare image items like the other benchmarks.
    c.grounding_visual = "video"  # video | images
    c.video_frames = 32
    c.video_min_pixels = 4096
    c.video_max_pixels = 25165824
    c.video_path_line = "space_if_absent"  # space_if_absent | newline | none
    c.frames_response = "images_first"  # images_first | timestamped
    c.malformed = "ignore"  # ignore | respond
    c.extra_calls = "ignore"  # ignore | respond
    c.crop_arguments = "lenient"  # lenient | strict
    c.prompt_file = ""  # JSON of exact prompt texts (paravt_jax.eval.prompts.PromptTexts)
    if preset == "synthetic":  # the tiny model was trained on 96x160 frames and short turns
        c.nframes, c.max_new_tokens, c.batch_size = 16, 96, 4
        c.overview_min_pixels = c.crop_min_pixels = 784
        c.overview_max_pixels = c.crop_max_pixels = 96 * 160
    else:
        c.model.param_dtype = c.model.dtype = "bfloat16"
    c.benchmarks = benchmarks()
    return c
