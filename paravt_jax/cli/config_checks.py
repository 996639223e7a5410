"""Start-of-run checks of an ml_collections config: every value a command reads is refused
before any work starts if it is out of range, with the field's dotted name and what is allowed
(`ConfigValueError`, every bad value of the config at once).

The sections shaped like dataclasses (`sft`, `rl`, the benchmark driver's `driver`) and the
evaluations section `evals` (named entries by type, eval/registry.py) are checked by building
them: each dataclass validates its own fields (paravt_jax.config); a section that moved
(config.MOVED_KEYS: `eval` is `evals.held_out`) is refused naming its new place.
What is left here is about keys that build no dataclass: the built-in data, the forward demo,
`generate`, the benchmark-level keys of configs/eval.py, and the model's source.
"""
from __future__ import annotations

import dataclasses

from paravt_jax.config import (
    SET_BY,
    ConfigValueError,
    Problem,
    Rule,
    build,
    build_entries,
    integer,
    moved_to,
    one_of,
    share,
)
from paravt_jax.eval import registry
from paravt_jax.eval.prompts import MODES as PROMPT_MODES
from paravt_jax.eval.settings import RECORD_NAMES, DriverConfig
from paravt_jax.rl.trainer import RLConfig
from paravt_jax.sft.trainer import SFTConfig
from paravt_jax.text.chat import VISUALS

# config section -> the dataclass it builds
SECTIONS = {"sft": SFTConfig, "rl": RLConfig, "driver": DriverConfig}
# config section -> the types of its named entries (an evaluations section: eval/registry.py)
ENTRY_SECTIONS = {"evals": registry.TYPES}

# Keys that build no dataclass; a rule applies when the config has the key.
RULES: dict[str, Rule] = {
    # the built-in data and the forward demo
    "data.num_train": integer(1), "data.num_eval": integer(1),
    "demo.frames": integer(1), "demo.repeats": integer(1),
    # `generate`'s overview
    "generate.nframes": integer(1),
    # the benchmark driver's benchmark-level keys (configs/eval.py)
    "limit": integer(0), "max_missing_videos": share(),
    "grounding_prompt_mode": one_of(PROMPT_MODES), "grounding_visual": one_of(VISUALS),
}

_MISSING = object()
# The driver's settings in the flat layout configs/eval.py had before its driver section (and
# the driver section before its prompt and protocol subsections) -> their keys now.
DRIVER_KEYS = {**{f.name: f"driver.{f.name}" for f in dataclasses.fields(DriverConfig)
                  if SET_BY not in f.metadata and f.name not in ("prompt", "protocol")},
               **{flat: f"driver.{key}" for key, flat in RECORD_NAMES.items() if key != "prompt.overview_visual"}}


def _get(config, path: str):
    node = config
    for part in path.split("."):
        if not hasattr(node, "get") or part not in node:
            return _MISSING
        node = node[part]
    return node


MODEL_INITS = ("checkpoint", "random")
DATA_FILES = ("sft", "rl_train", "rl_eval")


def _model_source(config) -> list[Problem]:
    """A model preset without a built-in checkpoint is loaded from model.checkpoint; a random
    initialisation is asked for by name (model.init=random), never the silent fallback."""
    from paravt_jax.data.builtin import BUILTIN_MODELS

    model = config.get("model") if hasattr(config, "get") else None
    if model is None or "preset" not in model:
        return []
    init, checkpoint = model.get("init", "checkpoint"), model.get("checkpoint", "")
    if init not in MODEL_INITS:
        return [Problem("model.init", f"={init!r}: must be one of {MODEL_INITS}")]
    if init == "random" and checkpoint:
        return [Problem("model.init", f"='random' and model.checkpoint={checkpoint!r}: choose one")]
    if init == "checkpoint" and not checkpoint and model.preset not in BUILTIN_MODELS:
        return [Problem("model.checkpoint", f" is empty: the {model.preset!r} model has no built-in checkpoint "
                        f"(only {', '.join(BUILTIN_MODELS)} have); give --config.model.checkpoint=DIR (a local HF "
                        "Qwen3-VL checkpoint), or --config.model.init=random to train a randomly initialised one")]
    return []


def check_data_sources(config) -> None:
    """For the training commands: outside the toy model presets every data file is given, or
    built-in toy data is asked for with model.init=random (a smoke test of the recipe)."""
    from paravt_jax.data.builtin import BUILTIN_MODELS

    model, data = config.get("model"), config.get("data")
    if model is None or data is None or model.preset in BUILTIN_MODELS or model.get("init", "") == "random":
        return
    empty = [name for name in DATA_FILES if name in data and not data[name]]
    if empty:
        raise ConfigValueError(
            f"data.{', data.'.join(empty)} empty: the built-in toy data serves the toy presets "
            f"({', '.join(BUILTIN_MODELS)}); give --config.data.{empty[0]}=FILE.parquet (and data.video_root), or "
            "--config.model.init=random to run the recipe on it as a smoke test")


def check_config(config) -> None:
    """Raises ConfigValueError listing every out-of-range value of `config`: its model source,
    the keys of RULES it has, and every section of SECTIONS it has, built as the command will
    build it (an unknown key in a section is an error naming it, as `build` says)."""
    problems = _model_source(config)
    for path, rule in RULES.items():
        value = _get(config, path)
        if value is not _MISSING and not rule.check(value):
            problems.append(Problem(path, f"={value!r}: must be {rule.allowed}"))
    for name in config:
        try:
            if name in SECTIONS:
                build(SECTIONS[name], config[name], name)
            elif name in ENTRY_SECTIONS:
                build_entries(ENTRY_SECTIONS[name], config[name], name)
        except ConfigValueError as e:
            problems += e.problems
        if moved_to(name):  # a section that moved (a config file written before)
            problems.append(Problem(name, f": moved; it is {moved_to(name)}"))
    if "driver" in config:  # a config file in the flat layout configs/eval.py had before its driver section
        problems += [Problem(key, f": a field of the driver section, not read at the top level; set {DRIVER_KEYS[key]}")
                     for key in config if key in DRIVER_KEYS]
    if problems:
        raise ConfigValueError(problems=problems)
