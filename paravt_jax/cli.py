"""`paravt-jax <command> --config=FILE[:ARG] [--config.field=value ...]`.

Commands: run (default: the main job: cold-start SFT, PARA-GRPO, evaluation), sft, train
(RL only), export (latest checkpoint -> HF safetensors), generate (one greedy episode),
forward (one timed forward pass on a synthetic video prompt); with their own flags: eval
(benchmark driver, paravt_jax/eval/driver.py), plan (memory planner), sweep and report
(ablations). This module parses the command line and dispatches: the jobs themselves are
library functions in paravt_jax/jobs.py.
"""
from __future__ import annotations

import os
import sys

import configs
from paravt_jax import jobs

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(configs.__file__)), "base.py")


COMMANDS = {"forward": jobs.forward_command, "run": jobs.run_command, "sft": jobs.sft_command,
            "train": jobs.train_command, "export": jobs.export_command, "generate": jobs.generate_command}
TAKES_WORKDIR = {"run", "sft", "train", "export"}
# Commands with their own flags live in their modules: `module.main(argv)` gets argv with the
# command word removed (argv[0] is the program name).
MODULE_COMMANDS = {"plan": "paravt_jax.experiments.plan", "sweep": "paravt_jax.experiments.sweep",
                   "report": "paravt_jax.experiments.report", "eval": "paravt_jax.eval.driver"}


def main(argv: list[str] | None = None) -> None:
    from absl import flags
    from ml_collections import config_flags

    argv = list(sys.argv if argv is None else argv)
    command = "run"
    if len(argv) > 1 and not argv[1].startswith("-"):
        command = argv.pop(1)
    from paravt_jax import compile_cache, distributed

    if command in MODULE_COMMANDS:
        import importlib

        compile_cache.enable()  # $PARAVT_JAX_CACHE_DIR, if set
        distributed.initialize()  # multi-host from the environment only: these parse their own flags
        return importlib.import_module(MODULE_COMMANDS[command]).main(argv)
    if command not in COMMANDS:
        raise SystemExit(f"unknown command {command!r}; choose from {sorted(set(COMMANDS) | set(MODULE_COMMANDS))}")
    flag_values = flags.FlagValues()
    # sys_argv lets ml_collections register the --config.* override flags of this argv.
    default = DEFAULT_CONFIG if command == "forward" else DEFAULT_CONFIG.replace("base.py", "paragrpo.py")
    config_flags.DEFINE_config_file("config", default + ":tiny", "config file[:arg]",
                                    flag_values=flag_values, sys_argv=argv)
    flags.DEFINE_string("workdir", "", "run directory (checkpoints, metrics, final model)",
                        flag_values=flag_values)
    flag_values(argv)
    compile_cache.enable(flag_values.config.get("compilation_cache_dir", ""))
    distributed.initialize(flag_values.config)  # before anything touches JAX devices
    if command in TAKES_WORKDIR:
        return COMMANDS[command](flag_values.config, flag_values.workdir)
    return COMMANDS[command](flag_values.config)


if __name__ == "__main__":
    main()
