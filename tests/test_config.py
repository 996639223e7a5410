"""Config sections shaped like the dataclasses: every field is reachable from the command line,
unknown keys fail naming the key, the LLM judge is built (or refused) at start."""
import dataclasses
import os
import typing

import pytest

from paravt_jax import runtime
from paravt_jax.config import build, fields_and_keys, section
from paravt_jax.configs import paragrpo
from paravt_jax.rl.rewards import RewardConfig, make_judge
from paravt_jax.rl.trainer import RLConfig
from paravt_jax.sft.trainer import SFTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTIONS = (("rl", RLConfig, runtime.rl_config), ("sft", SFTConfig, runtime.sft_config),
            ("eval", runtime.EvalConfig, runtime.eval_config))
# String fields whose values are checked when the dataclass is built: an allowed other value.
CHOICES = {"AdvantageConfig.anchor_mode": "sequence", "OptimizerConfig.name": "adam",
           "OptimizerConfig.schedule": "cosine", "RolloutConfig.mode": "frames", "RewardConfig.mode": "exact",
           "RewardConfig.text": "completion", "DispatchConfig.arguments": "lenient",
           "RolloutConfig.video_path_line": "none", "RolloutConfig.tool_layout": "object",
           "RolloutConfig.frames_response": "images_first", "RolloutConfig.malformed": "ignore",
           "RolloutConfig.extra_calls": "ignore", "RolloutConfig.overview_visual": "video",
           "RolloutConfig.overview_sizing": "two_stage", "DispatchConfig.sizing": "two_stage",
           "ShapeConfig.policy": "per_call", "StepConfig.prox_logprobs": "recompute"}


def parse(*overrides):
    from absl import flags
    from ml_collections import config_flags

    argv = ["prog", f"--config={ROOT}/configs/paragrpo.py:tiny", *overrides]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", "", "", flag_values=values, sys_argv=argv)
    values(argv)
    return values.config


def field_of(instance, dotted: str):
    for name in dotted.split("."):
        instance = getattr(instance, name)
    return instance


def other_value(name: str, hint, default):
    """A valid value of the field's type that differs from its default, and its flag text."""
    if name in CHOICES:
        return CHOICES[name], CHOICES[name]
    kind = typing.get_origin(hint) or hint
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if type(None) in typing.get_args(hint):  # `T | None` (None: a typed placeholder)
        kind = typing.get_origin(args[0]) or args[0]
    if kind is bool:
        return (not default), str(not default)
    if kind is int:
        return default + 1, str(default + 1)
    if kind is float:
        value = 0.75 if default is None else default * 0.5 + 0.125
        return value, repr(value)
    if kind is str:
        return (default or "") + "x", (default or "") + "x"
    if kind is tuple:
        return (3, 5), "(3, 5)"
    raise AssertionError(f"{name}: no test value for type {hint}")


def every_field():
    for where, cls, _ in SECTIONS:
        for name, key, set_by in fields_and_keys(cls, where):
            yield where, name, key, set_by


def test_every_dataclass_field_is_settable_from_the_command_line():
    """Walks every field of RLConfig, SFTConfig, EvalConfig and their nested dataclasses
    (rollout, dispatch, reward, advantage, step, optimizer, sampler): each is a config key that
    `--config.KEY=VALUE` sets and that reaches the built dataclass, or a field marked `set_by`
    that names what sets it. All overrides go in one command line."""
    expected, overrides = {}, []
    for where, name, key, set_by in every_field():
        if key is None:
            assert set_by.strip(), f"{name} is neither a config key nor says what sets it"
            continue
        cls_name, field_name = name.split(".")
        owner = next(c for c in _dataclasses() if c.__name__ == cls_name)
        hint = typing.get_type_hints(owner)[field_name]
        default = field_of(_default_of(where), key.split(".", 1)[1])
        value, text = other_value(name, hint, default)
        overrides.append(f"--config.{key}={text}")
        expected[key] = value
    assert len(expected) > 60, len(expected)  # the walk saw the nested sections
    config = parse(*overrides)
    built = {where: fn(config) for where, _, fn in SECTIONS}
    for key, value in expected.items():
        where, rest = key.split(".", 1)
        assert field_of(built[where], rest) == value, key


