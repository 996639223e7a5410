"""PARA-GRPO training: each step samples B prompts (deterministic order), draws K per prompt
(nFrames gating), runs G rollouts per prompt, scores them, computes reference log-probs and
advantages, runs the train step and logs."""
from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from paravt_jax.agent.dispatch import CropDispatcher, DispatchConfig
from paravt_jax.agent.rollout import Episode, RolloutConfig, run_rollouts
from paravt_jax.config import checked, entries, integer, integer_between, integers, refuse, set_by, validate
from paravt_jax.config import share as share_rule
from paravt_jax.data import gating
from paravt_jax.episodes.episode_log import MAX_LOGGED, EpisodeLog
from paravt_jax.episodes.episode_stats import summarize
from paravt_jax.episodes.rewards import RewardConfig, make_judge, score
from paravt_jax.eval import registry
from paravt_jax.eval.evaluator import Evaluator, evaluate
from paravt_jax.infra import distributed as dist
from paravt_jax.infra import sharding as sh
from paravt_jax.rl.advantages import AdvantageConfig, compute_advantages
from paravt_jax.rl.objective import StepConfig, policy_head, policy_loss
from paravt_jax.rl.pipeline import Policy
from paravt_jax.rl.schedules import schedule_for
from paravt_jax.rl.shapes import ShapeConfig, StepShapes, step_shapes
from paravt_jax.sampling import Sampler, SamplerConfig
from paravt_jax.train import compiles
from paravt_jax.train.batch import (
    MicroBatchPlan,
    Packed,
    SharedPrompts,
    TrainBatch,
    micro_batch_plan,
    pack,
    planned_micro_batches,
    share_prompts,
)
from paravt_jax.train.loop import LoopConfig, data_indices, run_loop
from paravt_jax.train.step import OptimizerConfig, TrainStep


@dataclasses.dataclass(frozen=True)
class RLConfig:
    steps: int = checked(4, integer(0))
    prompts_per_step: int = checked(2, integer(1))
    samples_per_prompt: int = checked(4, integer(1))
    micro_batches: int = checked(1, integer(1))  # must divide the step's prompts_per_step x samples_per_prompt rows
    # > 0: micro-batches of at most this many tokens, short episodes packed into shared rows
    # (segment ids, each episode its own positions), a long one alone in its row;
    # micro_batches is then unused
    max_tokens_per_micro_batch: int = checked(0, integer(0))
    # micro-batch passes run at once on host threads (TrainStep's `concurrent`): the same bits,
    # faster on a CPU whose cores one small program leaves idle; 1 on accelerators (one program
    # at a time there) and required with several devices or processes
    concurrent_micro_batches: int = checked(1, integer(1))
    # True: the samples of a prompt share its tokens in the packed rows (train/batch.py
    # SharedPrompts: the prompt stored once, each sample's rest attending to it; the same
    # attention, positions and loss, the prompt's tokens and frames computed once per group
    # instead of once per sample); needs max_tokens_per_micro_batch > 0
    share_prompts: bool = False
    seed: int = set_by(0, "seed (the top of the config)")
    nframes_gating: bool = True
    # K with gating off; 0 = the overview sampled at rollout.prompt.overview_fps, at most
    # rollout.prompt.overview_max_frames frames (the reference recipe: 1 fps, 64 frames)
    default_nframes: int = checked(0, integer(0))
    nframes_choices: tuple[int, ...] = checked(gating.NFRAMES_CHOICES, integers(1))
    # the share of prompts posed without the tools (the tool-free prompt the evaluation's
    # "without tools" rows use; a call there ends the episode and earns no tool or format
    # tool term), drawn per prompt and step; 0 = the reference (every prompt offers them)
    tool_free_share: float = checked(0.0, share_rule())
    rollout: RolloutConfig = RolloutConfig()
    dispatch: DispatchConfig = DispatchConfig()
    reward: RewardConfig = RewardConfig()
    advantage: AdvantageConfig = AdvantageConfig()
    step: StepConfig = StepConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    sampler: SamplerConfig = SamplerConfig(min_chunk_bucket=64)
    checkpoint_every: int = checked(0, integer(0))
    max_bad_steps: int = checked(3, integer(1))
    shapes: ShapeConfig = ShapeConfig()  # the compiled programs' shapes (rl/shapes.py)
    # compile the first step's programs before it runs (RLStep.precompile), so that its time
    # is that of any other step; the compiles and seconds are logged as precompiles / precompile_s
    precompile: bool = False
    # asynchronous rollouts (rl/pipeline.py): step j's episodes may be sampled by the policy of
    # up to this many updates before j while the trainer updates on earlier steps' (the
    # reference's max_head_offpolicyness is 2); 0 = synchronous. With mesh.rollout_devices the
    # sampling runs on devices of its own; colocated, it shares the trainer's.
    max_staleness: int = checked(0, integer(0))
    eval_every: int = checked(0, integer(0))  # the evaluations of `evals` every N steps (0 = off)
    # the periodic evaluations by name, each with its `type` (eval/registry.py): by default the
    # held-out check `eval` at K = 16 on 2 rows, logged as eval_tools/... and eval_notools/...
    # (what the curves and the sweep report read), each further K as eval_tools_K{K}/...
    evals: dict = entries(registry.PERIODIC, registry.TYPES)
    # sampled episodes logged per step to <workdir>/episodes/step_XXXXXX.jsonl (0 = none;
    # paravt_jax/episodes/episode_log.py, `paravt-jax view`)
    log_episodes: int = checked(0, integer_between(0, MAX_LOGGED))

    def __post_init__(self):
        validate(self)
        for name, settings in self.evals.items():
            if getattr(settings, "after_sft", ()):
                raise refuse(f"evals.{name}.after_sft", settings.after_sft, "the periodic evaluation has no cold "
                             "start; the main job's is evals.<name>.after_sft (the top-level evals section)")
        if self.share_prompts and not self.max_tokens_per_micro_batch:
            raise refuse("share_prompts", self.share_prompts,
                         "shares a prompt within packed rows: set max_tokens_per_micro_batch > 0")
        rows = self.prompts_per_step * self.samples_per_prompt
        if rows % self.micro_batches:
            raise refuse("micro_batches", self.micro_batches,
                         f"must divide the {rows} rows of a step (prompts_per_step x samples_per_prompt)")


