"""What a rollout plays and what it yields: the `Episode` (a question on its own video, with its
K overview frames), and the finished `Rollout` of one row with its sub-agent trajectories
(`SubTrajectory`) and the episode log's record of every executed call (`CallRecord`).

Plain frozen records, below the loop that fills them (agent/rows.py, agent/rollout.py).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from paravt_jax.text.inputs import ModelInputs


@dataclasses.dataclass(frozen=True)
class Episode:
    episode_id: str
    question: str
    answer: str
    question_type: str
    video_path: str  # the episode's own video: the only file any crop may open
    nframes: int = 64  # K overview frames (nFrames gating decides it); 0: sampled at PromptFormat.overview_fps
    system_prompt: str = ""  # the data row's own system message ("" = none)
    # False: the prompt offers no tools (the tool-free prompt: no tool schema, no video path
    # line); the episode ends after its first turn, a call in it unanswered
    tools: bool = True


@dataclasses.dataclass(frozen=True)
class SubTrajectory:
    """One sub-agent call: its prompt + summary (loss mask on the summary) and log-probs."""
    row: int
    inputs: ModelInputs
    logprobs: np.ndarray


@dataclasses.dataclass(frozen=True)
class CallRecord:
    """One executed call as the episode log keeps it: the assistant turn that made it, the
    window as the call reads (`tools.lenient_window`; the model's numbers, any size), the window
    the dispatcher cut (validated and clamped; None when the call was refused or named another
    tool than crop_video), the source timestamps of the crop's frames (references into the
    episode's video, not pixels) and the tool response's text (the sub-agent summary, the
    frames' caption, a text tool's answer, or the error)."""
    turn: int
    asked: tuple[float, float]
    window: tuple[float, float] | None
    frame_times: tuple[float, ...]
    response: str


@dataclasses.dataclass(frozen=True)
class Rollout:
    episode: Episode
    sample: int  # 0..G-1
    inputs: ModelInputs  # the whole sequence; inputs.loss_mask is 1 on generated tokens only
    logprobs: np.ndarray  # [L] behaviour log-probs, 0 where loss_mask is 0
    # [L] 1 on generated <think> </think> <tool_call> </tool_call> <answer> </answer> tokens
    structural_mask: np.ndarray
    prompt_length: int
    completion: str  # everything after the prompt (turns and tool responses)
    generated_text: str  # only the policy-generated tokens: what the released reward code scores
    # Every assistant turn as the model's context shows it: the turn's forced prefix (e.g. the
    # "<think>\n" of think_prefix, which is prompt, not generated) followed by its generated
    # tokens; tool responses and chat template excluded. What the format and anchor rewards read.
    turn_texts: tuple[str, ...]
    calls_per_turn: tuple[int, ...]
    turns: int  # assistant turns generated
    errors: tuple[str, ...]  # parse, validation, decode and overflow errors, in order
    subagents: tuple[SubTrajectory, ...]
    truncated: bool  # the last turn hit its token budget without a stop token
    overview_times: tuple[float, ...] = ()  # source timestamps of the K overview frames
    calls: tuple[CallRecord, ...] = ()  # every executed call, in order (the episode log's)

    @property
    def nframes(self) -> int:
        return self.episode.nframes

    @property
    def tools(self) -> bool:  # whether its prompt offered the tools
        return self.episode.tools

    @property
    def num_tool_calls(self) -> int:
        return int(sum(self.calls_per_turn))

    @property
    def assistant_text(self) -> str:
        """The assistant turns, concatenated in order (see `turn_texts`)."""
        return "".join(self.turn_texts)
