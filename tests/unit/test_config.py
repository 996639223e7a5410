"""Config sections shaped like the dataclasses: every field is reachable from the command line,
unknown keys fail naming the key, the LLM judge is built (or refused) at start."""
import dataclasses
import os
import typing

import pytest

from paravt_jax.config import ConfigValueError, build, fields_and_keys, section
from paravt_jax.configs import paragrpo
from paravt_jax.episodes.rewards import RewardConfig, make_judge
from paravt_jax.rl.trainer import RLConfig
from paravt_jax.run_config import build_run
from paravt_jax.sft.trainer import SFTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECTIONS = (("rl", RLConfig, lambda c: build_run(c).rl), ("sft", SFTConfig, lambda c: build_run(c).sft))
# sections of named entries by type (eval/registry.py): their fields walked through the entries
# of the tiny preset
ENTRY_SECTIONS = (("evals", lambda c: build_run(c).evals),)
# keys whose value the walk leaves at its default: the periodic held-out check refuses cold-start
# K (tests/unit/test_eval_registry.py); the curriculum's K bound needs frame_sampling='count',
# which the walk moves to 'fps' (set on its own below); the sub-agents in the turns' rows need
# mode 'subagent', which the walk moves to 'frames' (set on their own below)
LEFT_AT_DEFAULT = ("rl.evals.eval.after_sft", "sft.first_max_nframes", "rl.rollout.subagent_in_turns",
                   "rl.rollout.subagent_spare_rows")
# String fields whose values are checked when the dataclass is built: an allowed other value.
CHOICES = {"AdvantageConfig.anchor_mode": "sequence", "OptimizerConfig.name": "adam",
           "OptimizerConfig.schedule": "cosine", "RolloutConfig.mode": "frames", "RewardConfig.mode": "exact",
           "RewardConfig.text": "completion", "DispatchConfig.arguments": "lenient",
           "PromptFormat.video_path_line": "none", "PromptFormat.tool_layout": "object",
           "ToolProtocol.frames_response": "images_first", "ToolProtocol.malformed": "ignore",
           "ToolProtocol.extra_calls": "ignore", "PromptFormat.overview_visual": "video",
           "PromptFormat.overview_sizing": "two_stage", "DispatchConfig.sizing": "two_stage",
           "ShapeConfig.policy": "per_call", "ShapeConfig.subagent_batch": "round",
           "SFTConfig.frame_sampling": "fps", "SFTConfig.sizing": "two_stage",
           "SFTConfig.visual": "video", "StepConfig.prox_logprobs": "recompute", "HeldOutConfig.mode": "subagent",
           # parameter paths (strings; sft.cache_vision_features, set by the walk, needs the tower frozen)
           "OptimizerConfig.frozen": ("visual",),
           # must divide the step's rows (tiny: 9 SFT rows, 3 x 5 RL rows once every int is one more)
           "SFTConfig.micro_batches": 3, "RLConfig.micro_batches": 3}


def parse(*overrides, config="paragrpo.py:tiny"):
    from absl import flags
    from ml_collections import config_flags

    argv = ["prog", f"--config={ROOT}/configs/{config}", *overrides]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", "", "", flag_values=values, sys_argv=argv)
    values(argv)
    return values.config


def field_of(instance, dotted: str):
    for name in dotted.split("."):
        instance = instance[name] if isinstance(instance, dict) else getattr(instance, name)
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
        value = 1 if default is None else default + 1
        return value, str(value)
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
    for where, fn in ENTRY_SECTIONS:
        for entry, settings in fn(paragrpo.get_config("tiny")).items():
            for name, key, set_by in fields_and_keys(type(settings), f"{where}.{entry}"):
                yield where, name, key, set_by


def builders():
    return [(where, fn) for where, _, fn in SECTIONS] + list(ENTRY_SECTIONS)


