"""Greedy evaluation of the policy on held-out rows, with or without tools, at a fixed K."""
from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Iterator

import numpy as np

from paravt_jax.agent.dispatch import CropDispatcher, DispatchConfig
from paravt_jax.agent.rollout import MODES, Episode, RolloutConfig, run_rollouts
from paravt_jax.config import checked, integer, integers, one_of, optional, validate
from paravt_jax.episodes import rewards as R
from paravt_jax.episodes.episode_log import eval_records
from paravt_jax.episodes.episode_stats import tool_use
from paravt_jax.eval.evaluator import Outcome


@dataclasses.dataclass(frozen=True)
class HeldOutConfig:
    """The settings of a greedy held-out evaluation (the evaluator type `held_out` of an
    evaluations section, eval/registry.py): with and without tools at every K of `nframes`,
    on the first `limit` held-out rows, in the run's episode (rl.rollout, rl.dispatch) with the
    evaluation's own budget where given (None: the rollout's). `after_sft`: the K evaluated on
    the cold start too, between SFT and RL (the main job's `evals` only)."""
    nframes: tuple[int, ...] = checked((4,), integers(1, empty=True))  # overview frames K
    after_sft: tuple[int, ...] = checked((), integers(1, empty=True))  # K evaluated on the cold start too (empty: none)
    limit: int = checked(0, integer(0))  # held-out rows: the first N (0 = all)
    max_new_tokens: int | None = checked(None, optional(integer(1)))  # per assistant turn (None: the rollout's)
    max_turns: int | None = checked(None, optional(integer(0)))  # tool rounds (None: the rollout's)
    # what a crop returns: frames | subagent | sequential (agent/rollout.py; None: the rollout's)
    mode: str | None = checked(None, optional(one_of(MODES)))
    # settings evaluated at once, each in a thread of its own on the one sampler (the outcomes
    # in order, the same as one at a time; each setting's sampler programs and KV cache held at
    # once: on an accelerator, memory for that many)
    concurrent: int = checked(1, integer(1))

    # fields that change how fast the evaluation runs, not its outcomes
    SPEED_ONLY = ("concurrent",)

    def __post_init__(self):
        validate(self)


@dataclasses.dataclass(frozen=True)
class EvalResult:
    tools: bool
    nframes: int
    accuracy: float
    format_compliance: float
    kappa: float
    calls_per_turn: float
    samples: int
    call_validity: float  # share of the policy's tool-call blocks that parsed and validated (`call_validity`)

    def row(self) -> dict:
        return dataclasses.asdict(self)


FINAL_ANSWER_TOKENS = 32  # the forced short answer after the last tool round


def episode_config(rollout: RolloutConfig, *, tools: bool, max_new_tokens: int | None = None,
                   max_turns: int | None = None, mode: str | None = None) -> RolloutConfig:
    """The held-out episode: the training rollout's (`rl.rollout`: sub-agent summary budget,
    overview frame sizes, think prefix, tool schema, ...) decoded greedily, with or without the
    tool, ending in a forced short answer; max_new_tokens / max_turns / mode (None: the
    rollout's) are the evaluation's own budget."""
    max_turns = rollout.max_turns if max_turns is None else max_turns
    return dataclasses.replace(
        rollout, temperature=0.0, max_turns=max_turns if tools else 0,
        max_new_tokens=rollout.max_new_tokens if max_new_tokens is None else max_new_tokens,
        mode=rollout.mode if mode is None else mode, prompt=dataclasses.replace(rollout.prompt, tools=tools),
        protocol=dataclasses.replace(rollout.protocol, final_answer=tools, final_answer_tokens=FINAL_ANSWER_TOKENS))


def evaluate_episodes(sampler, tokenizer, rows, *, nframes: int, tools: bool, rollout: RolloutConfig | None = None,
                      dispatch: DispatchConfig | None = None, max_new_tokens: int | None = None,
                      max_turns: int | None = None, mode: str | None = None) -> tuple[EvalResult, list]:
    """Greedy episodes of `rows` at K = nframes on `sampler` (the episode `rollout` and
    `dispatch` describe: the run's rl.rollout / rl.dispatch, None: their defaults; see
    episode_config): the scores and the rollouts behind them (for the evaluation's episode log)."""
    rollout, dispatch = rollout or RolloutConfig(), dispatch or DispatchConfig()
    episodes = [Episode(f"eval{r.index}", r.question, r.answer, r.question_type, r.video_path, nframes)
                for r in rows]
    config = episode_config(rollout, tools=tools, max_new_tokens=max_new_tokens, max_turns=max_turns, mode=mode)
    with CropDispatcher(dispatch) as dispatcher:
        rollouts, _ = run_rollouts(sampler, tokenizer, episodes, 1, config, dispatcher)
    acc = [R.accuracy_reward(R.extract_answer(r.generated_text), r.episode.answer, r.episode.question_type)
           for r in rollouts]
    use = tool_use([r.turn_texts for r in rollouts], [r.calls_per_turn for r in rollouts])
    return EvalResult(tools, nframes, float(np.mean(acc)) if acc else 0.0, use["format_compliance"],
                      use["kappa"], use["calls_per_tool_turn"], len(rollouts), call_validity(rollouts)), rollouts


