"""Start-of-run checks of an ml_collections config: every value a command reads is refused
before any work starts if it is out of range, with the field's dotted name and what is
allowed (`ConfigValueError`). A rule applies to a field only when the config has it, so the
same table serves the training configs (configs/paragrpo.py ...) and the flat benchmark config
(configs/eval.py)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from paravt_jax.agent.rollout import MODES as ROLLOUT_MODES
from paravt_jax.rl.advantages import ANCHOR_MODES
from paravt_jax.rl.episode_log import MAX_LOGGED
from paravt_jax.rl.objective import PROX_LOGPROBS
from paravt_jax.rl.rewards import REWARD_MODES
from paravt_jax.rl.shapes import POLICIES as SHAPE_POLICIES
from paravt_jax.video.frames import SIZINGS


class ConfigValueError(ValueError):
    """A config value outside its allowed range; the message names the field."""


@dataclasses.dataclass(frozen=True)
class Rule:
    allowed: str  # shown to the user: "an integer >= 1", "one of ('f1', ...)"
    check: Callable[[Any], bool]


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def integer(low: int) -> Rule:
    return Rule(f"an integer >= {low}", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low)


def positive() -> Rule:
    return Rule("a finite number > 0", lambda v: _number(v) and v > 0)


def non_negative() -> Rule:
    return Rule("a finite number >= 0", lambda v: _number(v) and v >= 0)


def integer_between(low: int, high: int) -> Rule:
    return Rule(f"an integer in [{low}, {high}]",
                lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high)


def one_of(choices) -> Rule:
    return Rule(f"one of {tuple(choices)}", lambda v: v in tuple(choices))


def share() -> Rule:
    return Rule("a number in [0, 1]", lambda v: _number(v) and 0 <= v <= 1)


def integers(low: int, empty: bool = False) -> Rule:
    """A list of integers >= low; `empty` allows an empty list (e.g. no evaluation setting)."""
    kind = "a list" if empty else "a non-empty list"
    return Rule(f"{kind} of integers >= {low}",
                lambda v: isinstance(v, (list, tuple)) and (empty or len(v) > 0)
                and all(integer(low).check(x) for x in v))


RULES: dict[str, Rule] = {
    # the built-in data and the forward demo
    "data.num_train": integer(1), "data.num_eval": integer(1),
    "demo.frames": integer(1), "demo.repeats": integer(1),
    # cold-start SFT
    "sft.steps": integer(0), "sft.batch_size": integer(1), "sft.micro_batches": integer(1),
    "sft.max_tokens_per_micro_batch": integer(0), "sft.train_width": integer(0), "sft.train_frames": integer(0),
    "sft.optimizer.learning_rate": positive(), "sft.optimizer.weight_decay": non_negative(),
    "sft.optimizer.grad_clip": non_negative(), "sft.optimizer.warmup_steps": integer(0),
    "sft.nframes": integer(1), "sft.nframes_choices": integers(1, empty=True),
    "sft.max_pixels": integer(784), "sft.checkpoint_every": integer(0),
    # PARA-GRPO
    "rl.steps": integer(0), "rl.prompts_per_step": integer(1), "rl.samples_per_prompt": integer(1),
    "rl.micro_batches": integer(1), "rl.max_tokens_per_micro_batch": integer(0),
    "rl.checkpoint_every": integer(0), "rl.eval_every": integer(0), "rl.eval_nframes": integers(1),
    "rl.shapes.policy": one_of(SHAPE_POLICIES), "rl.shapes.prompt_width": integer(0),
    "rl.shapes.prompt_frames": integer(0), "rl.shapes.subagent_rows": integer(0), "rl.shapes.extend_width": integer(0),
    "rl.shapes.subagent_width": integer(0), "rl.shapes.train_width": integer(0),
    "rl.shapes.train_frames": integer(0),
    "rl.log_episodes": integer_between(0, MAX_LOGGED),
    "rl.max_bad_steps": integer(1), "rl.nframes_choices": integers(1), "rl.default_nframes": integer(0),
    "rl.optimizer.learning_rate": positive(), "rl.optimizer.weight_decay": non_negative(),
    "rl.optimizer.grad_clip": non_negative(), "rl.optimizer.warmup_steps": integer(0),
    "rl.step.temperature": positive(), "rl.step.eps_clip": positive(), "rl.step.behaviour_cap": positive(),
    "rl.step.logprob_chunk": integer(1), "rl.step.prox_logprobs": one_of(PROX_LOGPROBS),
    "rl.rollout.max_turns": integer(0), "rl.rollout.max_new_tokens": integer(1),
    "rl.rollout.mode": one_of(ROLLOUT_MODES), "rl.rollout.subagent_max_tokens": integer(1),
    "rl.rollout.overview_max_pixels": integer(784), "rl.rollout.overview_max_frames": integer(1),
    "rl.rollout.overview_sizing": one_of(SIZINGS), "rl.dispatch.sizing": one_of(SIZINGS),
    "rl.dispatch.max_parallel": integer(1), "rl.dispatch.max_frames": integer(1),
    "rl.dispatch.max_error_responses": integer(1), "rl.dispatch.max_workers": integer(1),
    "rl.advantage.anchor_mode": one_of(ANCHOR_MODES), "rl.advantage.anchor_weight": non_negative(),
    "rl.advantage.kl_ctl": non_negative(), "rl.reward.format_weight": non_negative(),
    "rl.reward.mode": one_of(REWARD_MODES),
    # held-out evaluation of `run`, and `generate`
    "eval.nframes": integers(1, empty=True), "eval.after_sft": integers(1, empty=True),
    "eval.max_new_tokens": integer(1), "eval.max_turns": integer(0),
    "eval.limit": integer(0), "eval.mode": one_of(ROLLOUT_MODES), "generate.nframes": integer(1),
    # the benchmark driver's flat config (configs/eval.py)
    "limit": integer(0), "max_missing_videos": share(), "nframes": integer(1), "max_turns": integer(0),
    "max_parallel": integer(1),
    "max_new_tokens": integer(1), "batch_size": integer(1), "mcq_answer_tokens": integer(1),
    "grounding_answer_tokens": integer(1), "dispatch": one_of(("parallel", "sequential")),
    "grounding_visual": one_of(("video", "images")), "video_frames": integer(1),
    "video_min_pixels": integer(1), "video_max_pixels": integer(1),
}


def _get(config, path: str):
    node = config
    for part in path.split("."):
        if not hasattr(node, "get") or part not in node:
            return _MISSING
        node = node[part]
    return node


_MISSING = object()


def _divides(config, errors: list[str], total_fields: tuple[str, ...], parts_field: str):
    """Micro-batches must split the step's rows evenly."""
    values = [_get(config, f) for f in (*total_fields, parts_field)]
    if any(v is _MISSING or not integer(1).check(v) for v in values):
        return
    *factors, parts = values
    total = math.prod(factors)
    if total % parts:
        rows = " x ".join(total_fields)
        errors.append(f"{parts_field}={parts}: must divide the {total} rows of a step ({rows})")