def test_every_dataclass_field_is_settable_from_the_command_line():
    """Walks every field of RLConfig, SFTConfig, the evaluations' entries (rl.evals, evals) and
    their nested dataclasses (rollout, dispatch, reward, advantage, step, optimizer, sampler): each is a config key that
    `--config.KEY=VALUE` sets and that reaches the built dataclass, or a field marked `set_by`
    that names what sets it. All overrides go in one command line."""
    expected, overrides = {}, []
    for where, name, key, set_by in every_field():
        if key is None:
            assert set_by.strip(), f"{name} is neither a config key nor says what sets it"
            continue
        if key in LEFT_AT_DEFAULT:
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
    built = {where: fn(config) for where, fn in builders()}
    for key, value in expected.items():
        where, rest = key.split(".", 1)
        assert field_of(built[where], rest) == value, key


def test_first_max_nframes_is_settable_on_its_own_and_refused_with_fps_sampling():
    """The key the walk leaves at its default (after_sft: tests/unit/test_eval_registry.py)."""
    assert build_run(parse("--config.sft.first_max_nframes=16")).sft.first_max_nframes == 16
    with pytest.raises(ConfigValueError, match="first_max_nframes=16: needs frame_sampling='count'"):
        build_run(parse("--config.sft.first_max_nframes=16", "--config.sft.frame_sampling=fps"))


def test_subagents_in_turns_are_settable_with_the_refilled_subagent_rollout():
    """The keys the walk leaves at their defaults: set with turn_refill in subagent mode."""
    rollout = build_run(parse("--config.rl.rollout.turn_refill=true", "--config.rl.rollout.subagent_in_turns=true",
                              "--config.rl.rollout.subagent_spare_rows=3")).rl.rollout
    assert rollout.subagent_in_turns and rollout.subagent_spare_rows == 3 and rollout.mode == "subagent"
    with pytest.raises(ConfigValueError, match="rl.rollout.subagent_in_turns=True: needs turn_refill=True"):
        build_run(parse("--config.rl.rollout.subagent_in_turns=true"))


def _default_of(where):
    return {where: fn(paragrpo.get_config("tiny")) for where, fn in builders()}[where]


def _dataclasses():
    from paravt_jax.eval.registry import TYPES

    seen, todo = [], [cls for _, cls, _ in SECTIONS] + list(TYPES.values())
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
                "rl.step.eps_clip_high", "rl.step.logprob_chunk", "rl.max_bad_steps", "rl.evals.eval.nframes",
                "rl.evals.eval.limit", "rl.nframes_choices", "evals.held_out.nframes", "evals.held_out.limit",
                "evals.held_out.after_sft", "rl.sampler.cache_multiple"):
        assert key in keys, key


def test_unknown_keys_fail_naming_the_key():
    with pytest.raises(Exception, match="max_turn"):
        parse("--config.rl.rollout.max_turn=3")
    config = paragrpo.get_config("tiny")
    config.rl.rollout.max_turn = 3  # a misspelled key in a config file
    with pytest.raises(ValueError, match=r"rl\.rollout\.max_turn: not a field of RolloutConfig"):
        build_run(config)
    config = paragrpo.get_config("tiny")
    config.rl.seed = 3  # the seed is the config's top-level one
    with pytest.raises(ValueError, match=r"rl\.seed"):
        build_run(config)


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


# ----------------------------------------------------------------------------- validation
# (config file, preset): every preset the project ships
PRESETS = ([("paragrpo", p) for p in paragrpo.MODEL_PRESETS] + [("sft", "tiny"), ("sft", "toy"), ("sft", "qwen3vl_8b")]
           + [("vanilla_grpo", p) for p in ("tiny", "toy", "qwen3vl_8b")]
           + [("ablations", p) for p in ("tiny", "tiny_full", "qwen3vl_2b", "qwen3vl_8b", "toy_paradox",
                                         "toy_paradox_varied", "toy_long", "toy_long_pilot")]
           + [("eval", "synthetic"), ("eval", "paravt_8b")] + [("base", p) for p in ("tiny", "toy", "8b")])


