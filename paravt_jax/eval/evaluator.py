"""One interface for every evaluation of a policy: an `Evaluator` runs on a sampler and yields
`Outcome`s, each a named set of scalar metrics (big_vision's evaluators are the model).

Two kinds implement it: the greedy held-out evaluation on the run's own data
(`paravt_jax.eval.held_out.HeldOut`: one outcome per setting of tools and overview budget K) and
a benchmark under the reference protocol (`paravt_jax.eval.driver.BenchmarkEval`: one outcome
per benchmark, its records kept in its output directory); eval/registry.py builds them by type
from the config's evaluations sections (`rl.evals`, `evals`). The main job, the RL trainer's
periodic evaluation (a list of evaluators) and `paravt-jax eval` all call `evaluate`, which
builds one sampler for the whole list.

    for outcome in evaluate([held_out, benchmark], model, tokenizer, step=16):
        log({f"{outcome.name}/{key}": value for key, value in outcome.metrics.items()})
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from paravt_jax.sampling import Sampler, SamplerConfig

# the sampler every evaluation decodes with (greedy episodes, prompts padded to 64-token chunks)
SAMPLER = SamplerConfig(min_chunk_bucket=64)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One evaluation's result.

    name: the metrics' prefix (`eval_tools_K64`, `videomme`); metrics: scalar metrics;
    setting: what was evaluated (tools and K, or benchmark and dispatch); result: the
    evaluator's own full result (an EvalResult, a benchmark summary); records: the episodes
    as episode-log records (held-out evaluations; a benchmark keeps its records in its output
    directory)."""
    name: str
    metrics: dict
    setting: dict
    result: object = None
    records: tuple = ()


class Evaluator(Protocol):
    """Anything with `run(sampler, tokenizer, step=None)` yielding Outcomes as they finish;
    `step` names the policy version evaluated (None: a finished model)."""

    def run(self, sampler, tokenizer, step: int | None = None) -> Iterator[Outcome]: ...


def evaluate(evaluators: Sequence[Evaluator], model, tokenizer, step: int | None = None, *,
             make_sampler: Callable = Sampler, sampler_config: SamplerConfig = SAMPLER) -> Iterator[Outcome]:
    """Every evaluator's outcomes in order, all decoded by one sampler of `model`
    (`make_sampler(model, sampler_config)`; tests: a scripted one)."""
    if not evaluators:
        return
    sampler = make_sampler(model, sampler_config)
    for evaluator in evaluators:
        yield from evaluator.run(sampler, tokenizer, step)
