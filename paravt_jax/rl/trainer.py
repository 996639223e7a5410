"""PARA-GRPO training: each step samples B prompts (deterministic order), draws K per prompt
(nFrames gating), runs G rollouts per prompt, scores them, computes reference log-probs and
advantages, runs the train step and logs."""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from paravt_jax import distributed as dist
from paravt_jax.agent.dispatch import CropDispatcher, DispatchConfig
from paravt_jax.agent.rollout import Episode, RolloutConfig, run_rollouts
from paravt_jax.rl import gating
from paravt_jax.rl import rewards as R
from paravt_jax.rl.advantages import AdvantageConfig, compute_advantages
from paravt_jax.rl.batch import micro_batches, pack
from paravt_jax.rl.episode_stats import summarize
from paravt_jax.rl.train_step import OptimizerConfig, StepConfig, TrainStep
from paravt_jax.sampling import Sampler, SamplerConfig
from paravt_jax.training import LoopConfig, data_indices, run_loop


REWARD_TEXTS = ("turns", "released", "completion")


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """text: what the rewards read.
      turns      accuracy and tool rewards read the generated tokens; the format and anchor
                 rewards read every assistant turn as the model's context shows it (its forced
                 prefix, e.g. `<think>\n`, then its generated tokens; tool responses excluded);
      released   every reward reads the generated tokens only, as the released workflow does
                 (under think_prefix the forced `<think>` is then invisible and the format and
                 anchor rewards of a well-formed turn are 0);
      completion every reward reads everything after the prompt, tool responses included."""
    answer_suffix: bool = True
    anchor_weight: float = 0.5
    format_weight: float = 1.0
    mode: str = "f1"
    text: str = "turns"

    def __post_init__(self):
        if self.text not in REWARD_TEXTS:
            raise ValueError(f"reward text {self.text!r}: expected one of {REWARD_TEXTS}")


def reward_texts(rollout, text: str) -> tuple[str, str]:
    """(the text the accuracy and tool rewards read, the text the format and anchor rewards
    read) of one rollout under `RewardConfig.text`."""
    if text == "completion":
        return rollout.completion, rollout.completion
    if text == "released":
        return rollout.generated_text, rollout.generated_text
    return rollout.generated_text, rollout.assistant_text


@dataclasses.dataclass(frozen=True)
class RLConfig:
    steps: int = 4
    prompts_per_step: int = 2
    samples_per_prompt: int = 4
    micro_batches: int = 1
    seed: int = 0
    nframes_gating: bool = True
    # K with gating off; 0 = the overview sampled at rollout.overview_fps, at most
    # rollout.overview_max_frames frames (the reference recipe: 1 fps, 64 frames)
    default_nframes: int = 0
    nframes_choices: tuple[int, ...] = gating.NFRAMES_CHOICES
    rollout: RolloutConfig = RolloutConfig()
    dispatch: DispatchConfig = DispatchConfig()
    reward: RewardConfig = RewardConfig()
    advantage: AdvantageConfig = AdvantageConfig()
    step: StepConfig = StepConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    checkpoint_every: int = 0
    max_bad_steps: int = 3
    eval_every: int = 0  # greedy held-out evaluation every N steps (0 = off)
    eval_nframes: int = 16
    eval_limit: int = 2


def score(rollouts, config: RewardConfig, token_anchor: bool, judge=None) -> tuple[list[dict], np.ndarray, np.ndarray]:
    """(reward dicts, sequence rewards [N], anchor rewards [N])."""
    out, seq, anchor = [], [], []
    for r in rollouts:
        text, format_text = reward_texts(r, config.text)
        total, parts = R.compose_reward(text, r.episode.answer, r.episode.question_type,
                                        answer_suffix=config.answer_suffix,
                                        anchor_weight=0.0 if token_anchor else config.anchor_weight,
                                        format_weight=config.format_weight, mode=config.mode, judge=judge,
                                        format_text=format_text)
        a = R.anchor_reward(format_text) if token_anchor and not R.is_degenerate(text) else 0.0
        out.append({"total": total, **parts, "anchor_reward": a})
        seq.append(total)
        anchor.append(a)
    return out, np.asarray(seq, np.float32), np.asarray(anchor, np.float32)


def episode(row, config: RLConfig) -> Episode:
    """One RL row's episode. K is drawn per video, as the reference keys it on the row's video
    paths (every question on a video sees the same overview), with a stable hash."""
    k = gating.nframes_for_prompt(gating.prompt_key_from_videos([row.video_path]), config.seed,
                                  config.nframes_gating, config.default_nframes, config.nframes_choices)
    return Episode(f"row{row.index}", row.question, row.answer, row.question_type, row.video_path, k,
                   system_prompt=row.system_prompt)