def shipped(file: str, preset: str):
    """The preset's config; the presets without a built-in checkpoint name one (not read here)."""
    import importlib

    from paravt_jax.data.builtin import BUILTIN_MODELS

    config = importlib.import_module(f"paravt_jax.configs.{file}").get_config(preset)
    if config.model.preset not in BUILTIN_MODELS:
        config.model.checkpoint = "/ckpt/Qwen3-VL"
    return config


@pytest.mark.parametrize("file,preset", PRESETS, ids=[f"{f}:{p}" for f, p in PRESETS])
def test_every_shipped_preset_and_sweep_arm_passes_the_checks(file, preset):
    from paravt_jax.cli.config_checks import check_config
    from paravt_jax.experiments.sweep import apply_overrides, build_arms

    config = shipped(file, preset)
    check_config(config)
    if file == "ablations":
        from paravt_jax.configs import ablations

        for arm in build_arms(config, ablations.sweep(preset), f"ablations.py:{preset}"):
            check_config(apply_overrides(config, arm.overrides, arm.name))


# (config file, key, bad value, what the message must say): one bad value per kind of section:
# the dataclass sections, their nested sections, the cross-field checks, and the keys that build
# no dataclass (data, demo, generate, the benchmark driver's top level, the model source)
BAD_VALUES = [
    ("paragrpo", "sft.steps", -1, "sft.steps=-1: must be an integer >= 0"),
    ("paragrpo", "sft.nframes_choices", (4, 0), "sft.nframes_choices=(4, 0): must be a list of integers >= 1"),
    ("paragrpo", "sft.micro_batches", 3, "sft.micro_batches=3: must divide the 8 rows of a step (batch_size)"),
    ("paragrpo", "sft.optimizer.warmup_steps", -2, "sft.optimizer.warmup_steps=-2: must be an integer >= 0"),
    ("paragrpo", "rl.prompts_per_step", 0, "rl.prompts_per_step=0: must be an integer >= 1"),
    ("paragrpo", "rl.log_episodes", 1000, "rl.log_episodes=1000: must be an integer in [0, 256]"),
    ("paragrpo", "rl.evals.eval.limit", -1, "rl.evals.eval.limit=-1: must be an integer >= 0"),
    ("paragrpo", "rl.evals.eval.type", "greedy", "rl.evals.eval.type='greedy': must be one of ('held_out', "
     "'benchmark')"),
    ("paragrpo", "rl.evals.eval.after_sft", (4,), "rl.evals.eval.after_sft=(4,): the periodic evaluation has no "
     "cold start"),
    ("paragrpo", "rl.micro_batches", 3, "rl.micro_batches=3: must divide the 8 rows of a step "
     "(prompts_per_step x samples_per_prompt)"),
    ("paragrpo", "rl.optimizer.schedule", "linear", "rl.optimizer.schedule='linear': must be one of ('constant', "
     "'cosine', 'wsd')"),
    ("paragrpo", "rl.optimizer.learning_rate", float("nan"), "rl.optimizer.learning_rate=nan: must be a finite "
     "number > 0"),
    ("paragrpo", "rl.step.eps_clip_high", -0.1, "rl.step.eps_clip_high=-0.1: must be a finite number > 0, or None"),
    ("paragrpo", "rl.step.prox_logprobs", "stale", "rl.step.prox_logprobs='stale': must be one of ('same_pass', "
     "'recompute')"),
    ("paragrpo", "rl.shapes.train_width", -1, "rl.shapes.train_width=-1: must be an integer >= 0"),
    ("paragrpo", "rl.advantage.gamma", 1.5, "rl.advantage.gamma=1.5: must be a number in [0, 1]"),
    ("paragrpo", "rl.reward.mode", "judge", "rl.reward.mode='judge': must be one of ('f1', 'exact', 'llm')"),
    ("paragrpo", "rl.rollout.max_new_tokens", 0, "rl.rollout.max_new_tokens=0: must be an integer >= 1"),
    ("paragrpo", "rl.rollout.mode", "crops", "rl.rollout.mode='crops': must be one of ('subagent', 'frames', "
     "'sequential')"),
    ("paragrpo", "rl.rollout.max_turns", -1, "rl.rollout.max_turns=-1: must be an integer >= 0"),
    ("paragrpo", "rl.dispatch.max_frames", 0, "rl.dispatch.max_frames=0: must be an integer >= 1"),
    ("paragrpo", "evals.held_out.after_sft", (0,), "evals.held_out.after_sft=(0,): must be a list of integers >= 1"),
    ("paragrpo", "evals.held_out.mode", "crops", "evals.held_out.mode='crops': must be one of ('subagent', 'frames', "
     "'sequential'), or None"),
    ("paragrpo", "generate.nframes", 0, "generate.nframes=0: must be an integer >= 1"),
    ("paragrpo", "data.num_eval", 0, "data.num_eval=0: must be an integer >= 1"),
    ("base", "demo.repeats", 0, "demo.repeats=0: must be an integer >= 1"),
    ("base", "model.init", "zeros", "model.init='zeros': must be one of ('checkpoint', 'random')"),
    ("eval", "driver.max_turns", -1, "driver.max_turns=-1: must be an integer >= 0"),
    ("eval", "driver.prompt_mode", "agentic", "driver.prompt_mode='agentic': must be one of ('direct', 'reasoning', "
     "'agentic_general', 'agentic_minimal')"),
    ("eval", "driver.protocol.frames_response", "frames", "driver.protocol.frames_response='frames': must be one of "
     "('timestamped', 'images_first')"),
    ("eval", "driver.prompt.overview_max_pixels", 100, "driver.prompt.overview_max_pixels=100: must be an integer "
     ">= 784"),
    ("paragrpo", "rl.rollout.prompt.video_path_line", "below", "rl.rollout.prompt.video_path_line='below': must be "
     "one of ('newline', 'space_if_absent', 'none')"),
    ("paragrpo", "rl.rollout.protocol.final_answer_tokens", 0, "rl.rollout.protocol.final_answer_tokens=0: must be "
     "an integer >= 1"),
    ("eval", "driver.crop_arguments", "loose", "driver.crop_arguments='loose': must be one of ('strict', 'lenient')"),
    ("eval", "max_missing_videos", 1.5, "max_missing_videos=1.5: must be a number in [0, 1]"),
    ("eval", "grounding_prompt_mode", "agentic", "grounding_prompt_mode='agentic': must be one of ('direct', "),
    ("eval", "limit", -1, "limit=-1: must be an integer >= 0"),
    ("paragrpo", "sft.optimizer.frozen", (3, 5), "sft.optimizer.frozen=(3, 5): must be a list of non-empty strings"),
]


