"""One run per workdir (the lock) under one config (the stored config), through the library and
the command line."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from paravt_jax.cli import workdirs
from paravt_jax.infra import locking
from paravt_jax.infra.locking import Holder, WorkdirLock, WorkdirLocked
from paravt_jax.run_config import build_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


# A process taking a workdir's lock at a set moment: prints "won" (then holds the lock until its
# stdin closes) or "locked", and how late it started.
TAKER = """
import sys, time
from paravt_jax.infra.locking import WorkdirLock, WorkdirLocked
workdir, start = sys.argv[1], float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
late = time.time() - start
try:
    lock = WorkdirLock(workdir, command="take").acquire()
except WorkdirLocked:
    print("locked", late, flush=True)
else:
    print("won" if lock.took_over is None else "took-over", late, flush=True)
    sys.stdin.read()
    lock.release()
"""


def race(workdir: str, takers: int = 6) -> list[str]:
    """`takers` processes taking the lock of `workdir` at the same moment; their outcomes."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    start = time.time() + 6  # every process imported and waiting by then
    processes = [subprocess.Popen([sys.executable, "-c", TAKER, workdir, str(start)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env) for _ in range(takers)]
    try:
        lines = [p.stdout.readline().split() for p in processes]
    finally:
        for p in processes:
            p.stdin.close()
            p.wait(timeout=60)
    assert all(len(line) == 2 for line in lines), lines
    assert max(float(late) for _, late in lines) < 1.0, lines  # they did race
    return sorted(outcome for outcome, _ in lines)


def test_processes_taking_a_gs_workdir_at_once_one_wins(gcs_emulator):
    """The lock end to end on gs://: of six processes taking a free workdir at the same moment
    one wins, and of six taking over a stale lock (another host, silent too long) one does; the
    others are refused. (Processes start too far apart on two cores to catch check-then-write
    out; the threads of the next test do.)"""
    from paravt_jax.infra import storage

    workdir = f"{gcs_emulator}/raced"
    assert race(workdir) == ["locked"] * 5 + ["won"]
    assert not storage.exists(f"{workdir}/{locking.LOCK_NAME}")  # the winner let go
    stale = Holder("other-host", 4242, "run", 0.0, time.time() - locking.STALE_AFTER_S - 1, "t0")
    storage.write_atomic(f"{workdir}/{locking.LOCK_NAME}", stale.encode())
    assert race(workdir) == ["locked"] * 5 + ["took-over"]


def test_the_bucket_stores_compare_and_swap_has_one_winner(gcs_emulator):
    """Eight threads, each with its own BucketStore, creating one absent lock at the same moment,
    then replacing the same version of it, in five rounds: each time exactly one succeeds. (Check,
    then write, as before, let two or three win in the first round.)"""
    import threading

    path = f"{gcs_emulator}/cas/{locking.LOCK_NAME}"

    def at_once(step, name: str) -> list[bool]:
        barrier, results = threading.Barrier(8), [None] * 8

        def take(i):
            store = locking.BucketStore()
            barrier.wait()
            results[i] = step(store, f"{name} {i}".encode())  # records are never written twice

        threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results

    store = locking.BucketStore()
    for n in range(5):
        created = at_once(lambda s, data: s.create(path, data), f"create {n}")
        current = store.read(path)
        assert created.count(True) == 1 and current == f"create {n} {created.index(True)}".encode()
        replaced = at_once(lambda s, data, current=current: s.replace(path, data, expected=current), f"replace {n}")
        assert replaced.count(True) == 1 and store.read(path) == f"replace {n} {replaced.index(True)}".encode()
        assert store.delete(path, expected=store.read(path))


def test_a_gs_lock_taken_over_is_not_claimed_by_its_stalled_holder(gcs_emulator):
    """The heartbeat and the release are generation-matched: once another host has replaced a
    lock, the old holder's heartbeat stops and its release deletes nothing."""
    from paravt_jax.infra import storage

    workdir = f"{gcs_emulator}/stalled"
    lock = WorkdirLock(workdir, heartbeat_s=0.05).acquire()
    assert isinstance(lock.store, locking.BucketStore)
    first = Holder.decode(lock.held)
    time.sleep(0.5)
    beat = Holder.decode(storage.read_bytes(lock.path))
    assert beat.heartbeat > first.heartbeat and beat.token == first.token
    other, store = Holder("other-host", 7, "", 0, 0, "x"), locking.BucketStore()
    while not store.replace(lock.path, other.encode(), expected=store.read(lock.path)):
        pass
    time.sleep(0.5)
    assert lock.held is None  # the heartbeat saw the replacement and stopped
    lock.release()
    assert Holder.decode(storage.read_bytes(lock.path)).host == "other-host"  # not deleted
    assert not store.replace(lock.path, b"{}", expected=first.encode())  # an old version changes nothing
    assert store.delete(lock.path, expected=other.encode()) and not storage.exists(lock.path)


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
    assert workdirs.check_config(workdir, workdirs.config_record(build_run(config), "run")) == []
    config.rl.steps, config.sft.steps, config.mesh.fsdp = 40, 900, 2  # run length and placement
    config.evals.held_out.concurrent = config.rl.evals.eval.concurrent = 2  # evaluation speed
    assert workdirs.check_config(workdir, workdirs.config_record(build_run(config), "run")) == []
    config.rl.optimizer.learning_rate, config.evals.held_out.nframes = 1e-3, (4,)
    with pytest.raises(workdirs.ConfigChanged, match=r"evals\.held_out\.nframes: \[4, 64\] -> \[4\]; "
                       r"rl.optimizer.learning_rate: 0.0001 -> 0.001\).*--config_changed=ok"):
        workdirs.check_config(workdir, workdirs.config_record(build_run(config), "run"))
    with pytest.raises(workdirs.ConfigChanged, match=r"command: 'run' -> 'train'"):
        workdirs.check_config(workdir, workdirs.config_record(build_run(paragrpo.get_config("tiny")), "train"))
    changes = workdirs.check_config(workdir, workdirs.config_record(build_run(config), "run"), config_changed="ok")
    assert len(changes) == 2 and json.loads((tmp_path / workdirs.CHANGES_NAME).read_text())["changes"] == changes
    stored = json.loads((tmp_path / workdirs.CONFIG_NAME).read_text())
    assert stored["config"]["rl"]["optimizer"]["learning_rate"] == 1e-3  # the new config is the stored one
    assert workdirs.check_config(workdir, workdirs.config_record(build_run(config), "run")) == []


def test_a_finished_run_is_not_left_alone_under_another_config(tmp_path, capsys):
    """Today a rerun with another config resumes silently or reports the finished run; both are
    refused now, through the command line, before any work (status 2)."""
    from paravt_jax.cli import main
    from paravt_jax.configs import paragrpo

    workdirs.check_config(str(tmp_path), workdirs.config_record(build_run(paragrpo.get_config("tiny")), "run"))
    (tmp_path / "summary.json").write_text(json.dumps({"eval": []}))
    assert main(["paravt-jax", "run", f"--config={ROOT}/configs/paragrpo.py:tiny", f"--workdir={tmp_path}",
                 "--config.rl.optimizer.learning_rate=0.5"]) == 2
    err = capsys.readouterr().err
    assert "rl.optimizer.learning_rate: 0.0001 -> 0.5" in err and "--config_changed=ok" in err
    assert not (tmp_path / locking.LOCK_NAME).exists()  # the refused run let go of the lock