def gather_scored(rollouts: list, rewards: list[dict], seq_rewards: np.ndarray, anchor_rewards: np.ndarray,
                  skipped: list[str]) -> tuple[list, list[dict], np.ndarray, np.ndarray, list[str]]:
    """Every process's scored rollouts, concatenated in process order (the step's row order);
    the arguments themselves in a single-process run. Sub-agent trajectories stay behind: the
    loss does not use them and they carry every crop's pixels."""
    if dist.process_count() == 1:
        return rollouts, rewards, seq_rewards, anchor_rewards, skipped
    light = [dataclasses.replace(r, subagents=()) for r in rollouts]
    parts = dist.allgather_objects((light, rewards, seq_rewards, anchor_rewards, skipped))
    return (dist.concatenate_lists([p[0] for p in parts]), dist.concatenate_lists([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]).astype(np.float32),
            np.concatenate([p[3] for p in parts]).astype(np.float32), dist.concatenate_lists([p[4] for p in parts]))


def train_rl(model, tokenizer, rows: list, workdir: str, config: RLConfig, judge=None, eval_rows=None):
    """rows: RLRow list (eval_rows: held-out rows for periodic evaluation). Returns (model with
    trained weights, LoopResult).

    Multi-process: each process rolls out and scores its contiguous share of the step's prompts
    on its own devices; the scored rollouts are gathered so that every process builds the same
    global batch, and the update runs over all devices (see paravt_jax.distributed)."""
    share = dist.process_slice(config.prompts_per_step, "prompts_per_step")  # this process's prompts
    token_anchor = config.advantage.token_anchor
    keep_reference = config.advantage.kl_ctl > 0
    step = TrainStep(model, config.optimizer, config.step, mesh=dist.model_mesh(model),
                     keep_reference=keep_reference)
    dispatcher = CropDispatcher(config.dispatch)
    rollout_config = dataclasses.replace(config.rollout, temperature=config.step.temperature)
    G = config.samples_per_prompt

    def step_fn(state, index):
        t0 = time.perf_counter()
        chosen = [rows[i] for i in data_indices(index * config.prompts_per_step, config.prompts_per_step,
                                                 len(rows), config.seed)]
        episodes = [episode(r, config) for r in chosen[share]]
        sampler = Sampler(dist.local_model(step.model(state)), SamplerConfig(min_chunk_bucket=64))
        # rows are prompt-major: this share's rows start at share.start * G in the step's batch
        run_config = dataclasses.replace(rollout_config, seed=config.seed * 100_003 + index,
                                         row_offset=share.start * G)
        rollouts, skipped = run_rollouts(sampler, tokenizer, episodes, G, run_config, dispatcher)
        del sampler  # frees its per-layer weight copy before the update
        t1 = time.perf_counter()
        rewards, seq_rewards, anchor_rewards = score(rollouts, config.reward, token_anchor, judge)
        rollouts, rewards, seq_rewards, anchor_rewards, skipped = gather_scored(
            rollouts, rewards, seq_rewards, anchor_rewards, skipped)
        t2 = time.perf_counter()
        packed = pack([r.inputs for r in rollouts], [r.logprobs for r in rollouts],
                      [r.structural_mask for r in rollouts])
        # Micro-batches (with their vision inputs) are built once, for the reference pass and
        # the update; the advantages are filled in between.
        zero = np.zeros(packed.input_ids.shape, np.float32)
        batches = micro_batches(packed, zero, config.micro_batches, model.config.vision)
        ref = np.concatenate([step.reference_logprobs(b) for b in batches]) if keep_reference else zero
        advantages, adv_metrics = compute_advantages(
            seq_rewards, packed.loss_mask, packed.behaviour_logp, ref, config.advantage,
            group_size=G, anchor_rewards=anchor_rewards if token_anchor else None,
            structural_mask=packed.structural_mask if token_anchor else None)
        per_micro = len(rollouts) // config.micro_batches
        advantages = np.asarray(advantages, np.float32)
        batches = [dataclasses.replace(b, advantages=advantages[i * per_micro:(i + 1) * per_micro])
                   for i, b in enumerate(batches)]
        state, metrics = step.step(state, batches)
        t3 = time.perf_counter()
        metrics.update(summarize(rollouts, rewards))
        metrics.update({k: float(v) for k, v in adv_metrics.items()})
        tokens = int(packed.loss_mask.sum())
        metrics.update(rollout_s=t1 - t0, reward_s=t2 - t1, train_s=t3 - t2, skipped_episodes=len(skipped),
                       tokens_per_s=tokens / max(t3 - t0, 1e-9), rollouts=len(rollouts))
        if config.eval_every and eval_rows and (index + 1) % config.eval_every == 0:
            from paravt_jax.rl.evaluate import evaluate

            current = dist.local_model(step.model(state))
            for tools in (False, True) if dist.is_primary() else ():  # only process 0 logs
                result = evaluate(current, tokenizer, eval_rows[:config.eval_limit], nframes=config.eval_nframes,
                                  tools=tools, max_new_tokens=config.rollout.max_new_tokens,
                                  max_turns=config.rollout.max_turns)
                tag = "eval_tools" if tools else "eval_notools"
                metrics.update({f"{tag}/{k}": v for k, v in result.row().items() if k not in ("tools", "nframes")})
        return state, metrics

    try:
        result = run_loop("rl", workdir, step.init_state(), step_fn,
                          LoopConfig(config.steps, config.checkpoint_every, max_bad_steps=config.max_bad_steps),
                          meta_fn=lambda i: {"cursor": i * config.prompts_per_step, "seed": config.seed})
    finally:
        dispatcher.close()
    return step.model(result.state), result
