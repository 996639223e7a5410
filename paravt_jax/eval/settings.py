"""The benchmark driver's settings: `DriverConfig`, the `driver` section of configs/eval.py.

Every field checks its own values (paravt_jax.config.checked), so a bad value is refused with
its dotted name (`driver.max_parallel=0: must be an integer >= 1`) when the section is built,
before any benchmark or model is loaded. The settings also key the driver's records
(eval/provenance.py: every field but batch_size).
"""
from __future__ import annotations

import dataclasses

from paravt_jax.agent.dispatch import ARGUMENTS as CROP_ARGUMENTS
from paravt_jax.agent.rollout import CALL_HANDLING, FRAMES_RESPONSES
from paravt_jax.config import checked, integer, one_of, set_by, validate
from paravt_jax.eval.prompts import MODES as PROMPT_MODES
from paravt_jax.text.chat import VIDEO_PATH_LINES, VISUALS

DISPATCH = ("parallel", "sequential")


@dataclasses.dataclass(frozen=True)
class DriverConfig:
    prompt_mode: str = checked("agentic_general", one_of(PROMPT_MODES))
    nframes: int = checked(64, integer(1))  # K overview frames
    max_turns: int = checked(3, integer(0))  # tool rounds (agentic modes)
    max_parallel: int = checked(5, integer(1))  # calls executed per round
    max_new_tokens: int = checked(2048, integer(1))  # per assistant turn
    mcq_answer_tokens: int = checked(64, integer(1))  # forced final answer
    grounding_answer_tokens: int = checked(128, integer(1))
    batch_size: int = checked(8, integer(1))  # samples per sampler call
    # parallel | sequential (one call per round: the baseline)
    dispatch: str = checked("parallel", one_of(DISPATCH))
    # Frame budgets. The reference's overview frames get the video defaults of qwen-vl-utils
    # (128..768 tokens of 28 x 28 pixels for up to 300 frames) and its crops 784..50176 pixels,
    # both then re-sized by the server's image processor (at least 65536 pixels, sides multiples
    # of 32): these defaults are that result in one resize (docs/eval.md).
    overview_min_pixels: int = checked(100352, integer(1))
    overview_max_pixels: int = checked(602112, integer(784))  # as RolloutConfig.overview_max_pixels
    crop_min_pixels: int = checked(65536, integer(1))
    crop_max_pixels: int = checked(81920, integer(1))
    think_prefix: bool = False  # the reference evaluates without a forced <think>
    # How the overview is sent: images (K image items) | video (one Qwen3-VL video item of
    # video_frames frames whose total T*H*W lies in [video_min_pixels, video_max_pixels]: what a
    # serving engine makes of the video file the reference sends for Charades-STA, decoded
    # with its default 32 frames and resized by the checkpoint's video processor budget).
    overview_visual: str = set_by("images", "the benchmark: grounding_visual for charades, images for the others",
                                  one_of(VISUALS))
    video_frames: int = checked(32, integer(1))
    video_min_pixels: int = checked(4096, integer(1))
    video_max_pixels: int = checked(25165824, integer(1))
    # The reference driver's protocol (docs/eval.md); the alternatives are this project's.
    overview_timestamps: bool = False  # True: "<t seconds>" before every overview frame
    video_path_line: str = checked("space_if_absent", one_of(VIDEO_PATH_LINES))
    frames_response: str = checked("images_first", one_of(FRAMES_RESPONSES))
    # ignore (a turn without a valid call is the answer) | respond
    malformed: str = checked("ignore", one_of(CALL_HANDLING))
    # calls beyond max_parallel: ignore | respond (error responses)
    extra_calls: str = checked("ignore", one_of(CALL_HANDLING))
    # lenient (end defaults to start + 10 s) | strict
    crop_arguments: str = checked("lenient", one_of(CROP_ARGUMENTS))
    prompt_file: str = ""  # JSON file of exact prompt texts (prompts.PromptTexts), "" = ours

    def __post_init__(self):
        validate(self)
