"""Evaluators chosen by type from the config (eval/registry.py): an evaluations section is
checked entry by entry with dotted paths, the keys it replaced are refused naming their new
place, and the shipped presets build the evaluations they built before it (the same settings,
order, budgets and metric names)."""
import ml_collections
import pytest

from paravt_jax.cli.config_checks import check_config
from paravt_jax.cli.flags import unknown_field
from paravt_jax.config import ConfigValueError
from paravt_jax.configs import paragrpo
from paravt_jax.eval import registry
from paravt_jax.eval.held_out import HeldOut, HeldOutConfig, setting_name
from paravt_jax.eval.settings import BenchmarkConfig
from paravt_jax.rl.trainer import RLConfig, periodic_evaluators
from paravt_jax.run_config import build_run

ROWS = tuple(f"row{i}" for i in range(6))  # stand-ins for held-out rows: an evaluator only keeps them


def test_the_presets_build_the_evaluations_they_built_before_the_registry():
    tiny, toy = paragrpo.get_config("tiny"), paragrpo.get_config("toy")
    # the RL trainer's periodic check: K = 16 on the first 2 rows (toy, when on: K = 64 on 16), K-major, in the
    # rollout's own budget, with the rollouts' fixed shapes
    (check,) = periodic_evaluators(build_run(tiny).rl, list(ROWS))
    assert isinstance(check, HeldOut) and check.name == "eval"
    assert check.rows == ROWS[:2] and check.settings == ((False, 16), (True, 16))
    assert (check.max_new_tokens, check.max_turns, check.mode) == (None, None, None)
    assert check.rollout.prompt_shape.width == 2048  # tiny's rl.shapes.prompt_width
    assert periodic_evaluators(build_run(toy).rl, list(ROWS)) == []  # the main job: no checks during RL
    switched_on = paragrpo.get_config("toy")
    switched_on.rl.eval_every = 16
    (check,) = periodic_evaluators(build_run(switched_on).rl, list(ROWS))
    assert check.rows == ROWS and check.settings == ((False, 64), (True, 64))
    # the main job's tables: after the last phase K = 4 and 64 tools-major on 4 rows in 256 tokens,
    # 2 turns, frames mode; the toy's on every row in 160 tokens, sub-agent mode, and on the cold start
    context = registry.Context(ROWS)
    (final,) = registry.evaluators(build_run(tiny).evals, context, "final")
    assert final.settings == ((False, 4), (False, 64), (True, 4), (True, 64)) and final.rows == ROWS[:4]
    assert (final.max_new_tokens, final.max_turns, final.mode) == (256, 2, "frames")
    assert registry.evaluators(build_run(tiny).evals, context, "after_sft") == []
    (cold,) = registry.evaluators(build_run(toy).evals, context, "after_sft")
    assert cold.settings == ((False, 4), (False, 64), (True, 4), (True, 64)) and cold.rows == ROWS
    assert (cold.max_new_tokens, cold.max_turns, cold.mode) == (160, 2, "subagent")


def test_held_out_outcomes_are_named_after_their_entry():
    """The periodic entry `eval` logs what the curves and reports read: eval_tools/...,
    eval_notools/... at its first K, eval_tools_K{K}/... at the others; another entry its own."""
    assert [setting_name(16, k, tools) for k in (16, 64) for tools in (False, True)] == [
        "eval_notools", "eval_tools", "eval_notools_K64", "eval_tools_K64"]
    assert setting_name(4, 64, True, "dense") == "dense_tools_K64"
    (check,) = periodic_evaluators(RLConfig(eval_every=1, evals={"dense": HeldOutConfig(nframes=(64,))}), ROWS)
    assert check.name == "dense" and check.rows == ROWS


def test_no_evaluator_where_there_is_nothing_to_run():
    assert periodic_evaluators(RLConfig(eval_every=0), ROWS) == []  # off
    assert periodic_evaluators(RLConfig(eval_every=2), []) == []  # no held-out rows
    entries = {"none": HeldOutConfig(nframes=()), "bench": BenchmarkConfig()}
    assert registry.evaluators(entries, registry.Context(ROWS), "after_sft") == []  # benchmarks: not on the cold start
    with pytest.raises(ConfigValueError, match="the benchmark evaluation 'bench' needs an output directory"):
        registry.evaluators(entries, registry.Context(ROWS), "final")
    with pytest.raises(ValueError, match="stage 'later'"):
        registry.evaluators(entries, registry.Context(ROWS), "later")


def test_a_section_round_trips_its_entries():
    entries = {"held_out": HeldOutConfig(nframes=(4, 64), after_sft=(4,), max_turns=3),
               "videomme": BenchmarkConfig(dataset="videomme", annotations="/a", video_dir="/v", limit=5)}
    section = registry.section(entries)
    assert section.held_out.type == "held_out" and section.videomme.type == "benchmark"
    assert registry.build(section, "evals") == entries


def test_an_evaluations_section_is_checked_entry_by_entry():
    """A bad type, an unknown key and a bad value of a nested section, each named by its dotted
    path, all at once."""
    config = paragrpo.get_config("tiny")
    config.evals = registry.section({"held_out": HeldOutConfig(), "bench": BenchmarkConfig()})
    check_config(config)
    config.evals.held_out.type = "greedy"
    config.evals.bench.driver.nframes = 0
    config.evals.bench.nframez = 3
    with pytest.raises(ConfigValueError) as err:
        check_config(config)
    assert sorted(p.field for p in err.value.problems) == ["evals.bench.driver.nframes", "evals.bench.nframez",
                                                          "evals.held_out.type"]
    text = str(err.value)
    assert "evals.held_out.type='greedy': must be one of ('held_out', 'benchmark')" in text
    assert "evals.bench.nframez: not a field of BenchmarkConfig" in text
    assert "evals.bench.driver.nframes=0: must be an integer >= 1" in text
    config = paragrpo.get_config("tiny")
    config.rl.evals.eval.after_sft = (4,)  # the cold start is the main job's
    with pytest.raises(ConfigValueError, match=r"rl\.evals\.eval\.after_sft=\(4,\): the periodic evaluation has no"):
        check_config(config)


def test_the_keys_it_replaced_are_refused_naming_their_new_place():
    config = paragrpo.get_config("tiny")
    assert unknown_field(config, "rl.eval_nframes") == (
        "--config.rl.eval_nframes: moved; it is --config.rl.evals.eval.nframes")
    assert unknown_field(config, "rl.eval_limit") == "--config.rl.eval_limit: moved; it is --config.rl.evals.eval.limit"
    assert unknown_field(config, "eval.after_sft") == (
        "--config.eval.after_sft: moved; it is --config.evals.held_out.after_sft")
    config.rl.eval_limit = 3  # a config file written before
    with pytest.raises(ConfigValueError, match=r"rl\.eval_limit: moved; it is rl\.evals\.eval\.limit"):
        build_run(config)
    config = paragrpo.get_config("tiny")
    config.eval = ml_collections.ConfigDict({"limit": 2})
    with pytest.raises(ConfigValueError, match=r"eval: moved; it is evals\.held_out"):
        check_config(config)