def set_key(config, key: str, value):
    *parents, leaf = key.split(".")
    for name in parents:
        config = config[name]
    config[leaf] = value


@pytest.mark.parametrize("file,key,value,message", BAD_VALUES, ids=[k for _, k, _, _ in BAD_VALUES])
def test_a_bad_value_is_refused_naming_its_dotted_field(file, key, value, message):
    from paravt_jax.cli.config_checks import check_config
    from paravt_jax.config import ConfigValueError

    config = shipped(file, "tiny" if file in ("paragrpo", "base") else "synthetic")
    set_key(config, key, value)
    with pytest.raises(ConfigValueError) as err:
        check_config(config)
    assert str(err.value) == f"invalid config value: {message}" or message in str(err.value), str(err.value)
    assert len(err.value.problems) == 1, err.value.problems


def test_every_bad_value_of_a_config_is_listed_at_once():
    from paravt_jax.cli.config_checks import check_config
    from paravt_jax.config import ConfigValueError

    config = paragrpo.get_config("tiny")
    config.sft.steps, config.rl.step.eps_clip, config.rl.rollout.subagent_max_tokens = -1, 0.0, 0
    config.rl.advantage.anchor_mode, config.evals.held_out.max_turns = "both", -1
    with pytest.raises(ConfigValueError) as err:
        check_config(config)
    assert sorted(p.field for p in err.value.problems) == ["evals.held_out.max_turns", "rl.advantage.anchor_mode",
                                                          "rl.rollout.subagent_max_tokens", "rl.step.eps_clip",
                                                          "sft.steps"]
    assert str(err.value).startswith("invalid config values:\n  ")


