import io
import os
import subprocess
from contextlib import redirect_stdout

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def builtin_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("builtin"))


def run_cli(*args):
    from paravt_jax.cli import main

    out = io.StringIO()
    with redirect_stdout(out):
        main(["paravt-jax", *args])
    return out.getvalue()


def test_forward_main_job_with_overrides(builtin_root):
    text = run_cli("forward", f"--config={ROOT}/configs/base.py:tiny",
                   f"--config.data.builtin_root={builtin_root}", "--config.demo.frames=4",
                   "--config.demo.repeats=2")
    lines = dict(line.split(None, 1) for line in text.splitlines()[1:] if "  " in line.strip())
    assert "True" in text.split("logits_finite")[1].splitlines()[0]
    assert "(4 overview frames)" in text
    assert builtin_root in text
    assert lines


def test_launch_scripts_dry_run():
    env = dict(os.environ, DRY_RUN="1")
    out = subprocess.run(["bash", f"{ROOT}/launch/local.sh"], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "python -m paravt_jax.cli forward --config=configs/base.py:tiny"
    out = subprocess.run(["bash", f"{ROOT}/launch/local.sh", "forward", "--config=configs/base.py:small125m"],
                         capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "python -m paravt_jax.cli forward --config=configs/base.py:small125m"


def test_unknown_command_and_field_are_refused(builtin_root):
    with pytest.raises(SystemExit, match="unknown command 'fly'"):
        run_cli("fly")
    with pytest.raises(Exception, match="no_such_field"):
        run_cli("forward", f"--config={ROOT}/configs/base.py:tiny", "--config.model.no_such_field=1")
