"""Two real runs in one workdir (the lock's refusal through the command line runs by default:
tests/integration/test_workdirs.py)."""
import os
import subprocess
import sys
import time

from integration.test_workdirs import HOST, ROOT
from paravt_jax.infra import locking


def test_two_real_runs_in_one_workdir(tmp_path):
    """Two `paravt-jax sft` processes on one workdir: the second is refused at once with the
    first's host and pid (status 2); the first, stopped by SIGTERM, lets go of the lock."""
    import signal

    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    args = [sys.executable, "-m", "paravt_jax.cli", "sft", f"--config={ROOT}/configs/sft.py:tiny",
            f"--workdir={tmp_path / 'run'}", f"--config.data.builtin_root={tmp_path / 'builtin'}"]
    first = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lock = tmp_path / "run" / locking.LOCK_NAME
        deadline = time.time() + 120
        while not lock.exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert lock.exists(), first.stderr.read() if first.poll() is not None else "no lock after 120 s"
        second = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
        assert second.returncode == 2, second.stderr[-2000:]
        assert f"is in use by pid {first.pid} on host {HOST} (sft, since" in second.stderr
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 128 + signal.SIGTERM
        assert not lock.exists()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
