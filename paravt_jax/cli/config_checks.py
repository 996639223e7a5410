"""Start-of-command checks: the config built into the typed RunConfig (run_config.build_run:
every bad value of every section named under its dotted path, every key that is no field or
moved), and what a command asks of it beyond its fields' rules: a model it can build
(`check_config`: the model's source) and, for the training commands, data to train on
(`check_data_sources`). Every problem is refused before any work starts (ConfigValueError).
"""
from __future__ import annotations

from paravt_jax.config import ConfigValueError, Problem, build
from paravt_jax.data.builtin import BUILTIN_MODELS
from paravt_jax.run_config import ModelConfig, RunConfig, build_run

DATA_FILES = ("sft", "rl_train", "rl_eval")


def model_source_problems(model: ModelConfig) -> list[Problem]:
    """A model preset without a built-in checkpoint is loaded from model.checkpoint; a random
    initialisation is asked for by name (model.init=random), never the silent fallback."""
    if model.init == "random" and model.checkpoint:
        return [Problem("model.init", f"='random' and model.checkpoint={model.checkpoint!r}: choose one")]
    if model.init == "checkpoint" and not model.checkpoint and model.preset not in BUILTIN_MODELS:
        return [Problem("model.checkpoint", f" is empty: the {model.preset!r} model has no built-in checkpoint "
                        f"(only {', '.join(BUILTIN_MODELS)} have); give --config.model.checkpoint=DIR (a local HF "
                        "Qwen3-VL checkpoint), or --config.model.init=random to train a randomly initialised one")]
    return []


def _model_alone(config) -> ModelConfig | None:
    """The model section built on its own (its source is checked beside the other problems)."""
    try:
        return build(ModelConfig, config.model, "model") if "model" in config else ModelConfig()
    except ConfigValueError:
        return None  # its problems are named by build_run


def check_config(config) -> RunConfig:
    """The RunConfig of an ml_collections config, for a command that builds the model; raises
    one ConfigValueError listing the model's source problem (if any) and every problem
    build_run names."""
    try:
        run, problems = build_run(config), []
    except ConfigValueError as e:
        run, problems = None, list(e.problems)
    model = run.model if run is not None else _model_alone(config)
    problems = (model_source_problems(model) if model is not None else []) + problems
    if problems:
        raise ConfigValueError(problems=problems)
    return run


def check_data_sources(run: RunConfig) -> None:
    """For the training commands: outside the toy model presets every data file is given, or
    built-in toy data is asked for with model.init=random (a smoke test of the recipe)."""
    if run.model.preset in BUILTIN_MODELS or run.model.init == "random":
        return
    empty = [name for name in DATA_FILES if not getattr(run.data, name)]
    if empty:
        raise ConfigValueError(
            f"data.{', data.'.join(empty)} empty: the built-in toy data serves the toy presets "
            f"({', '.join(BUILTIN_MODELS)}); give --config.data.{empty[0]}=FILE.parquet (and data.video_root), or "
            "--config.model.init=random to run the recipe on it as a smoke test")
