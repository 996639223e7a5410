"""curves.png: each phase on panels of its own step axis; held-out accuracy over RL steps when
the run evaluated periodically."""
import json

from paravt_jax.experiments import plots


def write_metrics(path, phase, steps, every=0):
    with open(path, "w") as f:
        for step in range(steps):
            record = {"step": step, f"{phase}/loss": 1.0 / (step + 1), f"{phase}/grad_norm": 0.5}
            if phase == "rl":
                record.update({"rl/reward": 0.1 * step, "rl/kappa": 0.5})
                if every and (step + 1) % every == 0:
                    record.update({"rl/eval_tools/accuracy": 0.5 + 0.1 * step, "rl/eval_notools/accuracy": 0.25})
            f.write(json.dumps(record) + "\n")


def test_sft_and_rl_get_their_own_panels_and_the_held_out_accuracy_its_own(tmp_path):
    write_metrics(tmp_path / "sft.jsonl", "sft", 20)
    write_metrics(tmp_path / "rl.jsonl", "rl", 6, every=2)
    files = {"sft": str(tmp_path / "sft.jsonl"), "rl": str(tmp_path / "rl.jsonl")}
    series = plots.phase_series(files)
    assert [s for s, _ in series["rl"]["eval_tools/accuracy"]] == [1, 3, 5]
    assert [s for s, _ in series["sft"]["loss"]] == list(range(20)) and "reward" not in series["sft"]
    assert plots.panel_rows(series, list(files)) == [
        ("sft", ["loss", "grad_norm"]), ("rl", ["loss", "reward", "kappa", "grad_norm"]),
        ("rl", [plots.HELD_OUT_PANEL])]
    out = plots.plot_run(files, str(tmp_path / "curves.png"))
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    write_metrics(tmp_path / "rl.jsonl", "rl", 6)  # no periodic evaluation: no accuracy panel
    rows = plots.panel_rows(plots.phase_series(files), list(files))
    assert rows[-1] == ("rl", ["loss", "reward", "kappa", "grad_norm"])
    assert plots.plot_run({"sft": str(tmp_path / "none.jsonl")}, str(tmp_path / "x.png")) is None
