"""The evaluation commands end to end: `compare` on the synthetic benchmark, `eval` of two
checkpoints (the driver's protocol, batching, resume and keyed records run by default:
tests/unit/test_eval_driver.py)."""
import io
import json
import os
from contextlib import redirect_stdout

from paravt_jax.eval import driver
from unit import test_eval_driver as unit_tests
from unit.test_eval_driver import ROOT

assets = unit_tests.assets  # the fixture


def test_cli_compare_on_the_synthetic_benchmark(assets, tmp_path):
    """End to end with the real tiny model: parallel vs sequential dispatch, per-dataset JSON,
    summary_all.json and the comparison table."""
    from paravt_jax.cli import main

    out = io.StringIO()
    with redirect_stdout(out):
        status = main(["paravt-jax", "eval", f"--config={ROOT}/configs/eval.py:synthetic", f"--output_dir={tmp_path}",
              f"--config.data.builtin_root={os.path.dirname(assets.model_dir)}", "--limit=2", "--compare",
              "--config.driver.nframes=4", "--config.driver.max_new_tokens=8", "--config.driver.max_turns=1"])
    text = out.getvalue()
    assert status == 0, text[-2000:]
    assert "| synthetic | parallel |" in text and "| synthetic | sequential |" in text
    for dispatch in driver.DISPATCH:
        summary = json.load(open(tmp_path / dispatch / "summary_all.json"))["synthetic"]
        assert summary["complete"] and summary["total"] == 2 and summary["dispatch"] == dispatch
        assert len(json.load(open(tmp_path / dispatch / "synthetic.json"))["results"]) == 2
    assert set(json.load(open(tmp_path / "compare.json"))["synthetic"]) == set(driver.DISPATCH)


def test_cli_eval_twice_with_two_checkpoints(assets, tmp_path, capsys):
    """`paravt-jax eval` of two checkpoints into one directory: the second is refused naming the
    checkpoint (status 2), and with --overwrite gives its own, correctly labelled summary."""
    import shutil

    from paravt_jax.cli import main

    copy = tmp_path / "copy"
    shutil.copytree(assets.model_dir, copy)
    out = tmp_path / "out"
    common = ["eval", f"--config={ROOT}/configs/eval.py:synthetic", f"--output_dir={out}", "--limit=1",
              f"--config.data.builtin_root={os.path.dirname(os.path.dirname(assets.model_dir))}",
              "--config.data.num_train=2", "--config.data.num_eval=6", "--config.driver.nframes=2",
              "--config.driver.max_new_tokens=4", "--config.driver.max_turns=1"]
    assert main(["paravt-jax", *common]) == 0
    first = json.load(open(out / "summary_all.json"))["synthetic"]
    assert first["producer"]["checkpoint"]["path"] == assets.model_dir
    capsys.readouterr()
    assert main(["paravt-jax", *common, f"--config.model.checkpoint={copy}"]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint.path: '{assets.model_dir}' -> '{copy}'" in err and "--overwrite" in err
    assert main(["paravt-jax", *common, f"--config.model.checkpoint={copy}", "--overwrite"]) == 0
    second = json.load(open(out / "summary_all.json"))["synthetic"]
    assert second["producer"]["checkpoint"]["path"] == str(copy) and second["producer_id"] != first["producer_id"]
    assert second["total"] == 1 and second["complete"]