def setting_name(first_nframes: int, nframes: int, tools: bool, prefix: str = "eval") -> str:
    """<prefix>_tools / <prefix>_notools for the evaluation's first K, with a _K{K} suffix for the
    others (the metric prefixes of the RL trainer's periodic evaluation, which curves and reports
    read: eval_tools/accuracy, eval_notools_K64/kappa for the entry named `eval`)."""
    tag = f"{prefix}_tools" if tools else f"{prefix}_notools"
    return tag if nframes == first_nframes else f"{tag}_K{nframes}"


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """The greedy held-out evaluation on `rows`, one setting (tools, K) after another, an
    Evaluator (eval/evaluator.py; the type `held_out` of eval/registry.py): what the main job
    runs after each phase (`settings` tools-major) and the RL trainer every `rl.eval_every` steps
    (K-major). The episode is the run's (`rollout`, `dispatch`) with the evaluation's own budget
    (episode_config); `name` prefixes its outcomes' names (setting_name)."""
    rows: tuple
    settings: tuple[tuple[bool, int], ...]
    name: str = "eval"
    rollout: RolloutConfig = RolloutConfig()
    dispatch: DispatchConfig = DispatchConfig()
    max_new_tokens: int | None = None
    max_turns: int | None = None
    mode: str | None = None
    concurrent: int = 1

    @classmethod
    def grid(cls, rows, nframes, *, tools_major: bool, **kwargs) -> HeldOut:
        """Every K of `nframes` without and with tools, tools-major (no tools at every K first)
        or K-major (each K without, then with tools)."""
        settings = ([(tools, int(k)) for tools in (False, True) for k in nframes] if tools_major
                    else [(tools, int(k)) for k in nframes for tools in (False, True)])
        return cls(tuple(rows), tuple(settings), **kwargs)

    def run(self, sampler, tokenizer, step: int | None = None) -> Iterator[Outcome]:
        """Each setting's Outcome in the order of `settings`: named by setting_name, its
        EvalResult as the result and its episodes as records (tools and K on each). With
        `concurrent` > 1 that many settings run at once, in threads (each setting's episodes are
        decoded greedily from its own programs' calls: the same outcomes as one at a time)."""
        if self.concurrent == 1 or len(self.settings) == 1:
            for tools, k in self.settings:
                yield self._setting(sampler, tokenizer, tools, k)
            return
        getattr(sampler, "weights", None)  # a Sampler's decode weights, made once before the threads share it
        with concurrent.futures.ThreadPoolExecutor(self.concurrent, thread_name_prefix="held-out") as pool:
            futures = [pool.submit(self._setting, sampler, tokenizer, *setting) for setting in self.settings]
            try:
                for future in futures:
                    yield future.result()
            finally:  # an error or an abandoned generator: the settings not started are dropped
                for future in futures:
                    future.cancel()

    def _setting(self, sampler, tokenizer, tools: bool, k: int) -> Outcome:
        result, rollouts = evaluate_episodes(sampler, tokenizer, self.rows, nframes=k, tools=tools,
                                             rollout=self.rollout, dispatch=self.dispatch,
                                             max_new_tokens=self.max_new_tokens, max_turns=self.max_turns,
                                             mode=self.mode)
        metrics = {key: value for key, value in result.row().items() if key not in ("tools", "nframes")}
        setting = {"tools": tools, "nframes": k}
        return Outcome(setting_name(self.settings[0][1], k, tools, self.name), metrics, setting, result,
                       tuple(eval_records(rollouts, self.rows, **setting)))


def call_validity(rollouts) -> float:
    """Share of the `<tool_call>` blocks in the policy's turns that parsed and passed
    validation: every block, less each parse, validation or crop error of its rollout (calls
    beyond max_parallel are not errors of the call). 1.0 when no block was written."""
    blocks = sum(text.count("<tool_call>") for r in rollouts for text in r.turn_texts)
    failed = sum(1 for r in rollouts for e in r.errors if "was not executed" not in e)
    return max(0.0, (blocks - failed) / blocks) if blocks else 1.0