def _default_of(where):
    return {where: fn(paragrpo.get_config("tiny")) for where, _, fn in SECTIONS}[where]


def _dataclasses():
    seen, todo = [], [cls for _, cls, _ in SECTIONS]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        for kind in typing.get_type_hints(cls).values():
            if isinstance(kind, type) and dataclasses.is_dataclass(kind) and kind not in seen:
                todo.append(kind)
    return seen


def test_knobs_named_in_the_issue_are_reachable():
    keys = {key for _, _, key, _ in every_field() if key}
    for key in ("rl.optimizer.schedule", "rl.optimizer.warmup_steps", "rl.optimizer.total_steps", "rl.optimizer.b1",
                "rl.optimizer.b2", "rl.advantage.reward_bias", "rl.advantage.reward_scaling",
                "rl.advantage.reward_clip", "rl.advantage.gamma", "rl.advantage.std_eps", "rl.advantage.batch_norm",
                "rl.step.eps_clip_high", "rl.step.logprob_chunk", "rl.max_bad_steps", "rl.eval_nframes",
                "rl.eval_limit", "rl.nframes_choices", "eval.nframes", "eval.limit", "rl.sampler.cache_multiple"):
        assert key in keys, key


def test_unknown_keys_fail_naming_the_key():
    with pytest.raises(Exception, match="max_turn"):
        parse("--config.rl.rollout.max_turn=3")
    config = paragrpo.get_config("tiny")
    config.rl.rollout.max_turn = 3  # a misspelled key in a config file
    with pytest.raises(ValueError, match=r"rl\.rollout\.max_turn: not a field of RolloutConfig"):
        runtime.rl_config(config)
    config = paragrpo.get_config("tiny")
    config.rl.seed = 3  # the seed is the config's top-level one
    with pytest.raises(ValueError, match=r"rl\.seed"):
        runtime.rl_config(config)


def test_section_round_trips_a_dataclass():
    config = RLConfig(steps=9, rollout=dataclasses.replace(RLConfig().rollout, max_turns=1))
    rebuilt = build(RLConfig, section(config), "rl", seed=config.seed)
    assert rebuilt == config


def test_llm_judge_is_built_from_the_environment_or_refused_at_start():
    assert make_judge(RewardConfig(mode="f1"), environ={}) is None
    with pytest.raises(ValueError, match="PARAVT_JUDGE_API_KEY"):
        make_judge(RewardConfig(mode="llm"), environ={})
    with pytest.raises(ValueError, match="MY_KEY"):
        make_judge(RewardConfig(mode="llm", judge_api_key_env="MY_KEY"), environ={"PARAVT_JUDGE_API_KEY": "k"})
    judge = make_judge(RewardConfig(mode="llm", judge_api_key_env="MY_KEY"),
                       environ={"MY_KEY": "s3cr3t", "PARAVT_JUDGE_MODEL": "m"})
    assert judge.model == "m" and judge.base_url == "https://api.openai.com/v1" and "s3cr3t" not in repr(judge)
    local = make_judge(RewardConfig(mode="llm"), environ={"PARAVT_JUDGE_BASE_URL": "http://127.0.0.1:8000/v1"})
    assert local.base_url == "http://127.0.0.1:8000/v1"
    with pytest.raises(ValueError, match="PARAVT_JUDGE_TIMEOUT_S"):
        make_judge(RewardConfig(mode="llm"), environ={"PARAVT_JUDGE_BASE_URL": "http://localhost:1/v1",
                                                      "PARAVT_JUDGE_TIMEOUT_S": "soon"})
