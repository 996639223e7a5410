"""One run per workdir (the lock) under one config (the stored config), through the library and
the command line."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from paravt_jax import locking, workdirs
from paravt_jax.locking import Holder, WorkdirLock, WorkdirLocked

TIER = "integration"  # processes holding workdir locks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST = socket.gethostname()


def write_holder(workdir, host: str, pid: int, heartbeat: float) -> Holder:
    holder = Holder(host, pid, "run", heartbeat, heartbeat, "t0")
    (workdir / locking.LOCK_NAME).write_bytes(holder.encode())
    return holder


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.fixture
def live_process():
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def test_a_second_run_is_refused_with_the_holders_host_and_pid(tmp_path):
    with WorkdirLock(str(tmp_path), command="train"):
        with pytest.raises(WorkdirLocked, match=rf"in use by pid {os.getpid()} on host {HOST} \(train, since "):
            WorkdirLock(str(tmp_path), command="run").acquire()
    assert not (tmp_path / locking.LOCK_NAME).exists()  # released
    with WorkdirLock(str(tmp_path)) as lock:
        assert lock.took_over is None


def test_stale_locks_are_taken_over(tmp_path, live_process):
    pid = dead_pid()
    write_holder(tmp_path, HOST, pid, time.time())  # this host, a process that is gone
    lock = WorkdirLock(str(tmp_path)).acquire()
    assert lock.took_over.pid == pid and Holder.decode((tmp_path / locking.LOCK_NAME).read_bytes()).pid == os.getpid()
    lock.release()
    write_holder(tmp_path, HOST, live_process.pid, 0.0)  # this host, alive: its heartbeat does not matter
    with pytest.raises(WorkdirLocked, match=f"pid {live_process.pid} on host {HOST}"):
        WorkdirLock(str(tmp_path)).acquire()
    write_holder(tmp_path, "other-host", 4242, time.time())  # another host, beating: alive
    with pytest.raises(WorkdirLocked, match="pid 4242 on host other-host"):
        WorkdirLock(str(tmp_path)).acquire()
    write_holder(tmp_path, "other-host", 4242, time.time() - locking.STALE_AFTER_S - 1)  # silent too long
    with WorkdirLock(str(tmp_path)) as lock:
        assert lock.took_over.host == "other-host"
    (tmp_path / locking.LOCK_NAME).write_bytes(b'{"host": "torn')  # a torn file holds nothing
    with WorkdirLock(str(tmp_path)) as lock:
        assert lock.took_over is None and lock.held


def test_the_heartbeat_keeps_a_lock_fresh_and_a_lost_lock_is_not_claimed(tmp_path):
    lock = WorkdirLock(str(tmp_path), heartbeat_s=0.05).acquire()
    first = Holder.decode(lock.held)
    time.sleep(0.3)
    beat = Holder.decode((tmp_path / locking.LOCK_NAME).read_bytes())
    assert beat.heartbeat > first.heartbeat and beat.started == first.started and beat.token == first.token
    # taken over (through the store, as another process does) while this one stalled
    store, path, other = locking.LocalStore(), str(tmp_path / locking.LOCK_NAME), Holder("other-host", 7, "", 0, 0, "x")
    while not store.replace(path, other.encode(), expected=store.read(path)):
        pass
    time.sleep(0.3)
    lock.release()
    assert Holder.decode((tmp_path / locking.LOCK_NAME).read_bytes()).host == "other-host"  # not deleted


def test_the_command_line_refuses_a_locked_workdir(tmp_path, live_process, capsys):
    from paravt_jax.cli import main

    write_holder(tmp_path, HOST, live_process.pid, time.time())
    assert main(["paravt-jax", "sft", f"--workdir={tmp_path}", "--config.sft.steps=1"]) == 2
    err = capsys.readouterr().err
    assert f"is in use by pid {live_process.pid} on host {HOST}" in err and len(err.strip().splitlines()) == 1
    assert os.listdir(tmp_path) == [locking.LOCK_NAME]  # no work started, no config stored


# ----------------------------------------------------------------------------- stored config
def test_a_rerun_under_another_config_is_refused_with_the_differing_fields(tmp_path):
    from paravt_jax.configs import paragrpo

    config = paragrpo.get_config("tiny")
    workdir = str(tmp_path)
    assert workdirs.check_config(workdir, workdirs.config_record(config, "run")) == []
    config.rl.steps, config.sft.steps, config.mesh.fsdp = 40, 900, 2  # run length and placement
    assert workdirs.check_config(workdir, workdirs.config_record(config, "run")) == []
    config.rl.optimizer.learning_rate, config.eval.nframes = 1e-3, (4,)
    with pytest.raises(workdirs.ConfigChanged, match=r"eval.nframes: \[4, 64\] -> \[4\]; "
                       r"rl.optimizer.learning_rate: 0.0001 -> 0.001\).*--config_changed=ok"):
        workdirs.check_config(workdir, workdirs.config_record(config, "run"))
    with pytest.raises(workdirs.ConfigChanged, match=r"command: 'run' -> 'train'"):
        workdirs.check_config(workdir, workdirs.config_record(paragrpo.get_config("tiny"), "train"))
    changes = workdirs.check_config(workdir, workdirs.config_record(config, "run"), config_changed="ok")
    assert len(changes) == 2 and json.loads((tmp_path / workdirs.CHANGES_NAME).read_text())["changes"] == changes
    stored = json.loads((tmp_path / workdirs.CONFIG_NAME).read_text())
    assert stored["config"]["rl"]["optimizer"]["learning_rate"] == 1e-3  # the new config is the stored one
    assert workdirs.check_config(workdir, workdirs.config_record(config, "run")) == []


def test_a_finished_run_is_not_left_alone_under_another_config(tmp_path, capsys):
    """Today a rerun with another config resumes silently or reports the finished run; both are
    refused now, through the command line, before any work (status 2)."""
    from paravt_jax.cli import main
    from paravt_jax.configs import paragrpo

    workdirs.check_config(str(tmp_path), workdirs.config_record(paragrpo.get_config("tiny"), "run"))
    (tmp_path / "summary.json").write_text(json.dumps({"eval": []}))
    assert main(["paravt-jax", "run", f"--config={ROOT}/configs/paragrpo.py:tiny", f"--workdir={tmp_path}",
                 "--config.rl.optimizer.learning_rate=0.5"]) == 2
    err = capsys.readouterr().err
    assert "rl.optimizer.learning_rate: 0.0001 -> 0.5" in err and "--config_changed=ok" in err
    assert not (tmp_path / locking.LOCK_NAME).exists()  # the refused run let go of the lock


@pytest.mark.slow  # the lock's refusal through the command line runs by default (test_the_command_line_refuses_...)
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
