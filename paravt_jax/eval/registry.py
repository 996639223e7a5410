"""Evaluators chosen by type from the config, big_vision's way: an evaluations section maps names
to entries, each naming its `type` beside that type's settings, and `evaluators` builds the
Evaluators (eval/evaluator.py) of a section for one point of a run.

    c.rl.evals.eval.type = "held_out"           # every rl.eval_every RL steps: eval_tools/accuracy, ...
    c.rl.evals.eval.nframes = (16,)
    c.evals.held_out.type = "held_out"          # the main job's, after the last phase (and after SFT)
    c.evals.videomme.type = "benchmark"         # a benchmark beside it (in a config file: a new entry)

Types (TYPES, the settings' dataclass of each):
- `held_out` (held_out.HeldOutConfig -> held_out.HeldOut): greedy, with and without tools at each
  K of `nframes`, on the run's held-out rows in the run's episode. Its outcomes are named after
  the entry (`<name>_tools`, `<name>_notools_K64`: the periodic entry `eval` logs eval_tools/...).
- `benchmark` (settings.BenchmarkConfig -> driver.BenchmarkEval): one benchmark under the
  reference driver's protocol, its records under `<output_dir>/<name>` (a periodic one's in
  `step_XXXXXX/` below it); one outcome named after the benchmark.

The points of a run (STAGES): `periodic` (the RL trainer's, every `rl.eval_every` steps,
K-major), `after_sft` (the main job's cold start: a held-out entry's `after_sft` K; benchmarks do
not run there) and `final` (after the last phase, tools-major). An entry with nothing to run at a
point (no K, no held-out rows for a periodic check) builds no evaluator there.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from paravt_jax.agent.dispatch import DispatchConfig
from paravt_jax.agent.rollout import RolloutConfig
from paravt_jax.config import ConfigValueError, build_entries, entries_section
from paravt_jax.eval import driver
from paravt_jax.eval.evaluator import Evaluator
from paravt_jax.eval.held_out import HeldOut, HeldOutConfig
from paravt_jax.eval.settings import BenchmarkConfig
from paravt_jax.infra import storage

STAGES = ("periodic", "after_sft", "final")


@dataclasses.dataclass(frozen=True)
class Context:
    """What a run's evaluators are built from beside their settings: the held-out rows and the
    run's episode (rl.rollout, rl.dispatch) for held-out entries; for benchmarks, the directory
    their records go under (one folder per entry), the built-in data (the synthetic benchmark's
    default), the model's identity and the run's manifest (they key and describe the records)."""
    rows: tuple = ()
    rollout: RolloutConfig = RolloutConfig()
    dispatch: DispatchConfig = DispatchConfig()
    output_dir: str = ""
    data_dir: str = ""
    identity: Mapping = dataclasses.field(default_factory=dict)
    manifest: Mapping = dataclasses.field(default_factory=dict)


def held_out(name: str, settings: HeldOutConfig, context: Context, stage: str) -> HeldOut | None:
    """The held-out entry `name` at `stage`: its `after_sft` K on the cold start, else its
    `nframes`; K-major during RL, tools-major after a phase (the tables' order)."""
    nframes = settings.after_sft if stage == "after_sft" else settings.nframes
    if not nframes or (stage == "periodic" and not context.rows):
        return None
    rows = context.rows[:settings.limit] if settings.limit else context.rows
    return HeldOut.grid(rows, nframes, tools_major=stage != "periodic", name=name, rollout=context.rollout,
                        dispatch=context.dispatch, max_new_tokens=settings.max_new_tokens,
                        max_turns=settings.max_turns, mode=settings.mode, concurrent=settings.concurrent)


def benchmark_eval(settings: BenchmarkConfig, output_dir: str, context: Context, where: str = "",
                   **options) -> driver.BenchmarkEval:
    """The benchmark `settings` names, loaded and checked for missing videos (driver.MissingVideos),
    evaluated into `output_dir` (`options`: BenchmarkEval's shard_id, num_shards)."""
    loaded = driver.load_benchmark(settings, context.data_dir, where)
    driver.check_missing_videos(loaded, settings.max_missing_videos)
    return driver.BenchmarkEval(loaded, settings.protocol(), output_dir, dict(context.identity),
                                manifest=dict(context.manifest), **options)


def benchmark(name: str, settings: BenchmarkConfig, context: Context, stage: str) -> driver.BenchmarkEval | None:
    """The benchmark entry `name` (none on the cold start), its records in `<output_dir>/<name>`."""
    if stage == "after_sft":
        return None
    if not context.output_dir:
        raise ConfigValueError(f"the benchmark evaluation {name!r} needs an output directory (a workdir)")
    return benchmark_eval(settings, storage.join(context.output_dir, name), context, f"the entry {name!r}")


# type name -> (its settings' dataclass, its builder(name, settings, context, stage))
REGISTRY: dict[str, tuple[type, Callable]] = {
    "held_out": (HeldOutConfig, held_out),
    "benchmark": (BenchmarkConfig, benchmark),
}
TYPES: dict[str, type] = {name: cls for name, (cls, _) in REGISTRY.items()}


def evaluators(entries: Mapping[str, object], context: Context, stage: str) -> list[Evaluator]:
    """The evaluators of `entries` (name -> settings of a registered type) at `stage`, in the
    entries' order."""
    if stage not in STAGES:
        raise ValueError(f"stage {stage!r}: expected one of {STAGES}")
    builders = {cls: make for cls, make in REGISTRY.values()}
    built = [builders[type(settings)](name, settings, context, stage) for name, settings in entries.items()]
    return [evaluator for evaluator in built if evaluator is not None]


def section(entries: Mapping[str, object]):
    """The config section of `entries` (name -> settings): each name's `type` beside its fields."""
    return entries_section(dict(entries), TYPES)


def build(config, where: str) -> dict:
    """The entries of the evaluations section `config` (config.build_entries: a bad type or field
    is a ConfigValueError naming its dotted path under `where`)."""
    return build_entries(TYPES, config, where)


# The main job's evaluation (the `evals` section of configs/paragrpo.py): the held-out table
# with and without tools at K = 4 and 64 after the last phase, on 4 rows, in frames mode.
MAIN_JOB = {"held_out": HeldOutConfig(nframes=(4, 64), limit=4, max_new_tokens=256, max_turns=2, mode="frames")}
# The RL trainer's periodic check (RLConfig.evals' default): K = 16 on the first 2 rows, in the
# rollout's own budget, logged as eval_tools/... and eval_notools/...
PERIODIC = {"eval": HeldOutConfig(nframes=(16,), limit=2)}
