"""`paravt-jax <command> --config=FILE[:ARG] [--config.field=value ...]`.

Commands: run (default: the main job: cold-start SFT, PARA-GRPO, evaluation), sft, train
(RL only), export (latest checkpoint -> HF safetensors), generate (one greedy episode),
forward (one timed forward pass on a synthetic video prompt); with their own flags: eval
(benchmark driver, paravt_jax/eval/driver.py), plan (memory planner), sweep and report
(ablations), view (the episode viewer). This module parses the command line and dispatches,
importing only the module of the command it runs: the main job's commands are in
paravt_jax/cli/jobs.py, the others' flags in paravt_jax/cli/<command>.py.
"""
from __future__ import annotations

import importlib
import sys

from absl import flags

from paravt_jax.cli.config_checks import check_config, check_data_sources
from paravt_jax.cli.flags import EXIT_OK, EXIT_USAGE, HELP_FLAGS, HelpShown, UsageError, define_config, parse_flags
from paravt_jax.config import ConfigValueError, config_path
from paravt_jax.infra import compile_cache, distributed, preemption

JOBS = "paravt_jax.cli.jobs"
COMMANDS = {"forward": "forward_command", "run": "run_command", "sft": "sft_command", "train": "train_command",
            "export": "export_command", "generate": "generate_command"}  # functions of JOBS
TAKES_WORKDIR = {"run", "sft", "train", "export"}
CLAIMS_WORKDIR = {"run", "sft", "train"}  # one run per workdir, under one config (paravt_jax/cli/workdirs.py)
# Commands with their own flags: `paravt_jax.cli.<command>.main(argv)` gets argv with the
# command word removed (argv[0] is the program name).
MODULE_COMMANDS = ("plan", "sweep", "report", "eval", "view")


SUMMARIES = {  # one line per command, for `paravt-jax --help`
    "run": "(default) the main job: cold-start SFT, PARA-GRPO, final model, held-out evaluation",
    "sft": "cold-start SFT only (checkpoints and metrics in --workdir)",
    "train": "PARA-GRPO (RL) only (checkpoints and metrics in --workdir)",
    "export": "the latest checkpoint under --workdir (rl/, else sft/) -> an HF checkpoint in WORKDIR/export",
    "generate": "one greedy episode of the policy on config.generate's question and video",
    "forward": "one timed forward pass on a synthetic video prompt",
    "eval": "the benchmark driver (VideoMME, LongVideoBench, ... or the synthetic set)",
    "plan": "memory planner: parameters, optimizer state, activations, KV cache per device",
    "sweep": "runs (or prints) the arms of an ablation sweep, one workdir each",
    "report": "tables and plots from swept workdirs",
    "view": "static HTML pages of a run's logged episodes (WORKDIR/view/index.html)",
}
EXIT_STATUSES = """exit status:
  0        done
  1        the command failed (the message or traceback says why)
  2        bad command line or config value, or a workdir in use by another run or holding a
           run of another config: refused before any work starts
  130/143  stopped by SIGINT/SIGTERM (128 + signal number); a training phase first finishes its
           step and writes a checkpoint: rerun the same command to resume"""
PROGRAM_USAGE = ("usage: paravt-jax [COMMAND] [--config=FILE[:ARG]] [--config.FIELD=VALUE ...] [flags]\n\n"
                 "commands:\n" + "\n".join(f"  {name:<9} {line}" for name, line in SUMMARIES.items())
                 + "\n\n`paravt-jax COMMAND --help` prints that command's flags and config fields.\n\n"
                 + EXIT_STATUSES)


def command_usage(command: str) -> str:
    workdir = " [--workdir=DIR]" if command in TAKES_WORKDIR else ""
    workdir += " [--config_changed=ok]" if command in CLAIMS_WORKDIR else ""
    return (f"usage: paravt-jax {command} [--config=FILE[:ARG]] [--config.FIELD=VALUE ...]{workdir}\n\n"
            f"{SUMMARIES[command]}\n\n{EXIT_STATUSES}")


def execute(argv: list[str]):
    """Runs the command of argv (argv[0] is the program name) and returns its result; raises
    HelpShown after printing help, UsageError / ConfigValueError for bad input."""
    argv = list(argv)
    if len(argv) > 1 and argv[1] in HELP_FLAGS:  # `paravt-jax --help` (`paravt-jax` alone runs `run`)
        print(PROGRAM_USAGE, flush=True)
        raise HelpShown()
    command = "run"
    if len(argv) > 1 and not argv[1].startswith("-"):
        command = argv.pop(1)
    if command in MODULE_COMMANDS:
        compile_cache.enable()  # $PARAVT_JAX_CACHE_DIR, if set
        distributed.initialize()  # multi-host from the environment only: these parse their own flags
        return importlib.import_module(f"paravt_jax.cli.{command}").main(argv)
    if command not in COMMANDS:
        raise UsageError(f"unknown command {command!r}; choose from {sorted(set(COMMANDS) | set(MODULE_COMMANDS))} "
                         f"(paravt-jax --help lists them)")
    flag_values = flags.FlagValues()
    # sys_argv lets ml_collections register the --config.* override flags of this argv.
    define_config(flag_values, config_path("base" if command == "forward" else "paragrpo") + ":tiny", argv)
    if command in TAKES_WORKDIR:
        flags.DEFINE_string("workdir", "", "run directory (checkpoints, metrics, final model); default: "
                            "config.workdir, else runs/PRESET", flag_values=flag_values)
    if command in CLAIMS_WORKDIR:
        flags.DEFINE_enum("config_changed", "refuse", ["refuse", "ok"], "a rerun in a workdir whose stored config "
                          "differs in more than run length: refuse (default) | ok (continue under the new config)",
                          flag_values=flag_values)
    parse_flags(flag_values, argv, command_usage(command), show_config=True)
    run = check_config(flag_values.config)  # the typed config every command receives
    if command in CLAIMS_WORKDIR:  # the training commands: real data outside the toy presets
        check_data_sources(run)
    compile_cache.enable(run.compilation_cache_dir)
    distributed.initialize(run)  # before anything touches JAX devices
    job = getattr(importlib.import_module(JOBS), COMMANDS[command])
    if command in CLAIMS_WORKDIR:
        return job(run, flag_values.workdir, config_changed=flag_values.config_changed)
    if command in TAKES_WORKDIR:
        return job(run, flag_values.workdir)
    return job(run)


def main(argv: list[str] | None = None) -> int:
    """The `paravt-jax` console script: the exit status (see EXIT_STATUSES); the command's
    result is not printed (tests and notebooks call `execute` or the command functions)."""
    try:
        with preemption.guard():
            execute(list(sys.argv if argv is None else argv))
    except HelpShown:
        return EXIT_OK
    except (UsageError, ConfigValueError) as e:
        print(f"paravt-jax: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except preemption.Preempted as e:
        print(f"paravt-jax: {e.message}", file=sys.stderr, flush=True)
        return e.exit_status
    return EXIT_OK