def test_the_dataclasses_check_themselves_wherever_they_are_built():
    """Built in code, not from a config section: the same checks, the field named without a
    section (build adds it)."""
    from paravt_jax.config import ConfigValueError
    from paravt_jax.eval.settings import DriverConfig

    with pytest.raises(ConfigValueError, match=r"^invalid config value: micro_batches=3: must divide the 8 rows"):
        RLConfig(micro_batches=3)
    with pytest.raises(ConfigValueError, match=r"batch_size=0: must be an integer >= 1"):
        DriverConfig(batch_size=0)
    with pytest.raises(ConfigValueError, match=r"learning_rate=0.0: must be a finite number > 0"):
        SFTConfig(optimizer=dataclasses.replace(SFTConfig().optimizer, learning_rate=0.0))
    assert build_run(paragrpo.get_config("tiny")).rl.step.behaviour_cap == 5.0  # None-able, set: checked


def test_unknown_and_code_set_keys_under_the_driver_section_are_refused():
    from paravt_jax.cli.config_checks import check_config
    from paravt_jax.config import ConfigValueError
    from paravt_jax.configs import eval as eval_config
    from paravt_jax.eval import driver

    config = eval_config.get_config("synthetic")
    config.driver.max_turn, config.driver.n_frames = 2, 4  # typos in a config file
    config.driver.prompt.overview_visual = "video"  # set per benchmark (grounding_visual for charades)
    config.driver.protocol.final_answer_tokens = 9  # set per question type (mcq_answer_tokens, ...)
    config.driver.think_prefix = True  # a key of the driver section before its prompt subsection
    for check in (check_config, lambda c: driver.driver_config(build_run(c))):
        with pytest.raises(ConfigValueError) as err:
            check(config)
        message = str(err.value)
        assert "driver.max_turn: not a field of DriverConfig (its fields: prompt_mode, nframes, max_turns" in message
        assert "driver.n_frames: not a field of DriverConfig" in message
        assert ("driver.prompt.overview_visual: PromptFormat.overview_visual is set by the code (the benchmark: "
                "grounding_visual for charades" in message)
        assert ("driver.protocol.final_answer_tokens: ToolProtocol.final_answer_tokens is set by the code "
                "(mcq_answer_tokens or grounding_answer_tokens, by question type)" in message)
        assert "driver.think_prefix: not a field of DriverConfig" in message
        assert message.count("; it is driver.prompt.think_prefix") == 1
        assert len(err.value.problems) == 5
    flat = eval_config.get_config("synthetic")
    # a config file in the flat layout of before: keys no command reads
    flat.nframes, flat.batch_size, flat.video_frames = 8, 2, 16
    with pytest.raises(ConfigValueError) as err:
        check_config(flat)
    assert [str(p) for p in err.value.problems] == [
        f"{key}: a field of the driver section, not read at the top level; set driver.{where}"
        for key, where in (("batch_size", "batch_size"), ("nframes", "nframes"),
                           ("video_frames", "prompt.overview_video_frames"))]  # ConfigDict keys, sorted
    with pytest.raises(Exception, match="nframes"):  # the command line adds no key
        parse_eval("--config.nframes=8")


def parse_eval(*overrides):
    return parse(*overrides, config="eval.py:synthetic")