def periodic_evaluators(config: RLConfig, eval_rows, *, output_dir: str = "", data_dir: str = "") -> list:
    """The periodic evaluations of `rl.evals` (eval/registry.py, stage "periodic"): a held-out
    entry on the first `limit` rows of `eval_rows`, K-major, its metrics named after the entry
    (`eval`: eval_tools/..., eval_notools/... for its first K, eval_tools_K{K}/... for the
    others); a benchmark entry's records under `output_dir/<name>/step_XXXXXX` (`data_dir`: the
    built-in data). None when `eval_every` is 0."""
    if not config.eval_every:
        return []
    # the rollouts' fixed prompt and sub-agent shapes (with RLStep.evaluate's sampler config):
    # the first evaluation compiles its programs, the later ones none
    shapes = step_shapes(config, config.prompts_per_step)
    rollout = dataclasses.replace(config.rollout, prompt_shape=shapes.prompt, subagent_shape=shapes.subagent)
    context = registry.Context(tuple(eval_rows or ()), rollout, config.dispatch, output_dir, data_dir)
    return registry.evaluators(config.evals, context, "periodic")


def episode(row, config: RLConfig, step: int = 0) -> Episode:
    """One RL row's episode at step `step`. K is drawn per video, as the reference keys it on
    the row's video paths (every question on a video sees the same overview), with a stable
    hash of the path as the table names it (the same draws wherever the data is checked out);
    whether the prompt offers the tools (rl.tool_free_share) per row and step."""
    key = row.video_key or row.video_path
    k = gating.nframes_for_prompt(key, config.seed, config.nframes_gating, config.default_nframes,
                                  config.nframes_choices)
    tools = not gating.tool_free_prompt(f"{key}\x1frow{row.index}\x1fstep{step}", config.seed,
                                        config.tool_free_share)
    return Episode(f"row{row.index}", row.question, row.answer, row.question_type, row.video_path, k,
                   system_prompt=row.system_prompt, tools=tools)


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


# one compiled program per batch shape (run eagerly, each jnp operation compiled on its own)
ADVANTAGES = jax.jit(compute_advantages, static_argnames=("cfg", "group_size"))
# a copy of the parameters in new buffers (one program, compiled once)
COPY = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))


