"""`paravt-jax eval`: the flags of the benchmark driver (paravt_jax/eval/driver.py), and the
command: the benchmarks loaded and checked as evaluators of type `benchmark` (eval/registry.py),
the model built, every benchmark through `evaluate` on one sampler."""
from __future__ import annotations

import os

from absl import flags, logging

from paravt_jax.cli.assembly import build_model
from paravt_jax.cli.config_checks import check_config
from paravt_jax.cli.flags import define_config, parse_flags
from paravt_jax.config import config_path
from paravt_jax.eval import driver, provenance, registry
from paravt_jax.eval import records as store
from paravt_jax.eval.evaluator import evaluate
from paravt_jax.eval.settings import DISPATCH
from paravt_jax.infra import reproducibility, storage
from paravt_jax.run_config import RunConfig, builtin_assets
from paravt_jax.text.inputs import check_against_model
from paravt_jax.text.tokenizer import Tokenizer


def main(argv: list[str]) -> dict:
    default = config_path("eval")
    flag_values = flags.FlagValues()
    define_config(flag_values, default + ":synthetic", argv)
    flags.DEFINE_string("output_dir", "", "where per-dataset JSON and summary_all.json go",
                        flag_values=flag_values)
    flags.DEFINE_integer("shard_id", 0, "this host's shard", flag_values=flag_values)
    flags.DEFINE_integer("num_shards", 1, "shards across hosts", flag_values=flag_values)
    flags.DEFINE_integer("limit", 0, "samples per dataset (0 = all)", lower_bound=0, flag_values=flag_values)
    flags.DEFINE_bool("compare", False, "parallel vs sequential dispatch side by side", flag_values=flag_values)
    flags.DEFINE_bool("overwrite", False, "drop records another checkpoint or other settings left in --output_dir "
                      "(without it such a directory is refused)", flag_values=flag_values)
    parse_flags(flag_values, argv, "usage: paravt-jax eval [--config=FILE[:ARG]] [--config.FIELD=VALUE ...] "
                "[--output_dir=DIR] [--limit=N] [--compare] [--overwrite] [--shard_id=I --num_shards=N]\n\n"
                "The benchmark driver: per-dataset JSON (resumable) and summary_all.json in --output_dir.",
                show_config=True)
    run = check_config(flag_values.config)
    driver.dataset_names(run)
    output_dir = flag_values.output_dir or run.output_dir or os.path.join("runs", "eval")
    return evaluate_command(run, output_dir, shard_id=flag_values.shard_id, num_shards=flag_values.num_shards,
                            limit=flag_values.limit, compare=flag_values.compare, overwrite=flag_values.overwrite)


def evaluate_command(run: RunConfig, output_dir: str, *, shard_id: int = 0, num_shards: int = 1, limit: int = 0,
                     compare: bool = False, overwrite: bool = False) -> dict:
    """Evaluates the run's datasets into output_dir (paravt_jax/eval/driver.py's docstring): one
    evaluator of type `benchmark` (eval/registry.py) per dataset and dispatch arm, all run by
    `evaluate` on one sampler. Refused before the model is built: a benchmark with too many
    missing videos (driver.MissingVideos), and an output directory holding another model's or
    other settings' records (store.ForeignRecords; `overwrite` drops them instead)."""
    assets = builtin_assets(run)
    context = registry.Context(data_dir=assets.data_dir, identity=provenance.model_identity(run, assets.model_dir),
                               manifest=reproducibility.manifest(seed=int(run.seed),
                                                                 data=assets.identity()))
    arms = DISPATCH if compare else (run.driver.dispatch,)
    evaluators = [registry.benchmark_eval(driver.benchmark_settings(run, name, limit, dispatch=dispatch),
                                          storage.join(output_dir, dispatch) if compare else output_dir, context,
                                          f"config.benchmarks.{name}, config.root={run.root!r}",
                                          shard_id=shard_id, num_shards=num_shards)
                  for name in driver.dataset_names(run) for dispatch in arms]
    for evaluator in evaluators:  # every directory checked before the model is loaded
        storage.makedirs(evaluator.output_dir)
        store.claim_output(evaluator.output_dir, evaluator.benchmark.name,
                           provenance.producer(evaluator.identity, evaluator.config), overwrite, logging.info)
    model = build_model(run, default_dir=assets.model_dir)
    tokenizer = Tokenizer.from_directory(run.model.checkpoint or assets.model_dir)
    check_against_model(tokenizer, model.config)
    # --compare: each arm's shapes compiled (a batch per question type) before the timed runs
    warm = [driver.WarmUp(tuple(evaluators))] if compare else []
    summaries: dict[str, dict] = {}
    comparison: dict[str, dict[str, dict]] = {}
    for outcome in evaluate(warm + evaluators, model, tokenizer):  # one sampler for every benchmark and arm
        name, dispatch = outcome.setting["dataset"], outcome.setting["dispatch"]
        comparison.setdefault(name, {})[dispatch] = outcome.result
        summaries[f"{name}/{dispatch}" if compare else name] = outcome.result
    table = driver.comparison_table(comparison)
    print(table, flush=True)
    if compare:
        storage.write_json_atomic(storage.join(output_dir, "compare.json"), comparison)
        storage.write_atomic(storage.join(output_dir, "compare.md"), table + "\n")
    return summaries