DRIVER_CHOICES = {"prompt_mode": "direct", "dispatch": "sequential", "prompt.video_path_line": "newline",
                  "protocol.frames_response": "timestamped", "protocol.malformed": "respond",
                  "protocol.extra_calls": "respond", "crop_arguments": "strict", "prompt.overview_sizing": "single",
                  "crop_sizing": "single"}


def test_every_driver_field_is_settable_from_the_command_line():
    """Every DriverConfig field (its prompt format's and tool protocol's too) is a key of
    configs/eval.py's driver section that `--config.driver.KEY=VALUE` sets and that reaches the
    built DriverConfig of a benchmark, or a field the driver sets (the system text, the
    overview visual, the final-answer turn: what its prompt mode, benchmark and question type say)."""
    from paravt_jax.eval import driver
    from paravt_jax.eval.settings import PROMPT_SET_BY, PROTOCOL_SET_BY, DriverConfig

    default = driver.driver_config(build_run(parse_eval()))
    expected, overrides, set_by_driver = {}, [], []
    for name, key, set_by in fields_and_keys(DriverConfig, "driver"):
        if key is None:
            assert set_by
            set_by_driver.append(name)
            continue
        field = key.split(".", 1)[1]
        owner = type(field_of(default, field.rsplit(".", 1)[0])) if "." in field else DriverConfig
        hint = typing.get_type_hints(owner)[field.rsplit(".", 1)[-1]]
        value, text = ((DRIVER_CHOICES[field],) * 2 if field in DRIVER_CHOICES
                       else other_value(name, hint, field_of(default, field)))
        overrides.append(f"--config.driver.{field}={text}")
        expected[field] = value
    assert sorted(set_by_driver) == sorted([f"PromptFormat.{f}" for f in PROMPT_SET_BY]
                                           + [f"ToolProtocol.{f}" for f in PROTOCOL_SET_BY])
    assert "prompt.overview_timestamps" in expected and "protocol.final_answer_prefix" in expected
    config = parse_eval(*overrides)
    built = driver.driver_config(build_run(config), "videomme")
    assert {k: field_of(built, k) for k in expected} == expected
    charades = driver.driver_config(build_run(config), "charades")
    assert (charades.prompt_mode, charades.prompt.overview_visual) == ("agentic_minimal", "video")


@pytest.mark.parametrize("study", ["toy_paradox", "toy_paradox_varied", "toy_long", "toy_long_pilot"])
def test_the_toy_studies_keep_the_recipe_they_ran_with_after_the_main_job_changed(study):
    """docs/toy_paradox.md and docs/long_rl.md ran on the toy preset of before the main job took
    its 450 + 80-step recipe: their cold start stays 600 SFT steps at K = 4 and their RL draws K
    from every gating budget, while the main job's preset is the new recipe."""
    from paravt_jax.configs import ablations
    from paravt_jax.data import gating

    config, main = ablations.get_config(study), paragrpo.get_config("toy")
    assert (config.sft.steps, tuple(config.sft.nframes_choices)) == (600, ())
    assert tuple(config.rl.nframes_choices) == gating.NFRAMES_CHOICES
    assert tuple(config.evals.held_out.after_sft) == (4,)
    assert (config.sft.optimizer.schedule, config.sft.direct_from_nframes, config.rl.tool_free_share) == (
        "constant", 0, 0.0)
    assert (main.sft.optimizer.schedule, main.sft.direct_from_nframes, main.rl.tool_free_share) == ("wsd", 64, 0.25)
    assert (config.sft.train_width, main.sft.train_width, main.rl.eval_every) == (512, 1024, 0)
    assert (main.sft.steps, tuple(main.sft.nframes_choices), main.rl.steps) == (450, (4, 8, 16, 4, 8, 16, 64), 80)
    assert tuple(main.rl.nframes_choices) == (4, 32, 64) and tuple(main.evals.held_out.after_sft) == (4, 64)
    if study == "toy_paradox":
        assert (config.rl.steps, config.rl.optimizer.learning_rate) == (12, 1e-4)