@dataclasses.dataclass
class Scored:
    """The rollouts of one step (every process's, in row order) with their rewards."""
    rollouts: list
    rewards: list[dict]  # per rollout: the total and every part
    seq_rewards: np.ndarray  # [N] the sequence reward the advantages normalise
    anchor_rewards: np.ndarray  # [N] the token anchor's reward (zeros without it)
    skipped: list[str]  # episodes whose video could not be read
    judge_fallbacks: int | None  # answers the LLM judge failed on (scored by F1); None: no judge


@dataclasses.dataclass
class StepBatch:
    """The step's training data: the packed episodes, their micro-batch plan and the
    micro-batches (vision inputs included), built once for every pass over them. `packed`:
    the episodes whole, the layout the advantages are computed in; `laid`: the sequences the
    micro-batches hold, `packed` itself or, with rl.share_prompts, the `shared` layout's."""
    packed: Packed
    plan: MicroBatchPlan
    batches: list[TrainBatch]
    laid: Packed
    shared: SharedPrompts | None = None

    def to_batches(self, array: np.ndarray) -> list[np.ndarray]:
        """A per-token [N, T] array of the episodes -> one [rows, width] array per micro-batch."""
        if self.shared is not None:
            array = self.shared.derive(array, self.laid.input_ids.shape[1])
        return self.plan.split(array)

    def from_batches(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        """The inverse of `to_batches`: per-micro-batch arrays -> [N, T] of the episodes."""
        laid = self.plan.merge(parts, self.laid.input_ids.shape[1])
        return laid if self.shared is None else self.shared.restore(laid, self.packed.input_ids.shape[1])


@dataclasses.dataclass
class RLStep:
    """One PARA-GRPO step in named phases, each a method: collect (rollouts of the step's
    prompts, `prompt_rows`, from the current weights) -> score (rewards, gathered over
    processes) -> learn: batch (packed micro-batches) -> advantages (reference log-probs,
    group-normalised advantages) -> update (one optimizer step). It owns the prompt order (which
    rows a step takes, what a checkpoint records of it); rl/schedules.py runs the phases. What
    does not change between steps (the train step, the sampler's and rollout's settings, the
    fixed shapes, the judge) is built once by `build`."""
    config: RLConfig
    tokenizer: object
    rows: list
    step: TrainStep
    dispatcher: CropDispatcher
    shapes: StepShapes
    rollout_config: RolloutConfig
    sampler_config: SamplerConfig
    share: slice  # this process's prompts of a step
    judge: object
    episode_log: EpisodeLog  # sampled training episodes
    eval_log: EpisodeLog  # every episode of the periodic evaluation, when episodes are logged
    vision: object  # the model's vision config (the micro-batches' vision layout)
    # (model, SamplerConfig) -> the sampler of a step's rollouts (tests: a scripted one)
    make_sampler: Callable = Sampler
    rollout_mesh: object = None  # the devices that sample (None: the trainer's)

    @staticmethod
    def build(model, tokenizer, rows: list, workdir: str, config: RLConfig, judge=None,
              make_sampler: Callable = Sampler, rollout_mesh=None) -> RLStep:
        share = dist.process_slice(config.prompts_per_step, "prompts_per_step")
        judge = judge if judge is not None else make_judge(config.reward)  # fails now, not at the first score
        step = TrainStep(model, config.optimizer, policy_loss(config.step), policy_head(config.step),
                         mesh=dist.model_mesh(model), keep_reference=config.advantage.kl_ctl > 0,
                         concurrent=config.concurrent_micro_batches)
        shapes = step_shapes(config, share.stop - share.start)
        rollout_config = dataclasses.replace(config.rollout, temperature=config.step.temperature,
                                             prompt_shape=shapes.prompt, subagent_shape=shapes.subagent)
        sampler_config = dataclasses.replace(config.sampler, prefill_window=shapes.prefill_window,
                                             extend_width=shapes.extend_width)
        episode_log = EpisodeLog(os.path.join(workdir, "episodes"), config.log_episodes,
                                 config.samples_per_prompt, rows)
        eval_log = EpisodeLog(os.path.join(workdir, "eval_episodes"), config.log_episodes, 1)
        return RLStep(config, tokenizer, rows, step, CropDispatcher(config.dispatch), shapes, rollout_config,
                      sampler_config, share, judge, episode_log, eval_log, model.config.vision, make_sampler,
                      rollout_mesh)

    def policy(self, state, version: int) -> Policy:
        """The weights in `state` as the rollout side samples them: a copy on this process's
        rollout mesh, laid out by its rules (device to device), or, colocated, a copy on the
        trainer's devices (the update donates `state`'s buffers while the producer may still
        sample). Collective in a multi-process run: the trainer's thread calls it."""
        if self.rollout_mesh is None:
            params = COPY(state.params)
            return Policy(version, dist.local_model(nnx.merge(self.step.graphdef, params, self.step.rest)))
        shardings, rest = self._rollout_layout
        params = jax.device_put(dist.to_local(state.params), shardings)
        return Policy(version, nnx.merge(self.step.graphdef, jax.block_until_ready(params), rest))

    @functools.cached_property
    def _rollout_layout(self):
        """(the parameters' shardings on the rollout mesh, the model's other state placed there):
        what every publish reuses (the non-parameter state never changes)."""
        shardings = sh.param_shardings(self.step.params, self.rollout_mesh)
        rest = jax.device_put(dist.to_local(self.step.rest), NamedSharding(self.rollout_mesh, PartitionSpec()))
        return shardings, rest

    def collect(self, state, index: int) -> tuple[list, list[str]]:
        """This process's rollouts of step `index` from the weights in `state` (and the episodes
        skipped for an unreadable video)."""
        return self.collect_with(dist.local_model(self.step.model(state)), index)

    def prompt_rows(self, index: int) -> list:
        """The rows of step `index` (every process's): prompts_per_step of them from position
        index x prompts_per_step of a seeded per-epoch order (a fresh permutation of the rows
        each epoch), so that a resumed run takes the same ones."""
        config = self.config
        order = data_indices(self.cursor(index), config.prompts_per_step, len(self.rows), config.seed)
        return [self.rows[i] for i in order]

    def cursor(self, index: int) -> int:
        """The position in the prompt order where step `index` starts."""
        return index * self.config.prompts_per_step

    def position(self, index: int) -> dict:
        """What a checkpoint taken before step `index` records of the prompt order."""
        return {"cursor": self.cursor(index), "seed": self.config.seed}

    def episodes(self, index: int) -> list[Episode]:
        """This process's episodes of step `index` (its share of the step's prompts)."""
        return [episode(r, self.config, index) for r in self.prompt_rows(index)[self.share]]

    def collect_with(self, model, index: int) -> tuple[list, list[str]]:
        """This process's rollouts of step `index` sampled by `model` (on this process's devices)."""
        config, G = self.config, self.config.samples_per_prompt
        sampler = self.make_sampler(model, self.sampler_config)
        # rows are prompt-major: this share's rows start at share.start * G in the step's batch
        run_config = dataclasses.replace(self.rollout_config, seed=config.seed * 100_003 + index,
                                         row_offset=self.share.start * G)
        return run_rollouts(sampler, self.tokenizer, self.episodes(index), G, run_config, self.dispatcher)

    def score(self, rollouts: list, skipped: list[str]) -> Scored:
        """This process's rollouts scored (`gather` then joins every process's)."""
        usage = getattr(self.judge, "usage", None)
        failures = usage.failures if usage is not None else 0
        advantage = self.config.advantage
        rewards, seq_rewards, anchor_rewards = score(rollouts, self.config.reward, advantage.anchor_weight,
                                                     advantage.token_anchor, self.judge)
        return Scored(rollouts, rewards, seq_rewards, anchor_rewards, skipped,
                      judge_fallbacks=None if usage is None else usage.failures - failures)

    @staticmethod
    def gather(scored: Scored) -> Scored:
        """Every process's scored rollouts, in the step's row order (collective)."""
        parts = gather_scored(scored.rollouts, scored.rewards, scored.seq_rewards, scored.anchor_rewards,
                              scored.skipped)
        return Scored(*parts, judge_fallbacks=scored.judge_fallbacks)

    def batch(self, scored: Scored) -> StepBatch:
        """Micro-batches (with their vision inputs) built once, for the reference pass and the
        update; the advantages are filled in between. Token-budget micro-batches get a multiple
        of the batch's devices as rows (else replicated)."""
        config, shapes = self.config, self.shapes
        rollouts = scored.rollouts
        behaviour = [r.logprobs for r in rollouts]
        packed = pack([r.inputs for r in rollouts], {"behaviour_logp": behaviour,
                                                     "structural_mask": [r.structural_mask for r in rollouts]},
                      width=shapes.train_width)
        shared, laid = None, packed
        if config.share_prompts:
            shared = share_prompts([r.inputs for r in rollouts], max_length=packed.input_ids.shape[1])
            # the whole episodes' width: a group laid out fits it (share_prompts' max_length)
            laid = pack(shared.sequences, {"behaviour_logp": shared.pieces(behaviour)}, width=packed.input_ids.shape[1])
        plan = micro_batch_plan(laid, config.micro_batches, config.max_tokens_per_micro_batch,
                                sh.batch_devices(self.step.mesh), full_rows=shapes.train_width > 0, shared=shared)
        batches = planned_micro_batches(laid, plan, self.vision,
                                        {"behaviour_logp": laid.extras["behaviour_logp"]},
                                        min_frames=shapes.train_frames, vision_shards=sh.batch_devices(self.step.mesh))
        return StepBatch(packed, plan, batches, laid, shared)

    def reference_logprobs(self, data: StepBatch) -> np.ndarray:
        """[N, T] the frozen reference policy's log-probs (zeros without the KL term)."""
        if self.step.reference_params is None:
            return np.zeros(data.packed.input_ids.shape, np.float32)
        logprobs = self.step.logprobs_many(self.step.reference_params, data.batches,
                                           self.config.step.reference_temperature)
        return data.from_batches(logprobs)

    def advantages(self, scored: Scored, data: StepBatch, reference: np.ndarray) -> tuple[np.ndarray, dict]:
        """[N, T] per-token advantages (the KL penalty, the group-normalised sequence reward and
        the token anchor at the structural tokens) and their metrics."""
        advantage = self.config.advantage
        packed = data.packed
        values, metrics = ADVANTAGES(
            scored.seq_rewards, packed.loss_mask, packed.extras["behaviour_logp"], reference, cfg=advantage,
            group_size=self.config.samples_per_prompt,
            anchor_rewards=scored.anchor_rewards if advantage.token_anchor else None,
            structural_mask=packed.extras["structural_mask"] if advantage.token_anchor else None)
        return np.asarray(values, np.float32), {k: float(v) for k, v in metrics.items()}

    def update_batches(self, state, data: StepBatch, advantages: np.ndarray) -> tuple[list, float]:
        """The micro-batches with their advantages (and, under prox_logprobs="recompute", PPO's
        "old" log-probs from a pass of their own) and the seconds of that pass."""
        split = data.to_batches(advantages)
        batches = [b.with_extras(advantages=split[i]) for i, b in enumerate(data.batches)]
        start = time.perf_counter()
        if self.config.step.prox_logprobs == "recompute":
            prox = jax.block_until_ready(self.step.logprobs_many(state.params, batches))
            batches = [b.with_extras(prox_logp=prox[i]) for i, b in enumerate(batches)]
        return batches, time.perf_counter() - start

    def update(self, state, data: StepBatch, advantages: np.ndarray):
        """One optimizer step over the micro-batches; returns (state, its metrics, the seconds of
        the separate proximal pass under prox_logprobs="recompute")."""
        batches, prox_s = self.update_batches(state, data, advantages)
        state, metrics = self.step.step(state, batches)
        return state, metrics, prox_s

    def learn(self, state, index: int, scored: Scored, timings: dict) -> tuple[object, dict]:
        """The rest of step `index` once its episodes are scored (every process's): batch,
        reference log-probs, advantages, the episode log, the update; its metrics with the
        episodes' and the advantages', `timings` (the rollout side's) and this side's seconds."""
        t2 = time.perf_counter()
        data = self.batch(scored)
        t_batch = time.perf_counter()
        reference = self.reference_logprobs(data)
        t_ref = time.perf_counter()
        advantages, adv_metrics = self.advantages(scored, data, reference)
        self.episode_log.write(index, scored.rollouts, scored.rewards, advantages)
        state, metrics, prox_s = self.update(state, data, advantages)
        t3 = time.perf_counter()
        metrics.update(summarize(scored.rollouts, scored.rewards))
        metrics.update(adv_metrics)
        metrics.update(timings, train_s=t3 - t2, batch_s=t_batch - t2, ref_logprobs_s=t_ref - t_batch,
                       prox_logprobs_s=prox_s, skipped_episodes=len(scored.skipped),
                       rollouts=len(scored.rollouts), padding_fraction=data.plan.padding_fraction())
        if data.shared is not None:  # prompt tokens the shared layout did not compute again
            metrics["shared_prompt_tokens"] = data.shared.shared_tokens
        metrics["tokens"] = int(data.packed.loss_mask.sum())
        if scored.judge_fallbacks is not None:  # judge failures this step: those answers were scored by F1
            metrics["judge_f1_fallbacks"] = scored.judge_fallbacks
        return state, metrics

    def precompile(self, state, index: int, model=None) -> None:
        """Compiles the programs of step `index` before it runs (`rl.precompile`): its rollouts
        are decoded and dropped, the reference (and proximal) log-prob passes and the gradients
        run over its micro-batches with zero rewards, and the update is compiled ahead of time
        (TrainStep.compile_step): nothing is scored, logged, written or applied, and the step
        itself then runs on compiled programs with the same results. `model`: the weights that
        sample (default: `state`'s; a split run's on the rollout mesh)."""
        rollouts, skipped = self.collect(state, index) if model is None else self.collect_with(model, index)
        zeros = np.zeros(len(rollouts), np.float32)
        scored = Scored(*gather_scored(rollouts, [{} for _ in rollouts], zeros, zeros, skipped), judge_fallbacks=None)
        if not scored.rollouts:
            return
        data = self.batch(scored)
        advantages, _ = self.advantages(scored, data, self.reference_logprobs(data))
        batches, _ = self.update_batches(state, data, advantages)
        self.step.compile_step(state, batches)

    def evaluate(self, state, evaluators: Sequence[Evaluator], index: int) -> dict:
        """The periodic evaluation after step `index` (process 0 runs the evaluators), its
        compiles apart; each outcome's metrics as `<name>/<metric>`, and every held-out episode
        it ran to the eval log (stage "periodic")."""
        metrics, records = {}, []
        evaluation = compiles.snapshot()  # the evaluation's own shapes: reported apart
        current = dist.local_model(self.step.model(state))
        for outcome in evaluate(evaluators if dist.is_primary() else (), current, self.tokenizer, index,
                                make_sampler=self.make_sampler, sampler_config=self.sampler_config):
            metrics.update({f"{outcome.name}/{key}": value for key, value in outcome.metrics.items()})
            records += [{"step": index, "stage": "periodic", **record} for record in outcome.records]
        self.eval_log.write_records(index, records)
        metrics["eval_compiles"] = evaluation.since().count
        return metrics


def train_rl(model, tokenizer, rows: list, workdir: str, config: RLConfig, judge=None,
             evaluators: Sequence[Evaluator] = (), rollout_mesh=None, make_sampler: Callable = Sampler):
    """rows: RLRow list; evaluators: what runs every `eval_every` steps (periodic_evaluators:
    the held-out check of `rl.eval_*`; eval/evaluator.py); rollout_mesh: the devices that
    sample, apart from the trainer's (assembly.build_rollout_mesh; None: colocated). Returns
    (model with trained weights, LoopResult).

    The loop (train/loop.py) runs an `RLStep`'s phases by a schedule (rl/schedules.py):
    synchronous (rl.max_staleness = 0, colocated), each step sampling from the current weights
    then training; otherwise asynchronous, a producer thread sampling ahead (rl/pipeline.py)
    from weights the trainer publishes after each update, at most max_staleness versions old
    when trained on.

    Multi-process: each process rolls out and scores its contiguous share of the step's prompts
    on its own devices; the scored rollouts are gathered so that every process builds the same
    global batch, and the update runs over all devices (see paravt_jax.infra.distributed)."""
    phases = RLStep.build(model, tokenizer, rows, workdir, config, judge, make_sampler, rollout_mesh)
    schedule = schedule_for(phases, evaluators, rollout_mesh)
    try:
        result = run_loop("rl", workdir, phases.step.init_state(), schedule.step,
                          LoopConfig(config.steps, config.checkpoint_every, max_bad_steps=config.max_bad_steps),
                          meta_fn=phases.position, prepare_fn=schedule.prepare if config.precompile else None)
    finally:
        schedule.close()
        phases.dispatcher.close()
    return phases.step.model(result.state), result
