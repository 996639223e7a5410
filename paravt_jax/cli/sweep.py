"""`paravt-jax sweep`: the flags of the ablation sweep (paravt_jax/experiments/sweep.py); each arm
runs the main job (`paravt_jax.cli.jobs.run_command`) in this process, on its config built and
checked as `paravt-jax run` builds it (`run_arm`)."""
from __future__ import annotations

import functools
import sys
from collections.abc import Sequence

from absl import flags
from ml_collections import config_flags

from paravt_jax.cli.config_checks import check_config, check_data_sources
from paravt_jax.cli.flags import UsageError, define_config, parse_flags
from paravt_jax.cli.jobs import run_command
from paravt_jax.experiments import sweep


def run_arm(config, workdir: str, config_changed: str = "refuse") -> dict:
    """One arm's main job: its config (the sweep's with the arm's overrides) built into the typed
    RunConfig and checked as `paravt-jax run` checks it, then run in `workdir`."""
    run = check_config(config)
    check_data_sources(run)
    return run_command(run, workdir, config_changed=config_changed)


def main(argv: Sequence[str]) -> list[dict] | list[str]:
    """`paravt-jax sweep --config=FILE[:ARG] --workdir=DIR [--dry_run] [--shared_sft]
    [--only=REGEX] [--config_changed=ok] [--config.x=y ...]` (--config.* overrides apply to every arm)."""
    argv = list(argv)
    values = flags.FlagValues()
    define_config(values, None, argv, "config file[:arg] that defines sweep()")
    flags.DEFINE_string("workdir", "", "sweep root: one subdirectory per arm", flag_values=values)
    flags.DEFINE_bool("dry_run", False, "print one `python -m paravt_jax.cli run` command per arm",
                      flag_values=values)
    flags.DEFINE_bool("shared_sft", False, "run the SFT once (WORKDIR/_sft) and start every arm's RL "
                      "from its exported model", flag_values=values)
    flags.DEFINE_string("only", "", "run only the arms whose name matches this regular expression",
                        flag_values=values)
    flags.DEFINE_enum("config_changed", "refuse", ["refuse", "ok"], "an unfinished arm whose workdir holds "
                      "another config than the arm's: refuse (default; the arm fails) | ok (continue it under the "
                      "arm's config, as `paravt-jax run --config_changed=ok` does)", flag_values=values)
    parse_flags(values, argv, "usage: " + main.__doc__.strip().strip("`"))
    if values["config"].value is None:
        raise UsageError("sweep: --config=FILE[:ARG] is required")
    if not values.workdir:
        raise UsageError("sweep: --workdir=DIR is required")
    config_argument = config_flags.get_config_filename(values["config"])
    common = config_flags.get_override_values(values["config"])
    try:
        plan = sweep.make_plan(values.config, config_argument, values.workdir, common, values.shared_sft, values.only)
    except sweep.SweepError as e:
        raise UsageError(f"sweep: {e}") from None
    if values.dry_run:
        lines = sweep.commands(plan, values.config_changed)
        if plan.shared_sfts:
            print(f"# the first {len(plan.shared_sfts)} command(s) (shared SFT) must finish before the other "
                  f"{len(plan.arms)} start", file=sys.stderr)
        for line in lines:
            print(line, flush=True)
        return lines
    try:
        return sweep.run_plan(values.config, plan, functools.partial(run_arm, config_changed=values.config_changed))
    except sweep.SweepError as e:
        raise SystemExit(f"sweep: {e}") from None
