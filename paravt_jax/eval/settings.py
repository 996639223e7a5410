"""The benchmark driver's settings: `DriverConfig`, the `driver` section of configs/eval.py.

The episode's prompt layout and tool protocol are the rollout's own dataclasses
(agent/protocol.py) at their `reference_eval()` presets: `driver.prompt.*` and
`driver.protocol.*` override them; what the driver decides itself per benchmark, prompt mode
and question type (the system text, the overview visual, the final-answer budget and
instruction) is left out of those subsections. Every field checks its own values
(paravt_jax.config.checked), so a bad value is refused with its dotted name
(`driver.max_parallel=0: must be an integer >= 1`, `driver.prompt.video_path_line='x': ...`)
when the section is built, before any benchmark or model is loaded. The settings also key the
driver's records (`DriverConfig.record_settings`, eval/provenance.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from paravt_jax.agent.dispatch import ARGUMENTS as CROP_ARGUMENTS
from paravt_jax.agent.protocol import PromptFormat, ToolProtocol
from paravt_jax.config import checked, integer, one_of, share, subsection, validate
from paravt_jax.eval.datasets import BENCHMARKS
from paravt_jax.eval.prompts import MODES as PROMPT_MODES
from paravt_jax.text.chat import VISUALS
from paravt_jax.text.inputs import VIDEO_ITEM_LAYOUT
from paravt_jax.video.frames import SIZINGS

DISPATCH = ("parallel", "sequential")

# What the driver sets in its prompt format and tool protocol (field -> what decides it).
PROMPT_SET_BY = {
    "tools": "prompt_mode: the agentic modes offer the tool",
    "system_prompt": "prompt_mode and prompt_file: the mode's system text",
    "tool_layout": "prompt_mode: its system text holds the tool schema",
    "overview_visual": "the benchmark: grounding_visual for charades, images for the others",
    "overview_fps": "unused: every sample's overview has driver.nframes frames",
    "overview_max_frames": "unused: every sample's overview has driver.nframes frames",
}
PROTOCOL_SET_BY = {
    "final_answer": "prompt_mode: the agentic modes end in a forced answer",
    "final_answer_tokens": "mcq_answer_tokens or grounding_answer_tokens, by question type",
    "final_answer_instruction": "the question type's final instruction (prompt_file)",
}
# DriverConfig fields that change how the samples are batched, not what each one produces.
NOT_PRODUCING = ("batch_size",)
# The names the records' settings give the fields of driver.prompt and driver.protocol: the
# flat config's (before those subsections), so the records written then keep their producer.
RECORD_NAMES = {
    "prompt.think_prefix": "think_prefix", "prompt.overview_min_pixels": "overview_min_pixels",
    "prompt.overview_max_pixels": "overview_max_pixels", "prompt.overview_visual": "overview_visual",
    "prompt.overview_video_frames": "video_frames", "prompt.overview_video_min_pixels": "video_min_pixels",
    "prompt.overview_video_max_pixels": "video_max_pixels", "prompt.overview_timestamps": "overview_timestamps",
    "prompt.video_path_line": "video_path_line", "protocol.frames_response": "frames_response",
    "protocol.malformed": "malformed", "protocol.extra_calls": "extra_calls",
    # keyed always since its default became two_stage (2026-12-04): records sized in one resize
    # before then carry no key and are refused, not resumed as two-stage ones
    "prompt.overview_sizing": "overview_sizing",
}


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
    # Crop frames as the reference's: 784..50176 pixels from qwen-vl-utils (factor 28), then the
    # server's image processor's resize (at least 65536 pixels, sides multiples of 32):
    # crop_sizing two_stage. single: one resize to crop_min..max_pixels (65536 / 81920 come
    # close to the reference's sizes; docs/eval.md).
    crop_min_pixels: int = checked(784, integer(1))
    crop_max_pixels: int = checked(50176, integer(1))
    crop_sizing: str = checked("two_stage", one_of(SIZINGS))
    # lenient (end defaults to start + 10 s) | strict
    crop_arguments: str = checked("lenient", one_of(CROP_ARGUMENTS))
    prompt_file: str = ""  # JSON file of exact prompt texts (prompts.PromptTexts), "" = ours
    # The prompt layout (overview frame budget and visual, timestamps, video-path line, think
    # prefix) and the tool protocol (tool-response layout, malformed blocks, extra calls): the
    # reference driver's (docs/eval.md); the alternatives are this project's.
    prompt: PromptFormat = subsection(PromptFormat.reference_eval(), PROMPT_SET_BY)
    protocol: ToolProtocol = subsection(ToolProtocol.reference_eval(), PROTOCOL_SET_BY)

    def __post_init__(self):
        validate(self)

    def record_settings(self) -> dict[str, Any]:
        """The settings that key the driver's records: every field but NOT_PRODUCING; the
        prompt's and protocol's fields in RECORD_NAMES under those names, the others that
        the config sets (not the driver) under their dotted names when off their defaults
        (a knob added later keys records only where it is used); a video item's layout
        (text.inputs.VIDEO_ITEM_LAYOUT) where the overview is one."""
        settings = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                    if f.name not in NOT_PRODUCING and f.name not in ("prompt", "protocol")}
        default = DriverConfig()
        for part, set_by in (("prompt", PROMPT_SET_BY), ("protocol", PROTOCOL_SET_BY)):
            for field in dataclasses.fields(getattr(self, part)):
                name, value = f"{part}.{field.name}", getattr(getattr(self, part), field.name)
                if name in RECORD_NAMES:
                    settings[RECORD_NAMES[name]] = value
                elif field.name not in set_by and value != getattr(getattr(default, part), field.name):
                    settings[name] = value
        if settings.get("overview_visual") == "video":  # records of an earlier layout are refused, not resumed
            settings["video_item_layout"] = VIDEO_ITEM_LAYOUT
        return settings


@dataclasses.dataclass(frozen=True)
class BenchmarkConfig:
    """One benchmark under the driver's protocol: the settings of the evaluator type `benchmark`
    of an evaluations section (eval/registry.py; driver.BenchmarkEval). `paravt-jax eval` makes
    one per dataset of its config (cli/eval.py)."""
    dataset: str = checked("synthetic", one_of(tuple(BENCHMARKS)))
    # a table file or shard directory, and the video folder (datasets.BENCHMARKS says each
    # benchmark's layout); both empty for `synthetic`: the run's built-in held-out set
    annotations: str = ""
    video_dir: str = ""
    subtitle_dir: str = ""  # videomme_wsub's .srt folder (required by it, refused by the others)
    limit: int = checked(0, integer(0))  # annotation rows (0 = all)
    # refused when more of its videos than this share are missing (a mistyped video_dir)
    max_missing_videos: float = checked(0.02, share())
    # the overview: K image items, or one video item (Charades-STA in the reference protocol)
    visual: str = checked("images", one_of(VISUALS))
    driver: DriverConfig = DriverConfig()

    def __post_init__(self):
        validate(self)

    def protocol(self) -> DriverConfig:
        """The driver settings of this benchmark's episodes: `driver` with its overview visual."""
        return dataclasses.replace(self.driver, prompt=dataclasses.replace(self.driver.prompt,
                                                                           overview_visual=self.visual))
