"""The two halves of an episode's protocol, apart from its budgets and sampling:

- `PromptFormat`: how the prompt is laid out (the tool schema or a given system text, the
  overview frames and their sizes, timestamps or one video item, the video-path line, the
  forced `<think>` of every assistant turn);
- `ToolProtocol`: how the model's calls are handled and answered (the frames-mode response
  layout, malformed blocks and calls beyond the per-turn limit, the forced final-answer turn).

Each has two presets: `training()`, the reference RL workflow's protocol (the defaults), and
`reference_eval()`, the reference evaluation driver's (docs/eval.md; the driver fills in what
its prompt mode, benchmark and question type decide: the system text, the overview visual,
the final-answer budget and instruction). `RolloutConfig` holds one of each (`rl.rollout.prompt`,
`rl.rollout.protocol`), the evaluation driver's `DriverConfig` too (`driver.prompt`,
`driver.protocol`).
"""
from __future__ import annotations

import dataclasses

from paravt_jax.config import checked, integer, one_of, validate
from paravt_jax.text import chat
from paravt_jax.video.frames import SIZINGS

FRAMES_RESPONSES = ("timestamped", "images_first")
CALL_HANDLING = ("respond", "ignore")
MALFORMED_HANDLING = (*CALL_HANDLING, "reference")
THINK_PREFIX = "<think>\n"  # the forced start of every assistant turn under think_prefix


@dataclasses.dataclass(frozen=True)
class PromptFormat:
    # False: no tool schema and no video-path line in the prompt, and one turn
    tools: bool = True
    # replaces the default system message (the tool schema envelope); None: the episode's own
    system_prompt: str | None = None
    # the injected tool schema: flat (RL workflow) | object (evaluation, SFT data)
    tool_layout: str = checked("flat", one_of(chat.TOOL_LAYOUTS))
    think_prefix: bool = True  # every assistant turn starts with a forced "<think>\n"
    video_path_line: str = checked("newline", one_of(chat.VIDEO_PATH_LINES))  # chat.with_video_path
    # How the overview is sent: "images" (image items; the settings below) or "video" (one
    # Qwen3-VL video item of overview_video_frames frames whose total pixels lie in the video
    # budget below; the reference's Charades-STA protocol).
    overview_visual: str = checked("images", one_of(chat.VISUALS))
    # single: one resize of each overview frame to [overview_min_pixels, overview_max_pixels] at
    # factor 32 (the evaluation driver's: the processor's budget); two_stage: the reference RL
    # workflow's qwen-vl-utils resize (factor 28) then the Qwen3-VL processor's (factor 32, at
    # least 65,536 pixels; video/frames.py `frame_sizes`)
    overview_sizing: str = checked("single", one_of(SIZINGS))
    overview_min_pixels: int = 784
    overview_max_pixels: int = checked(50176, integer(784))
    # Episodes with nframes 0 sample the overview at this rate, at most overview_max_frames
    # frames (the reference's overview when gating is off).
    overview_fps: float = 1.0
    overview_max_frames: int = checked(64, integer(1))
    # "<t seconds>" text before each overview frame (the RL workflow); False: bare images
    # (the evaluation driver).
    overview_timestamps: bool = True
    overview_video_frames: int = checked(32, integer(1))
    overview_video_min_pixels: int = checked(4096, integer(1))
    overview_video_max_pixels: int = checked(25165824, integer(1))

    def __post_init__(self):
        validate(self)

    @classmethod
    def training(cls) -> PromptFormat:
        """The reference RL workflow's prompt: the flat tool schema, timestamped overview
        frames, the video path on its own line, a forced `<think>`."""
        return cls()

    @classmethod
    def reference_eval(cls) -> PromptFormat:
        """The reference evaluation driver's prompt: bare overview frames of the server's frame
        budget (qwen-vl-utils' resize to its video defaults, then the image processor's), the
        video path after a space, the object tool schema, no forced `<think>`. The driver sets
        the system text (its prompt mode) and the overview visual (its benchmark)."""
        return cls(tool_layout="object", think_prefix=False, video_path_line="space_if_absent",
                   overview_min_pixels=100352, overview_max_pixels=602112, overview_timestamps=False,
                   overview_sizing="two_stage")


@dataclasses.dataclass(frozen=True)
class ToolProtocol:
    # Frames-mode tool responses. timestamped: `<tool_response>\nN frames from S s to E s.\n`, the
    # frames each after its `<t seconds>`, `\n</tool_response>`, errors as "Error: reason";
    # images_first (the evaluation driver): the bare frames, then `<tool_response>\nN frames
    # from S.Ss to E.Es.\n</tool_response>`, errors `[Error cropping S.Ss-E.Es]`.
    frames_response: str = checked("timestamped", one_of(FRAMES_RESPONSES))
    # malformed: respond = every malformed call block gets an error response, and a turn with
    # malformed blocks only gets its responses and another turn; ignore = malformed blocks are
    # skipped and a turn without a valid call ends the dialog (the evaluation driver);
    # reference = the RL workflow's parser: one malformed <tool_call> block discards every
    # <tool_call> call of the turn (its <tool_code> calls, if any, still run), no error
    # response, and a turn left without a call ends the episode.
    malformed: str = checked("respond", one_of(MALFORMED_HANDLING))
    # calls beyond the dispatcher's max_parallel: respond (an error response) | ignore
    extra_calls: str = checked("respond", one_of(CALL_HANDLING))
    # final_answer: the last of the max_turns tool rounds ends with its tool responses, then
    # final_answer_instruction (a user message, if any) and one short turn of
    # final_answer_tokens to answer (the evaluation protocol). Without it, calls made after
    # the last round are left unanswered (training).
    final_answer: bool = False
    final_answer_tokens: int = checked(64, integer(1))
    final_answer_prefix: str = ""  # the forced start of the final-answer turn
    final_answer_instruction: str = ""

    def __post_init__(self):
        validate(self)

    @classmethod
    def training(cls) -> ToolProtocol:
        """The RL workflow's: every malformed block and every call beyond the limit gets an
        error response, crops answered as timestamped frames, no forced final answer."""
        return cls()

    @classmethod
    def reference_eval(cls) -> ToolProtocol:
        """The reference evaluation driver's: the frames before their caption, malformed blocks
        and extra calls ignored, a forced final answer after the last round (64 tokens: the
        multiple-choice budget; the driver sets each question type's budget and instruction)."""
        return cls(frames_response="images_first", malformed="ignore", extra_calls="ignore", final_answer=True)