MODEL_INITS = ("checkpoint", "random")
DATA_FILES = ("sft", "rl_train", "rl_eval")


def _model_source(config, errors: list[str]) -> None:
    """A model preset without a built-in checkpoint is loaded from model.checkpoint; a random
    initialisation is asked for by name (model.init=random), never the silent fallback."""
    from paravt_jax.data.builtin import BUILTIN_MODELS

    model = config.get("model") if hasattr(config, "get") else None
    if model is None or "preset" not in model:
        return
    init, checkpoint = model.get("init", "checkpoint"), model.get("checkpoint", "")
    if init not in MODEL_INITS:
        errors.append(f"model.init={init!r}: must be one of {MODEL_INITS}")
    elif init == "random" and checkpoint:
        errors.append(f"model.init='random' and model.checkpoint={checkpoint!r}: choose one")
    elif init == "checkpoint" and not checkpoint and model.preset not in BUILTIN_MODELS:
        errors.append(f"model.checkpoint is empty: the {model.preset!r} model has no built-in checkpoint (only "
                      f"{', '.join(BUILTIN_MODELS)} have); give --config.model.checkpoint=DIR (a local HF Qwen3-VL "
                      "checkpoint), or --config.model.init=random to train a randomly initialised one")


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
    """Raises ConfigValueError listing every out-of-range field of `config`."""
    errors = []
    _model_source(config, errors)
    for path, rule in RULES.items():
        value = _get(config, path)
        if value is not _MISSING and not rule.check(value):
            errors.append(f"{path}={value!r}: must be {rule.allowed}")
    _divides(config, errors, ("sft.batch_size",), "sft.micro_batches")
    _divides(config, errors, ("rl.prompts_per_step", "rl.samples_per_prompt"), "rl.micro_batches")
    if len(errors) == 1:
        raise ConfigValueError(f"invalid config value: {errors[0]}")
    if errors:
        raise ConfigValueError("invalid config values:\n  " + "\n  ".join(errors))
