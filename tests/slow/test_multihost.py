"""Asynchronous rollouts across two processes (the slow tier: ~60 s; the default tier runs
asynchronous rollouts in one process, tests/integration/test_async_rl.py, and two processes
synchronously, tests/integration/test_multihost.py)."""
import json
import os

import numpy as np

from integration.test_multihost import DATA, _free_port, _json, _run_workers


def test_two_processes_train_asynchronously_on_split_meshes(tmp_path, builtin_root):
    """mesh.rollout_devices=4 over 2 processes x 4 devices: each process samples its share of a
    step on its own 2 devices (tensor=2) while the 4 others (2 a process) train, up to 1 version
    stale; the weights cross to the rollout devices after every update (collective, from the
    trainers' threads). Every step is logged once, within the bound, over the whole batch."""
    from paravt_jax.data.builtin import ensure_builtin

    ensure_builtin(builtin_root, **DATA)  # before the workers, which would race to create it
    coordinator = f"localhost:{_free_port()}"
    envs = [{"PARAVT_COORDINATOR": coordinator, "PARAVT_NUM_PROCESSES": "2", "PARAVT_PROCESS_ID": str(i)}
            for i in range(2)]
    base = str(tmp_path / "split")
    _run_workers({"split": (base, 4, envs)}, "train",
                 [f"--config.data.builtin_root={builtin_root}", "--config.rl.steps=3",
                  "--config.mesh.rollout_devices=4", "--config.rl.max_staleness=1"])
    with open(os.path.join(base, "work", "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    assert [m["step"] for m in lines] == [0, 1, 2]
    for m in lines:
        assert 0 <= m["rl/staleness"] <= m["rl/staleness_max"] <= 1 and m["rl/rollouts"] == 4, m
        assert m["rl/policy_version"] == m["step"] - m["rl/staleness_max"] and np.isfinite(m["rl/loss"])
    shares = [_json(os.path.join(base, "out", f"rollouts_{i}.json")) for i in range(2)]
    assert [len(steps) for steps in shares] == [3, 3] and all(len(s) == 2 for steps in shares for s in steps)
