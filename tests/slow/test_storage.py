"""A killed `sft` run on gs:// resumes bit-exact: three `sft` processes, minutes (the loop-level
test on gs:// runs by default: tests/integration/test_storage.py)."""
import json
import signal
import subprocess
import sys

import jax
import numpy as np

from paravt_jax.infra import storage


def test_a_killed_sft_run_on_gs_resumes_bit_exact(gcs_emulator, tmp_path, builtin_root):
    """`paravt-jax sft --workdir=gs://...` killed (SIGKILL) after step 1's metrics line, rerun
    to the end: its checkpoint holds the same parameters as an uninterrupted local run's."""
    import orbax.checkpoint as ocp

    from integration.test_cli_script import ROOT, environment
    from paravt_jax.infra.checkpointing import Checkpointer

    args = [sys.executable, "-m", "paravt_jax.cli", "sft", f"--config={ROOT}/configs/paragrpo.py:tiny",
            f"--config.data.builtin_root={builtin_root}", "--config.sft.steps=3", "--config.sft.batch_size=2",
            "--config.sft.nframes=2", "--config.sft.checkpoint_every=1"]

    def sft(workdir, kill_at=None):
        process = subprocess.Popen([*args, f"--workdir={workdir}"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True, env=environment())
        log = []  # the log lines (stderr), where the metrics line that triggers the kill appears
        try:
            for line in process.stderr:
                log.append(line)
                if kill_at and kill_at in line:
                    process.send_signal(signal.SIGKILL)
                    kill_at = None
            status = process.wait(timeout=600)
        finally:
            if process.poll() is None:
                process.kill()
        return status, "".join(log)

    status, err = sft(str(tmp_path / "straight"))
    assert status == 0, err[-3000:]
    remote = f"{gcs_emulator}/sft-killed"
    status, err = sft(remote, kill_at="[sft/ 1/3]")
    assert status == -signal.SIGKILL, err[-3000:]
    assert storage.exists(f"{remote}/checkpoints/1")
    status, err = sft(remote)
    assert status == 0, err[-3000:]
    assert f"[sft] resumed from {remote}/checkpoints at step" in err
    lines = [json.loads(line) for line in storage.read_text(f"{remote}/metrics.jsonl").splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2]

    def params(directory):
        checkpointer = Checkpointer(directory)
        assert checkpointer.latest_step() == 3
        return checkpointer.manager.restore(3, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))["state"]["params"]

    local, resumed = params(str(tmp_path / "straight" / "checkpoints")), params(f"{remote}/checkpoints")
    leaves = jax.tree.leaves(local)
    assert leaves and all(np.array_equal(a, b) for a, b in zip(leaves, jax.tree.leaves(resumed), strict=True))
