"""PARA-GRPO training: each step samples B prompts (deterministic order), draws K per prompt
(nFrames gating), runs G rollouts per prompt, scores them, computes reference log-probs and
advantages, runs the train step and logs."""
from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np

from paravt_jax import distributed as dist
from paravt_jax import sharding as sh
from paravt_jax.agent.dispatch import CropDispatcher, DispatchConfig
from paravt_jax.agent.rollout import Episode, RolloutConfig, run_rollouts
from paravt_jax.config import set_by
from paravt_jax.rl import gating
from paravt_jax.rl import judge as J
from paravt_jax.rl import rewards as R
from paravt_jax.rl.advantages import AdvantageConfig, compute_advantages
from paravt_jax.rl.episode_log import EpisodeLog, eval_records
from paravt_jax.rl.episode_stats import summarize
from paravt_jax.rl.objective import StepConfig, policy_head, policy_loss
from paravt_jax.rl.shapes import ShapeConfig, StepShapes, resolve
from paravt_jax.sampling import Sampler, SamplerConfig
from paravt_jax.train import compiles
from paravt_jax.train.batch import micro_batch_plan, pack, planned_micro_batches
from paravt_jax.train.loop import LoopConfig, UnreadableDataError, data_indices, run_loop
from paravt_jax.train.step import OptimizerConfig, TrainStep

REWARD_TEXTS = ("turns", "released", "completion")


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """The sequence reward; its anchor weight is the advantage's (`AdvantageConfig.anchor_weight`).

    text: what the rewards read.
      turns      accuracy and tool rewards read the generated tokens; the format and anchor
                 rewards read every assistant turn as the model's context shows it (its forced
                 prefix, e.g. `<think>\n`, then its generated tokens; tool responses excluded);
      released   every reward reads the generated tokens only, as the released workflow does
                 (under think_prefix the forced `<think>` is then invisible and the format and
                 anchor rewards of a well-formed turn are 0);
      completion every reward reads everything after the prompt, tool responses included."""
    answer_suffix: bool = True
    format_weight: float = 1.0
    mode: str = "f1"  # f1 | exact | llm (the judge from the environment, F1 when a call fails)
    text: str = "turns"  # turns | released | completion
    # mode "llm": the NAME of the environment variable holding the judge's API key (never
    # the key); the endpoint and model come from PARAVT_JUDGE_BASE_URL / PARAVT_JUDGE_MODEL.
    judge_api_key_env: str = J.ENV_API_KEY

    def __post_init__(self):
        if self.text not in REWARD_TEXTS:
            raise ValueError(f"reward text {self.text!r}: expected one of {REWARD_TEXTS}")


def make_judge(config: RewardConfig, environ=None) -> J.LLMJudge | None:
    """The LLM judge of reward mode "llm" (None for the other modes), built from the
    environment. Raises ValueError naming the missing or bad variable: a run that asked for a
    judge must not silently score F1."""
    if config.mode != "llm":
        return None
    env = os.environ if environ is None else environ
    base_url = env.get(J.ENV_BASE_URL) or J.DEFAULT_BASE_URL
    key = env.get(config.judge_api_key_env) or None
    if key is None and not J.is_loopback_url(base_url):
        raise ValueError(f"reward mode 'llm': the judge at {base_url} needs an API key, and the environment "
                         f"variable {config.judge_api_key_env} (rl.reward.judge_api_key_env) is not set; "
                         f"set it, or {J.ENV_BASE_URL} to a local server")
    try:
        return J.LLMJudge.from_env(env, api_key=key)
    except ValueError as e:
        raise ValueError(f"reward mode 'llm': cannot build the judge from the environment "
                         f"({J.ENV_BASE_URL}, {J.ENV_MODEL}, {J.ENV_TIMEOUT}): {e}") from None


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
    # > 0: micro-batches of at most this many tokens, short episodes packed into shared rows
    # (segment ids, each episode its own positions), a long one alone in its row;
    # micro_batches is then unused
    max_tokens_per_micro_batch: int = 0
    seed: int = set_by(0, "seed (the top of the config)")
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
    sampler: SamplerConfig = SamplerConfig(min_chunk_bucket=64)
    checkpoint_every: int = 0
    max_bad_steps: int = 3
    shapes: ShapeConfig = ShapeConfig()  # the compiled programs' shapes (rl/shapes.py)
    eval_every: int = 0  # greedy held-out evaluation every N steps (0 = off)
    eval_nframes: int = 16
    eval_limit: int = 2
    # sampled episodes logged per step to <workdir>/episodes/step_XXXXXX.jsonl (0 = none;
    # paravt_jax/rl/episode_log.py, `paravt-jax view`)
    log_episodes: int = 0


