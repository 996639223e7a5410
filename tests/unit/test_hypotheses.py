"""Hypotheses of a sweep and their verdicts (paravt_jax/experiments/hypotheses.py)."""
import json
import os

import pytest

from paravt_jax.experiments import hypotheses as H
from paravt_jax.experiments import report
from paravt_jax.experiments.report import ArmRun


def arm(name, group, **numbers):
    return ArmRun(name, group, "", True, numbers, {})


def test_judge_holds_fails_and_is_inconclusive_by_one_std():
    assert H.judge([0.10, 0.12, 0.14], "above")[2] == "holds"
    assert H.judge([0.10, 0.12, 0.14], "below")[2] == "fails"
    assert H.judge([0.10, -0.05, 0.02], "above")[2] == "inconclusive"  # mean 0.023 < std 0.076
    assert H.judge([0.0, 0.0, 0.0], "above")[2] == "inconclusive"
    assert H.judge([0.5], "above") == (0.5, 0.0, "one seed")  # no spread to judge against
    mean, std, _ = H.judge([1.0, 2.0, 3.0], "above")
    assert mean == pytest.approx(2.0) and std == pytest.approx(1.0)


def test_differences_pair_seeds_use_a_single_run_for_every_seed_and_thresholds():
    arms = [arm("p,seed=0", "p", acc=0.9, late=0.5, early=0.2), arm("p,seed=1", "p", acc=0.7, late=0.1, early=0.3),
            arm("v,seed=1", "v", acc=0.4), arm("v,seed=0", "v", acc=0.6), arm("_sft", "_sft", acc=0.8)]
    paired = H.Hypothesis("a", "", "p", "acc", against_group="v")
    assert H.differences(paired, arms) == pytest.approx([0.3, 0.3])
    cold = H.Hypothesis("b", "", "p", "acc", against_group="_sft")
    assert H.differences(cold, arms) == pytest.approx([0.1, -0.1])
    own = H.Hypothesis("c", "", "p", "late", against_metric="early", direction="below")
    assert H.differences(own, arms) == pytest.approx([0.3, -0.2])
    threshold = H.Hypothesis("d", "", "p", "late", threshold=0.0)
    assert H.differences(threshold, arms) == pytest.approx([0.5, 0.1])
    (result,) = H.verdicts([threshold], arms)
    assert result.verdict == "holds" and result.mean == pytest.approx(0.3)
    # a group with one finished arm of several is no single run: only its own seed pairs
    partial = arms + [ArmRun("w,seed=1", "w", "", False, {"acc": 0.1}, {}), arm("w,seed=0", "w", acc=0.5)]
    assert H.differences(H.Hypothesis("f", "", "p", "acc", against_group="w"), partial) == pytest.approx([0.4])
    (missing,) = H.verdicts([H.Hypothesis("e", "", "q", "acc", threshold=0.0)], arms)
    assert missing.verdict == "not run" and missing.differences == ()


def test_bad_hypotheses_are_refused():
    with pytest.raises(H.HypothesisError, match="direction"):
        H.Hypothesis("x", "", "g", "m", direction="up", threshold=0.0)
    with pytest.raises(H.HypothesisError, match="against_group, against_metric or threshold"):
        H.Hypothesis("x", "", "g", "m")
    with pytest.raises(H.HypothesisError, match="'x'.*unexpected keyword"):
        H.as_hypotheses([{"name": "x", "claim": "", "group": "g", "metric": "m", "thresold": 0.5}])


def _arm_dir(root, name, accuracy):
    directory = os.path.join(root, name)
    os.makedirs(directory)
    rows = [{"tools": True, "nframes": 4, "accuracy": accuracy, "format_compliance": 1.0, "kappa": 1.0,
             "calls_per_turn": 2.0}]
    with open(os.path.join(directory, "summary.json"), "w") as f:
        json.dump({"eval": rows}, f)


def test_the_report_judges_the_hypotheses_its_sweep_config_defines(tmp_path):
    root = str(tmp_path / "sweep")
    os.makedirs(root)
    config = tmp_path / "study.py"
    config.write_text("def hypotheses(arg):\n"
                      "    assert arg == 'long'\n"
                      "    return [{'name': 'H1', 'claim': 'tools help', 'group': 'p', "
                      "'metric': 'eval_tools_K4_accuracy', 'against_group': '_sft'}]\n")
    with open(os.path.join(root, "sweep.json"), "w") as f:
        json.dump({"config": f"{config}:long", "arms": [{"name": "p,seed=0"}, {"name": "p,seed=1"}]}, f)
    _arm_dir(root, "_sft", 0.5)
    _arm_dir(root, "p,seed=0", 0.75)
    _arm_dir(root, "p,seed=1", 0.70)
    result = report.write_report([root], str(tmp_path / "out" / "report"))
    line = next(line for line in result["text"].splitlines() if line.startswith("| H1 |"))
    assert "+0.250 / +0.200" in line and "+0.225 ± 0.035" in line and "**holds**" in line
    assert "## Hypotheses" in open(tmp_path / "out" / "report.md").read()


def test_the_long_rl_studys_hypotheses_name_its_groups():
    from paravt_jax.configs import ablations
    from paravt_jax.experiments.sweep import build_arms

    claims = H.as_hypotheses(ablations.hypotheses("toy_long"))
    groups = {a.group for a in build_arms(ablations.get_config("toy_long"), ablations.sweep("toy_long"), "toy_long")}
    assert len(claims) == 28 and ablations.hypotheses("tiny") == []
    for h in claims:
        assert h.group in groups and (not h.against_group or h.against_group in groups
                                      | set(ablations.COLD_STARTS.values())), h
