"""The shapes of an RL run's compiled programs.

Every distinct input shape of a jitted program is a compilation: seconds on a CPU, minutes for
an 8B program on an accelerator. An RL step's shapes follow its draws (the overview budget K of
each prompt, how many crops the policy asked for, how long its episodes ran), so with each
call bucketing its own sizes a run keeps compiling new programs long after its first step. The
`fixed` policy gives every varying size of the step one value chosen from the config:

  prompt prefill   rows: the step's prompts (their power-of-two bucket); width: `prompt_width`
                   tokens; the overview's vision pass padded to `prompt_frames` frames per prompt
  decode           the same prompt cache width every step; the suffix cache sized for the
                   whole episode up front (as before)
  tool responses   text chunks written in pieces of `extend_width` tokens (one program
                   however long the responses; chunks with images, frames mode, keep their
                   power-of-two buckets); the prefill attends every cache slot
                   (`SamplerConfig.prefill_window="capacity"`), so the write pointer's
                   position does not enter the program
  sub-agents       calls of exactly `subagent_rows` rows of `subagent_width` tokens (0: the
                   episode rows' bucket, so a round takes up to max_parallel calls, or with
                   `subagent_batch = "round"` that times max_parallel, a round's prompts in one
                   call), their vision pass padded to `DispatchConfig.max_frames` frames per row
  training         micro-batch rows as before; packed width `train_width`; the vision pass
                   padded to `train_frames` frames per micro-batch; advantages in one program

`per_call` keeps every call's own power-of-two buckets (the behaviour before this module, and
the baseline of bench/rl_step.py). A size left at 0 is derived from the config as an upper
bound of what the run can produce (`resolve`); a step whose sizes exceed a fixed value uses
its own bucket for that call (a compilation, which the training loop reports).
"""
from __future__ import annotations

import dataclasses

from paravt_jax.agent.dispatch import DispatchConfig
from paravt_jax.agent.rollout import FRAME_TEXT_TOKENS, RolloutConfig, response_tokens_bound
from paravt_jax.config import checked, integer, one_of, validate
from paravt_jax.infra.buckets import bucket
from paravt_jax.sampling.calls import PromptShape
from paravt_jax.video.frames import FACTOR

POLICIES = ("fixed", "per_call")
# How many rows a sub-agent call has when rl.shapes.subagent_rows is 0: the episode rows' bucket
# (a tool round of c calls a row takes c calls), or that times dispatch.max_parallel (a round's
# prompts in one call: the weights read once per decode step instead of c times)
SUBAGENT_BATCHES = ("episode_rows", "round")
# Bounds of the text around the frames: the system message with the tool schema and the
# question (prompt), the segment instruction (sub-agent prompt).
PROMPT_TEXT_TOKENS, SUBAGENT_TEXT_TOKENS = 768, 64
# A turn's text tool responses go in pieces of this many tokens: one or two pieces for the
# toy's summaries, and a few hundred tokens per call of a large model's weights read
EXTEND_WIDTH = 256


@dataclasses.dataclass(frozen=True)
class ShapeConfig:
    policy: str = checked("fixed", one_of(POLICIES))
    # sizes: 0 = derived from the config
    prompt_width: int = checked(0, integer(0))  # tokens of the prompt prefill and of the prompt cache
    prompt_frames: int = checked(0, integer(0))  # overview frames per prompt of its vision pass (0: the largest K)
    extend_width: int = checked(0, integer(0))  # tokens per prefill piece of a turn's tool responses (0: EXTEND_WIDTH)
    subagent_rows: int = checked(0, integer(0))  # rows of every sub-agent call (0: by subagent_batch)
    subagent_batch: str = checked("episode_rows", one_of(SUBAGENT_BATCHES))
    subagent_width: int = checked(0, integer(0))  # tokens of a sub-agent prompt prefill
    train_width: int = checked(0, integer(0))  # packed width of the training micro-batches
    train_frames: int = checked(0, integer(0))  # frames of a training micro-batch's vision pass

    def __post_init__(self):
        validate(self)


@dataclasses.dataclass(frozen=True)
class StepShapes:
    """The sizes one RL step's programs use (all zeros under the per_call policy)."""
    prompt: PromptShape
    subagent: PromptShape
    train_width: int
    train_frames: int
    prefill_window: str  # SamplerConfig.prefill_window
    extend_width: int  # SamplerConfig.extend_width


PER_CALL = StepShapes(PromptShape(), PromptShape(), 0, 0, "used", 0)


def frame_tokens(max_pixels: int) -> int:
    """Most visual tokens of one frame resized to at most `max_pixels` pixels."""
    return max(max_pixels // FACTOR**2, 1)


def resolve(shapes: ShapeConfig, rollout: RolloutConfig, dispatch: DispatchConfig, largest_k: int,
            prompts: int, rows: int, micro_rows: int, chunk_bucket: int) -> StepShapes:
    """The step's sizes: `shapes`' values, or the bounds the config implies where they are 0.

    largest_k: the most overview frames a prompt gets; prompts, rows: the step's prompts and
    episode rows on this process; micro_rows: episode rows of a training micro-batch (0:
    varying, token-budget micro-batches); chunk_bucket: the sampler's smallest prefill width."""
    if shapes.policy == "per_call":
        return PER_CALL
    k = shapes.prompt_frames or largest_k
    prompt = rollout.prompt
    per_frame = frame_tokens(prompt.overview_max_pixels) + (FRAME_TEXT_TOKENS if prompt.overview_timestamps else 0)
    prompt_width = shapes.prompt_width or bucket(k * per_frame + PROMPT_TEXT_TOKENS, chunk_bucket)
    crop_frames = dispatch.max_frames
    subagent_width = shapes.subagent_width or bucket(crop_frames * frame_tokens(dispatch.max_pixels)
                                                     + SUBAGENT_TEXT_TOKENS, chunk_bucket)
    max_parallel = 1 if rollout.mode == "sequential" else dispatch.max_parallel
    episode = prompt_width + rollout.max_turns * (rollout.max_new_tokens
                                                  + response_tokens_bound(rollout, dispatch, max_parallel))
    train_width = shapes.train_width or bucket(episode, 256)
    crops = 0 if rollout.mode == "subagent" else rollout.max_turns * max_parallel * crop_frames
    train_frames = shapes.train_frames or micro_rows * (k + crops)
    return StepShapes(PromptShape(bucket(prompts), prompt_width, k),
                      PromptShape(shapes.subagent_rows or bucket(rows) * (
                          max_parallel if shapes.subagent_batch == "round" else 1), subagent_width,
                                  crop_frames if rollout.mode == "subagent" else 0),
                      train_width, train_frames, "capacity", shapes.extend_width or EXTEND_WIDTH)


def largest_nframes(config) -> int:
    """The most overview frames one of the run's prompts gets (config: an RLConfig)."""
    if config.nframes_gating:
        return max(config.nframes_choices)
    return config.default_nframes or config.rollout.prompt.overview_max_frames


def step_shapes(config, prompts: int) -> StepShapes:
    """The sizes of an RL run's programs (config: an RLConfig) for `prompts` prompts on this
    process. Token-budget micro-batches hold a varying number of episodes: their frames are
    padded to rl.shapes.train_frames when set, else to powers of two."""
    rows = config.prompts_per_step * config.samples_per_prompt
    micro_rows = 0 if config.max_tokens_per_micro_batch else -(-rows // config.micro_batches)
    return resolve(config.shapes, config.rollout, config.dispatch, largest_nframes(config), prompts,
                   prompts * config.samples_per_prompt, micro_rows, config.sampler.min_chunk_bucket)