def score(rollouts, config: RewardConfig, anchor_weight: float, token_anchor: bool,
          judge=None) -> tuple[list[dict], np.ndarray, np.ndarray]:
    """(reward dicts, sequence rewards [N], anchor rewards [N]). With the token anchor, the
    anchor reward goes to its own array instead of the sequence reward."""
    out, seq, anchor = [], [], []
    for r in rollouts:
        text, format_text = reward_texts(r, config.text)
        total, parts = R.compose_reward(text, r.episode.answer, r.episode.question_type,
                                        answer_suffix=config.answer_suffix,
                                        anchor_weight=0.0 if token_anchor else anchor_weight,
                                        format_weight=config.format_weight, mode=config.mode, judge=judge,
                                        format_text=format_text)
        a = R.anchor_reward(format_text) if token_anchor and not R.is_degenerate(text) else 0.0
        out.append({"total": total, **parts, "anchor_reward": a})
        seq.append(total)
        anchor.append(a)
    return out, np.asarray(seq, np.float32), np.asarray(anchor, np.float32)


def episode(row, config: RLConfig) -> Episode:
    """One RL row's episode. K is drawn per video, as the reference keys it on the row's video
    paths (every question on a video sees the same overview), with a stable hash of the path
    as the table names it (the same draws wherever the data is checked out)."""
    k = gating.nframes_for_prompt(row.video_key or row.video_path, config.seed,
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


def unreadable_step(index: int, skipped: list[str], streak: dict, prompts_per_step: int,
                    dataset_size: int) -> dict:
    """The metrics of a step none of whose videos could be read (the update is skipped); raises
    UnreadableDataError once a whole epoch's worth of prompts in a row was unreadable."""
    streak["prompts"] += prompts_per_step
    names = "; ".join(skipped)
    if streak["prompts"] >= dataset_size:
        raise UnreadableDataError(f"[rl] no video could be read for {streak['prompts']} prompts in a row "
                                  f"(the dataset has {dataset_size}); the last step's: {names}")
    print(f"[rl] warning: step {index} skipped, none of its videos could be read: {names}", flush=True)
    return {"unreadable_step": 1.0, "skipped_episodes": len(skipped), "rollouts": 0}


def largest_nframes(config: RLConfig) -> int:
    """The most overview frames one of the run's prompts gets."""
    if config.nframes_gating:
        return max(config.nframes_choices)
    return config.default_nframes or config.rollout.overview_max_frames


def step_shapes(config: RLConfig, prompts: int) -> StepShapes:
    """The sizes of the run's programs (rl/shapes.py) for `prompts` prompts on this process.
    Token-budget micro-batches hold a varying number of episodes: their frames are padded to
    rl.shapes.train_frames when set, else to powers of two."""
    rows = config.prompts_per_step * config.samples_per_prompt
    micro_rows = 0 if config.max_tokens_per_micro_batch else -(-rows // config.micro_batches)
    return resolve(config.shapes, config.rollout, config.dispatch, largest_nframes(config), prompts,
                   prompts * config.samples_per_prompt, micro_rows, config.sampler.min_chunk_bucket)


def train_rl(model, tokenizer, rows: list, workdir: str, config: RLConfig, judge=None, eval_rows=None):
    """rows: RLRow list (eval_rows: held-out rows for periodic evaluation). Returns (model with
    trained weights, LoopResult).

    Multi-process: each process rolls out and scores its contiguous share of the step's prompts
    on its own devices; the scored rollouts are gathered so that every process builds the same
    global batch, and the update runs over all devices (see paravt_jax.distributed)."""
    share = dist.process_slice(config.prompts_per_step, "prompts_per_step")  # this process's prompts
    judge = judge if judge is not None else make_judge(config.reward)  # fails now, not at the first score
    token_anchor = config.advantage.token_anchor
    keep_reference = config.advantage.kl_ctl > 0
    step = TrainStep(model, config.optimizer, policy_loss(config.step), policy_head(config.step),
                     mesh=dist.model_mesh(model), keep_reference=keep_reference)
    dispatcher = CropDispatcher(config.dispatch)
    shapes = step_shapes(config, share.stop - share.start)
    rollout_config = dataclasses.replace(config.rollout, temperature=config.step.temperature,
                                         prompt_shape=shapes.prompt, subagent_shape=shapes.subagent)
    sampler_config = dataclasses.replace(config.sampler, prefill_window=shapes.prefill_window,
                                         extend_width=shapes.extend_width)
    G = config.samples_per_prompt
    # one compiled program per batch shape (run eagerly, each jnp operation compiled on its own)
    advantages_fn = jax.jit(compute_advantages, static_argnames=("cfg", "group_size"))
    unreadable = {"prompts": 0}  # prompts in a row whose videos could not be read
    episode_log = EpisodeLog(os.path.join(workdir, "episodes"), config.log_episodes, G, rows)
    # the periodic evaluation's episodes, all of them, whenever episodes are logged at all
    eval_log = EpisodeLog(os.path.join(workdir, "eval_episodes"), config.log_episodes, 1)

    def step_fn(state, index):
        t0 = time.perf_counter()
        chosen = [rows[i] for i in data_indices(index * config.prompts_per_step, config.prompts_per_step,
                                                 len(rows), config.seed)]
        episodes = [episode(r, config) for r in chosen[share]]
        sampler = Sampler(dist.local_model(step.model(state)), sampler_config)
        # rows are prompt-major: this share's rows start at share.start * G in the step's batch
        run_config = dataclasses.replace(rollout_config, seed=config.seed * 100_003 + index,
                                         row_offset=share.start * G)
        rollouts, skipped = run_rollouts(sampler, tokenizer, episodes, G, run_config, dispatcher)
        del sampler  # frees its per-layer weight copy before the update
        t1 = time.perf_counter()
        usage = getattr(judge, "usage", None)
        failures = usage.failures if usage is not None else 0
        rewards, seq_rewards, anchor_rewards = score(rollouts, config.reward, config.advantage.anchor_weight,
                                                     token_anchor, judge)
        rollouts, rewards, seq_rewards, anchor_rewards, skipped = gather_scored(
            rollouts, rewards, seq_rewards, anchor_rewards, skipped)
        t2 = time.perf_counter()
        if not rollouts:
            return state, unreadable_step(index, skipped, unreadable, config.prompts_per_step, len(rows))
        unreadable["prompts"] = 0
        packed = pack([r.inputs for r in rollouts], {"behaviour_logp": [r.logprobs for r in rollouts],
                                                     "structural_mask": [r.structural_mask for r in rollouts]},
                      width=shapes.train_width)
        behaviour = packed.extras["behaviour_logp"]
        # Micro-batches (with their vision inputs) are built once, for the reference pass and
        # the update; the advantages and proximal log-probs are filled in between.
        # token-budget micro-batches get a multiple of the batch's devices as rows (else replicated)
        plan = micro_batch_plan(packed, config.micro_batches, config.max_tokens_per_micro_batch,
                                sh.batch_devices(step.mesh), full_rows=shapes.train_width > 0)
        batches = planned_micro_batches(packed, plan, model.config.vision, {"behaviour_logp": behaviour},
                                        min_frames=shapes.train_frames)
        t_batch = time.perf_counter()
        zero = np.zeros(packed.input_ids.shape, np.float32)
        ref = (plan.merge([step.reference_logprobs(b, config.step.reference_temperature) for b in batches],
                          packed.input_ids.shape[1]) if keep_reference else zero)
        t_ref = time.perf_counter()
        advantages, adv_metrics = advantages_fn(
            seq_rewards, packed.loss_mask, behaviour, ref, cfg=config.advantage,
            group_size=G, anchor_rewards=anchor_rewards if token_anchor else None,
            structural_mask=packed.extras["structural_mask"] if token_anchor else None)
        episode_log.write(index, rollouts, rewards, np.asarray(advantages))
        advantages = plan.split(np.asarray(advantages, np.float32))
        prox = jax.block_until_ready([step.logprobs(state.params, b) for b in batches])  # PPO's "old" policy
        t_prox = time.perf_counter()
        batches = [b.with_extras(advantages=advantages[i], prox_logp=prox[i]) for i, b in enumerate(batches)]
        state, metrics = step.step(state, batches)
        t3 = time.perf_counter()
        metrics.update(summarize(rollouts, rewards))
        metrics.update({k: float(v) for k, v in adv_metrics.items()})
        tokens = int(packed.loss_mask.sum())
        metrics.update(rollout_s=t1 - t0, reward_s=t2 - t1, train_s=t3 - t2, batch_s=t_batch - t2,
                       ref_logprobs_s=t_ref - t_batch,
                       prox_logprobs_s=t_prox - t_ref, skipped_episodes=len(skipped),
                       tokens_per_s=tokens / max(t3 - t0, 1e-9), rollouts=len(rollouts),
                       padding_fraction=plan.padding_fraction())
        if usage is not None:  # judge failures this step: those answers were scored by token F1
            metrics["judge_f1_fallbacks"] = usage.failures - failures
        if config.eval_every and eval_rows and (index + 1) % config.eval_every == 0:
            from paravt_jax.rl.evaluate import evaluate_episodes

            evaluation = compiles.snapshot()  # the evaluation's own shapes: reported apart
            current = dist.local_model(step.model(state))
            held_out = eval_rows[:config.eval_limit]
            records = []
            for tools in (False, True) if dist.is_primary() else ():  # only process 0 logs
                result, evaluated = evaluate_episodes(current, tokenizer, held_out, nframes=config.eval_nframes,
                                                      tools=tools, rollout=config.rollout, dispatch=config.dispatch)
                tag = "eval_tools" if tools else "eval_notools"
                metrics.update({f"{tag}/{k}": v for k, v in result.row().items() if k not in ("tools", "nframes")})
                records += eval_records(evaluated, held_out, step=index, stage="periodic", tools=tools,
                                        nframes=config.eval_nframes)
            eval_log.write_records(index, records)
            metrics["eval_compiles"] = evaluation.since().count
        return state, metrics

    try:
        result = run_loop("rl", workdir, step.init_state(), step_fn,
                          LoopConfig(config.steps, config.checkpoint_every, max_bad_steps=config.max_bad_steps),
                          meta_fn=lambda i: {"cursor": i * config.prompts_per_step, "seed": config.seed})
    finally:
        dispatcher.close()
    return step.model(result.state), result
