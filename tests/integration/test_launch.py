"""Launch scripts (dry runs and a recorded real run with a fake gcloud) and mesh presets.

Dry runs execute with a PATH whose `gcloud`, `ssh`, `scp`, `rsync` and `nvidia-smi` are fakes
that record the call and fail, so a dry run that touched any of them fails its test.
"""
import dataclasses
import math
import os
import shlex
import stat
import subprocess
import sys

import pytest

from paravt_jax.infra import meshes
from paravt_jax.run_config import build_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.path.join(ROOT, "launch")
TOOLS = ("gcloud", "ssh", "scp", "rsync", "nvidia-smi")
SECRET = "s3cr3t value'with quotes"


# ----------------------------------------------------------------------------- helpers
def write_tool(directory, name: str, body: str) -> None:
    path = directory / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


@pytest.fixture
def sandbox(tmp_path):
    """A controlled environment whose external tools record each call to calls.log and fail."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    calls = tmp_path / "calls.log"
    for tool in TOOLS:
        write_tool(fake_bin, tool, f'echo "{tool} $*" >> {calls}\nexit 97\n')
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "HOME": str(home), "USER": "tester",
           "TMPDIR": str(tmp_path), "PYTHON": sys.executable, "LANG": "C.UTF-8"}
    return dataclasses.make_dataclass("Sandbox", ["env", "calls", "path", "bin"])(
        env, calls, tmp_path, fake_bin)


def launch(sandbox, script: str, *args: str, check: bool = True, **settings: str):
    if script == "tpu_pod.sh":  # multi-host slices need a shared workdir
        settings.setdefault("BUCKET", "gs://test-bucket/runs")
    env = dict(sandbox.env, **settings)
    result = subprocess.run(["bash", os.path.join(LAUNCH, script), *args], env=env,
                            capture_output=True, text=True, timeout=60, cwd=str(sandbox.path))
    if check:
        assert result.returncode == 0, result.stderr
    return result


def dry(sandbox, script: str, *args: str, **settings: str) -> list[str]:
    """The printed commands of a dry run (without the '+ '), after checking no tool ran."""
    settings.setdefault("RUN_NAME", "r1")
    settings.setdefault("RESULTS_DIR", str(sandbox.path / "results"))
    settings.setdefault("LOG_DIR", str(sandbox.path / "logs") if script == "gpu.sh" else "logs/r1")
    result = launch(sandbox, script, *args, DRY_RUN="1", **settings)
    assert not sandbox.calls.exists(), f"dry run called: {sandbox.calls.read_text()}"
    assert not (sandbox.path / "results").exists() and not (sandbox.path / "logs").exists()
    lines = result.stdout.splitlines()
    assert all(line.startswith(("+ ", "# ")) for line in lines), result.stdout
    return [line[2:] for line in lines if line.startswith("+ ")]


def words(command: str) -> list[str]:
    return shlex.split(command)


def remote_command(line: str) -> str:
    """The --command=... of a gcloud ssh line."""
    (command,) = [w[len("--command="):] for w in words(line) if w.startswith("--command=")]
    return command


def exports(remote: str) -> dict[str, str]:
    """NAME=value words after `export` in a remote shell line, up to the next '&&'."""
    tokens = words(remote)
    start = tokens.index("export") + 1
    end = tokens.index("&&", start)
    return dict(token.split("=", 1) for token in tokens[start:end])


def python_argv(remote: str) -> list[str]:
    tokens = words(remote)
    start = next(i for i, t in enumerate(tokens) if t.endswith("/bin/python"))
    end = next((i for i in range(start, len(tokens)) if tokens[i] in ("2>&1", ">", "|")), len(tokens))
    return tokens[start + 1:end]


# ----------------------------------------------------------------------------- all scripts
def test_every_launch_script_parses_and_new_ones_are_strict():
    scripts = sorted(f for f in os.listdir(LAUNCH) if f.endswith(".sh"))
    assert {"local.sh", "tpu_pod.sh", "gpu.sh", "env.sh"} <= set(scripts)
    for script in scripts:
        result = subprocess.run(["bash", "-n", os.path.join(LAUNCH, script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{script}: {result.stderr}"
    for script in ("tpu_pod.sh", "gpu.sh", "local.sh"):
        assert "set -euo pipefail" in open(os.path.join(LAUNCH, script)).read()


@pytest.mark.parametrize("script,names", [
    ("tpu_pod.sh", ["TPU_NAME=paravt-tester", "ZONE=", "ACCELERATOR_TYPE=v5p-32", "CREATE=0",
                    "DELETE=0", "GIT_URL", "LOGS=0", "DRY_RUN=0", "BUCKET=gs://test-bucket/runs",
                    "WORKDIR=gs://test-bucket/runs/", "HOSTS=<from ACCELERATOR_TYPE>", "SHARED_FS=0"]),
    ("gpu.sh", ["HOSTS=", "GPUS_PER_HOST=", "COORDINATOR=", "SHARED_FS=0", "DRY_RUN=0",
                "--xla_gpu_enable_latency_hiding_scheduler=true"]),
    ("local.sh", ["DRY_RUN=1", "launch/gpu.sh"]),
])
def test_help_lists_settings_with_defaults(sandbox, script, names):
    result = launch(sandbox, script, "--help")
    for name in names:
        assert name in result.stdout, (name, result.stdout)
    assert not sandbox.calls.exists()


def test_local_dry_run_passes_arguments_through(sandbox):
    lines = launch(sandbox, "local.sh", "forward", "--config=configs/base.py:small125m",
                   "--config.model.dtype=bfloat16", DRY_RUN="1").stdout.splitlines()
    assert lines == ["python -m paravt_jax.cli forward --config=configs/base.py:small125m "
                     "--config.model.dtype=bfloat16"]
    assert not sandbox.calls.exists()


@pytest.mark.parametrize("args,want", [
    ((), "run --config=configs/paragrpo.py:toy"),
    (("train", "--config.rl.steps=2"), "train --config=configs/paragrpo.py:toy --config.rl.steps=2"),
    (("forward",), "forward --config=configs/base.py:tiny"),
    (("report", "runs/ablations"), "report runs/ablations"),  # a workdir, no config
    (("eval", "--config.model.checkpoint=runs/x"), "eval --config.model.checkpoint=runs/x"),
])
def test_local_default_config_only_for_commands_that_read_one(sandbox, args, want):
    lines = launch(sandbox, "local.sh", *args, DRY_RUN="1").stdout.splitlines()
    assert lines == ["python -m paravt_jax.cli " + want]


@pytest.mark.parametrize("script", ["gpu.sh", "tpu_pod.sh"])
def test_the_default_workdir_is_the_jobs_own_so_a_requeued_job_resumes(sandbox, script):
    """No timestamp: the same call (a requeue) gets the same workdir; another config another one."""
    def workdir(*args, **settings):
        if script == "tpu_pod.sh":  # a one-host slice: a workdir on the worker's own disk is allowed
            settings = {"BUCKET": "", "ACCELERATOR_TYPE": "v5p-8", **settings}
        result = launch(sandbox, script, *args, DRY_RUN="1", GPUS_PER_HOST="1", **settings)
        (line,) = [l for l in result.stdout.splitlines() if "paravt_jax.cli" in l]
        return [w for w in words(line[2:]) + words(remote_command(line[2:]) if "--command=" in line else "")
                if w.startswith("--workdir=")][-1]

    first = workdir("train", "--config=configs/paragrpo.py:qwen3vl_8b", "--config.rl.steps=10")
    assert first == "--workdir=runs/train-paragrpo-qwen3vl_8b"
    assert workdir("train", "--config=configs/paragrpo.py:qwen3vl_8b", "--config.rl.steps=10") == first
    assert workdir("run", CONFIG="configs/sft.py:toy") == "--workdir=runs/run-sft-toy"
    assert workdir("train", RUN_NAME="lr-sweep/a") == "--workdir=runs/lr-sweep-a"


def test_launch_headers_name_a_checkpoint_and_data():
    """The example commands of the scripts' headers never train a random model on toy data."""
    for script in ("gpu.sh", "tpu_pod.sh"):
        header = open(os.path.join(LAUNCH, script)).read().split("set -euo pipefail")[0]
        for name in ("model.checkpoint=", "data.rl_train=", "data.sft=", "data.video_root="):
            assert name in header, (script, name)
        for line in header.splitlines():
            if "qwen3vl_8b" in line and "bash launch/" in line and "LOGS=1" not in line:
                assert "$DATA" in line, (script, line)


# ----------------------------------------------------------------------------- tpu_pod.sh
TRAIN_ARGS = ("train", "--config=configs/paragrpo.py:qwen3vl_8b", "--config.rl.steps=10",
              "--config.generate.question=what's in it?")


def test_tpu_dry_run_runs_on_all_workers_in_order(sandbox):
    lines = dry(sandbox, "tpu_pod.sh", *TRAIN_ARGS, TPU_NAME="pod-a", ZONE="us-central2-b",
                ACCELERATOR_TYPE="v5p-8", BUCKET="")  # one host: a worker-local workdir
    assert not any(" create " in l or " delete " in l for l in lines)
    gcloud = [l for l in lines if l.startswith("gcloud ")]
    for line in gcloud:
        w = words(line)
        assert "--zone=us-central2-b" in w and ("pod-a" in w or any(x.startswith("pod-a:") for x in w))
    # Copy, setup and run touch every worker; copying back reads worker 0 only.
    kinds = []
    for line in gcloud:
        w = words(line)
        worker = [x for x in w if x.startswith("--worker=")]
        assert worker == (["--worker=0"] if "--recurse" in w else ["--worker=all"]), line
        command = remote_command(line) if w[4] == "ssh" else ""
        kinds.append("setup" if "launch/env.sh" in command else "run" if "paravt_jax.cli" in command
                     else "untar" if "tar -xzf" in command else "fetch" if "--recurse" in w else "copy")
    assert kinds == ["copy", "untar", "setup", "run", "fetch", "fetch"]
    assert any(l.startswith("tar -czf") and "--exclude=./.venv" in words(l) for l in lines)

    setup = remote_command(gcloud[2])
    assert "PARAVT_EXTRAS=tpu" in words(setup)
    run = remote_command(gcloud[3])
    assert exports(run)["JAX_PLATFORMS"] == "tpu" and exports(run)["PARAVT_RUN_NAME"] == "r1"
    assert python_argv(run) == ["-m", "paravt_jax.cli", *TRAIN_ARGS, "--workdir=runs/r1"]
    assert run.rstrip().endswith("| tee -a logs/r1/$(hostname).log")  # a resumed run adds to its log
    assert "paravt_jax/runs/r1" in gcloud[4] and "paravt_jax/logs/r1" in gcloud[5]


def test_tpu_create_and_delete_only_when_asked(sandbox):
    lines = dry(sandbox, "tpu_pod.sh", "run", CREATE="1", DELETE="1", SPOT="1", TPU_NAME="pod-b",
                ACCELERATOR_TYPE="v5e-16", PROJECT="proj-1")
    first, last = words(lines[0]), words(lines[-1])
    assert first[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "pod-b"]
    assert {"--accelerator-type=v5litepod-16", "--version=v2-alpha-tpuv5-lite", "--spot",
            "--project=proj-1"} <= set(first)
    assert last[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "pod-b"] and "--quiet" in last
    assert sum(" create " in l for l in lines) == 1 and sum(" delete " in l for l in lines) == 1

    lines = dry(sandbox, "tpu_pod.sh", "run", CREATE="1", RESERVED="1", ACCELERATOR_TYPE="v4-64")
    assert "--reserved" in words(lines[0]) and "--version=tpu-ubuntu2204-base" in words(lines[0])
    assert not any(" delete " in l for l in lines)

    refused = launch(sandbox, "tpu_pod.sh", "run", check=False, DRY_RUN="1", SPOT="1", RESERVED="1")
    assert refused.returncode == 2 and "SPOT=1 and RESERVED=1" in refused.stderr


def test_tpu_multi_host_slices_default_to_a_shared_workdir_and_refuse_a_local_one(sandbox):
    lines = dry(sandbox, "tpu_pod.sh", "train", BUCKET="gs://b/paravt/")
    run = remote_command([l for l in lines if "paravt_jax.cli" in l][0])
    assert python_argv(run)[-1] == "--workdir=gs://b/paravt/r1"
    for accelerator, hosts in (("v5p-32", 4), ("v5e-16", 4), ("v6e-64", 16), ("v4-16", 2)):
        for workdir in ("--workdir=runs/x", "--workdir=/mnt/x"):
            refused = launch(sandbox, "tpu_pod.sh", "train", workdir, check=False, DRY_RUN="1",
                             ACCELERATOR_TYPE=accelerator)
            assert refused.returncode == 2 and refused.stdout == "", refused.stdout
            assert f"{workdir} is on each worker's own disk" in refused.stderr
            assert f"has {hosts} hosts: set BUCKET=gs://" in refused.stderr
        refused = launch(sandbox, "tpu_pod.sh", "sft", check=False, DRY_RUN="1", ACCELERATOR_TYPE=accelerator,
                         BUCKET="")
        assert refused.returncode == 2 and "--workdir=runs/sft is on" in refused.stderr  # the default WORKDIR
    refused = launch(sandbox, "tpu_pod.sh", "sft", check=False, DRY_RUN="1", ACCELERATOR_TYPE="v9-8", BUCKET="")
    assert refused.returncode == 2 and "an unknown number of hosts" in refused.stderr
    for settings in ({"ACCELERATOR_TYPE": "v5e-8"}, {"ACCELERATOR_TYPE": "v9-8", "HOSTS": "1"},
                     {"SHARED_FS": "1"}):  # one host, or a path every worker mounts
        lines = dry(sandbox, "tpu_pod.sh", "sft", BUCKET="", **settings)
        assert python_argv(remote_command([l for l in lines if "paravt_jax.cli" in l][0]))[-1] == "--workdir=runs/r1"


def test_tpu_git_mode_and_gcs_workdir(sandbox):
    lines = dry(sandbox, "tpu_pod.sh", "sft", GIT_URL="https://example.org/paravt.git", GIT_REF="v1.2",
                WORKDIR="gs://bucket/runs/r1")
    assert not any(l.startswith("tar ") for l in lines)
    pull = remote_command(lines[0])
    assert "git clone --quiet https://example.org/paravt.git paravt_jax" in pull
    assert "fetch --quiet origin v1.2" in pull and "checkout --quiet --force --detach FETCH_HEAD" in pull
    assert "--worker=all" in words(lines[0])
    run = remote_command([l for l in lines if "paravt_jax.cli" in l][0])
    assert python_argv(run)[-1] == "--workdir=gs://bucket/runs/r1"
    assert not any("paravt_jax/gs:" in l for l in lines)  # nothing to copy from a bucket
    assert sum("--recurse" in l for l in lines) == 1  # worker 0's logs only


def test_tpu_secrets_are_passed_but_never_printed(sandbox):
    result = launch(sandbox, "tpu_pod.sh", "run", DRY_RUN="1", RUN_NAME="r1", WANDB_API_KEY=SECRET,
                    PASS_ENV="EXTRA_SETTING", EXTRA_SETTING="visible-value")
    assert SECRET not in result.stdout + result.stderr and "s3cr3t" not in result.stdout
    assert "\"$WANDB_API_KEY\"" in result.stdout
    lines = [l[2:] for l in result.stdout.splitlines() if l.startswith("+ ")]
    (copy,) = [l for l in lines if ".paravt-secrets-r1.sh" in l and l.startswith("gcloud compute tpus tpu-vm scp")]
    assert "--worker=all" in words(copy)
    run = remote_command([l for l in lines if "paravt_jax.cli" in l][0])
    assert ". ./.paravt-secrets-r1.sh && rm -f ./.paravt-secrets-r1.sh" in run
    assert exports(run)["EXTRA_SETTING"] == "visible-value" and "WANDB_API_KEY" not in exports(run)
    # Without secrets in the environment there is no secrets file at all.
    assert not any("paravt-secrets" in l for l in dry(sandbox, "tpu_pod.sh", "run"))


def test_tpu_logs_mode_and_mesh_preset(sandbox):
    lines = dry(sandbox, "tpu_pod.sh", LOGS="1", TPU_NAME="pod-c")
    assert len(lines) == 1 and "--worker=0" in words(lines[0])
    assert "tail -n 200 -F logs/r1/*.log" in remote_command(lines[0])

    lines = dry(sandbox, "tpu_pod.sh", "train", "--config.mesh.fsdp=3", MESH_PRESET="2xv5p-128")
    argv = python_argv(remote_command([l for l in lines if "paravt_jax.cli" in l][0]))
    assert argv[-3:] == ["--config.mesh.data=2", "--config.mesh.fsdp=64", "--config.mesh.tensor=1"]
    assert "--config.mesh.fsdp=3" in argv  # kept, but the preset comes later and wins

    # eval takes no --workdir: only worker 0's logs come back.
    lines = dry(sandbox, "tpu_pod.sh", "eval", "--config=configs/eval.py:synthetic")
    assert not any("--workdir" in l for l in lines)
    (copy_back,) = [l for l in lines if "--recurse" in l]
    assert "paravt-tester:paravt_jax/logs/r1" in words(copy_back)


def fake_gcloud(sandbox, fail_when: str) -> None:
    """A gcloud that records its arguments, keeps copies of scp'd secrets files, and fails
    when its arguments contain `fail_when`."""
    keep = sandbox.path / "kept"
    keep.mkdir()
    write_tool(sandbox.bin, "gcloud", f"""echo "gcloud $*" >> {sandbox.calls}
for a in "$@"; do
  if [[ -f "$a" && "$a" == *secrets* ]]; then cp -p "$a" {keep}/secrets.sh; fi
done
if [[ -n "{fail_when}" && "$*" == *"{fail_when}"* ]]; then exit 3; fi
exit 0
""")


def test_tpu_real_run_deletes_after_a_failure_and_ships_secrets_privately(sandbox):
    fake_gcloud(sandbox, fail_when="paravt_jax.cli")
    result = launch(sandbox, "tpu_pod.sh", "train", check=False, DELETE="1", COPY_CODE="0", SETUP="0",
                    RUN_NAME="r2", RESULTS_DIR=str(sandbox.path / "results"), WANDB_API_KEY=SECRET)
    assert result.returncode != 0
    calls = sandbox.calls.read_text().splitlines()
    assert "paravt_jax.cli" in calls[1] and " delete " in calls[-1], calls
    assert any("--recurse" in c for c in calls)  # what the failed run left is still copied back
    assert SECRET not in result.stdout + result.stderr
    kept = sandbox.path / "kept" / "secrets.sh"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    echoed = subprocess.run(["bash", "-c", f'. {kept} && printf %s "$WANDB_API_KEY"'],
                            capture_output=True, text=True, check=True).stdout
    assert echoed == SECRET
    assert not list(sandbox.path.glob("paravt-secrets-*"))  # the local copy is gone
    assert (sandbox.path / "results" / "launch.log").exists()


def test_tpu_real_run_never_deletes_a_slice_it_failed_to_create(sandbox):
    fake_gcloud(sandbox, fail_when=" create ")
    result = launch(sandbox, "tpu_pod.sh", "run", check=False, CREATE="1", DELETE="1", COPY_CODE="0",
                    SETUP="0", RUN_NAME="r3", RESULTS_DIR=str(sandbox.path / "results"))
    assert result.returncode == 3
    assert [c.split()[4] for c in sandbox.calls.read_text().splitlines()] == ["create"]


# ----------------------------------------------------------------------------- gpu.sh
def gpu_launches(lines: list[str]) -> list[tuple[str, str, str]]:
    """(stdin feed, host, remote command) of each per-host launch line."""
    out = []
    for line in lines:
        if "paravt_jax.cli" not in line:
            continue
        feed, _, ssh_part = line.rpartition("| ssh ") if "| ssh " in line else ("", "", line[len("ssh "):])
        tokens = words("ssh " + ssh_part)
        host_index = next(i for i, t in enumerate(tokens[1:], 1)
                          if not t.startswith("-") and tokens[i - 1] != "-o")
        out.append((feed, tokens[host_index], tokens[host_index + 1]))
    return out


def test_gpu_two_hosts_get_distinct_process_ids(sandbox):
    lines = dry(sandbox, "gpu.sh", *TRAIN_ARGS, HOSTS="alice@gpu-a gpu-b", MESH_PRESET="gpu16")
    copies = [words(l) for l in lines if l.startswith("rsync ") and "--exclude=/.venv" in l]
    assert [c[-1] for c in copies] == ["alice@gpu-a:paravt_jax/", "gpu-b:paravt_jax/"]
    setups = [l for l in lines if "launch/env.sh" in l]
    assert len(setups) == 2 and all("PARAVT_EXTRAS=gpu" in words(words(l)[-1]) for l in setups)
    launches = gpu_launches(lines)
    assert [host for _, host, _ in launches] == ["alice@gpu-a", "gpu-b"]
    for process_id, (feed, _, remote) in enumerate(launches):
        env = exports(remote)
        assert env["PARAVT_COORDINATOR"] == "gpu-a:12355"
        assert env["PARAVT_NUM_PROCESSES"] == "2" and env["PARAVT_PROCESS_ID"] == str(process_id)
        assert env["JAX_PLATFORMS"] == "cuda" and env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
        assert "--xla_gpu_enable_latency_hiding_scheduler=true" in env["XLA_FLAGS"].split()
        assert python_argv(remote) == ["-m", "paravt_jax.cli", *TRAIN_ARGS, "--workdir=runs/r1",
                                       "--config.mesh.data=2", "--config.mesh.fsdp=8",
                                       "--config.mesh.tensor=1"]
        assert feed == ""  # no secrets set: ssh -n
    assert [l.endswith("&") for l in lines if "paravt_jax.cli" in l] == [True, True]
    assert any(l.endswith(f"tee -a {sandbox.path}/logs/host-1.log | sed -u 's/^/[host 1] /' &") for l in lines)
    assert "wait" in lines
    (fetch,) = [words(l) for l in lines if l.startswith("rsync ") and "/.venv" not in l]
    assert fetch[-2:] == ["alice@gpu-a:paravt_jax/runs/r1/", f"{sandbox.path}/results/"]


def test_gpu_shared_filesystem_builds_once_and_copies_nothing(sandbox):
    lines = dry(sandbox, "gpu.sh", "run", HOSTS="n1 n2 n3", SHARED_FS="1", GPUS_PER_HOST="4",
                COORDINATOR="10.0.0.1:9999")
    assert not any(l.startswith("rsync") for l in lines)
    (setup,) = [l for l in lines if "launch/env.sh" in l]
    assert words(setup)[-2] == "n1" and f"cd {ROOT} &&" in words(setup)[-1]
    launches = gpu_launches(lines)
    assert [exports(r)["PARAVT_PROCESS_ID"] for _, _, r in launches] == ["0", "1", "2"]
    assert {exports(r)["PARAVT_COORDINATOR"] for _, _, r in launches} == {"10.0.0.1:9999"}
    assert {exports(r)["CUDA_VISIBLE_DEVICES"] for _, _, r in launches} == {"0,1,2,3"}


def test_gpu_secrets_go_through_stdin_only(sandbox):
    result = launch(sandbox, "gpu.sh", "run", DRY_RUN="1", RUN_NAME="r1", HOSTS="h1 h2",
                    HF_TOKEN=SECRET, LOG_DIR=str(sandbox.path / "logs"))
    assert SECRET not in result.stdout + result.stderr
    for feed, _, remote in gpu_launches([l[2:] for l in result.stdout.splitlines() if l.startswith("+ ")]):
        assert feed == "printf 'export %s=%q\\n' HF_TOKEN \"$HF_TOKEN\" "
        assert remote.startswith("cd paravt_jax && . /dev/stdin && export ")
        assert "HF_TOKEN" not in exports(remote)


def test_gpu_single_machine_runs_here_without_distributed_settings(sandbox):
    lines = dry(sandbox, "gpu.sh", "forward", "--config=configs/base.py:small125m", GPUS_PER_HOST="2")
    assert not any(l.startswith(("ssh", "rsync")) for l in lines)
    assert "env PARAVT_EXTRAS=gpu PARAVT_VENV=.venv-gpu bash launch/env.sh" in lines
    (run,) = [words(l) for l in lines if "paravt_jax.cli" in l]
    assert "CUDA_VISIBLE_DEVICES=0,1" in run and not any(w.startswith("PARAVT_") and "PROCESS" in w for w in run)
    assert run[run.index(".venv-gpu/bin/python"):run.index("2>&1")] == [
        ".venv-gpu/bin/python", "-m", "paravt_jax.cli", "forward", "--config=configs/base.py:small125m"]


def test_gpu_refuses_a_mesh_preset_of_another_size(sandbox):
    result = launch(sandbox, "gpu.sh", "run", check=False, DRY_RUN="1", MESH_PRESET="gpu16")
    assert result.returncode == 2 and "gpu16 is for 16 GPUs, but the hosts have 8" in result.stderr
    result = launch(sandbox, "gpu.sh", "run", check=False, DRY_RUN="1", MESH_PRESET="gpu7")
    assert result.returncode != 0 and "known presets" in result.stderr


def test_gpu_xla_flags_are_known_to_the_installed_xla(sandbox):
    """XLA aborts on an unknown flag, so a misspelt default would kill every GPU run."""
    lines = dry(sandbox, "gpu.sh", "run", GPUS_PER_HOST="1")
    (run,) = [words(l) for l in lines if "paravt_jax.cli" in l]
    flags = next(w for w in run if w.startswith("XLA_FLAGS="))[len("XLA_FLAGS="):]
    assert flags.count("--xla_gpu_") >= 1
    env = dict(sandbox.env, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    check = subprocess.run([sys.executable, "-c", "import jax.numpy as jnp; print(float(jnp.ones(3).sum()))"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0 and check.stdout.strip() == "3.0", check.stderr[-2000:]


# ----------------------------------------------------------------------------- mesh presets
def test_every_preset_is_consistent():
    assert len(meshes.MESHES) >= 20
    for name, preset in meshes.MESHES.items():
        meshes.validate_mesh(name, preset)
        shape = meshes.mesh_shape(name)
        assert list(shape) == ["data", "fsdp", "tensor"]
        assert math.prod(shape.values()) == preset["devices"], name
        assert math.prod(preset["ici"].values()) * math.prod(preset["dcn"].values()) == preset["devices"]
        assert math.prod(preset["dcn"].values()) == preset["slices"], name
        assert preset["devices"] % preset["hosts"] == 0
        assert preset["device_memory_gb"] == meshes.DEVICE_MEMORY_GB[preset["accelerator"]]
        # FSDP inside a slice, never across the DCN; tensor parallel never across it either.
        assert preset["dcn"]["fsdp"] == preset["dcn"]["tensor"] == 1, name
    assert meshes.DEVICE_MEMORY_GB == {"v4": 32, "v5e": 16, "v5p": 95, "h100": 80, "h200": 141}


def test_named_presets_have_the_expected_layout():
    multi = meshes.get_mesh("2xv5p-128")
    assert multi["ici"] == {"data": 1, "fsdp": 64, "tensor": 1}
    assert multi["dcn"] == {"data": 2, "fsdp": 1, "tensor": 1}
    assert (multi["devices"], multi["hosts"], multi["slices"], multi["accelerator_type"]) == (128, 32, 2, "v5p-128")
    assert meshes.get_mesh("v5p-32")["devices"] == 16 and meshes.get_mesh("v5p-32")["hosts"] == 4
    assert meshes.get_mesh("v5e-8")["hosts"] == 1 and meshes.get_mesh("v5e-8")["accelerator_type"] == "v5litepod-8"
    assert meshes.get_mesh("v4-64")["devices"] == 32
    assert meshes.mesh_shape("gpu16") == {"data": 2, "fsdp": 8, "tensor": 1}
    assert meshes.mesh_shape("gpu8_tp2") == {"data": 1, "fsdp": 4, "tensor": 2}
    assert meshes.get_mesh("gpu8-h200")["device_memory_gb"] == 141
    for n in (1, 2, 4, 8):
        assert meshes.get_mesh(f"gpu{n}")["devices"] == n


def test_unknown_and_broken_presets_are_refused():
    with pytest.raises(KeyError, match="unknown mesh preset 'v9-8'.*v5p-32.*gpu16"):
        meshes.get_mesh("v9-8")
    copy = meshes.get_mesh("v5p-32")
    copy["ici"]["fsdp"] = 3
    assert meshes.MESHES["v5p-32"]["ici"]["fsdp"] == 16  # get_mesh hands out copies
    with pytest.raises(ValueError, match="'v5p-32'.* = 3 devices, but devices=16"):
        meshes.validate_mesh("v5p-32", copy)
    with pytest.raises(ValueError, match="ici axes"):
        meshes.validate_mesh("x", dict(meshes.get_mesh("gpu8"), ici={"data": 1, "fsdp": 8}))
    with pytest.raises(ValueError, match="dcn.data=0"):
        meshes.validate_mesh("x", dict(meshes.get_mesh("gpu8"), dcn={"data": 0, "fsdp": 1, "tensor": 1}))
    with pytest.raises(ValueError, match="spans 2 slices, but slices=1"):
        broken = meshes.get_mesh("gpu16")
        broken["slices"] = 1
        meshes.mesh_shape(broken)


def test_command_line_of_the_mesh_table(tmp_path):
    # What the launch scripts run: this checkout's table, from any directory, without JAX.
    env = dict(os.environ, PYTHONPATH=ROOT)
    run = lambda *a: subprocess.run([sys.executable, "-m", "paravt_jax.infra.meshes", *a], env=env, cwd=tmp_path,
                                    capture_output=True, text=True)
    assert run("--overrides", "v5p-32").stdout.split() == [
        "--config.mesh.data=1", "--config.mesh.fsdp=16", "--config.mesh.tensor=1"]
    bad = run("v5p-33")
    assert bad.returncode == 2 and "known presets" in bad.stderr
    assert "2xv5p-128" in run("--list").stdout
    bare = subprocess.run([sys.executable, "-c", "import sys, paravt_jax.infra.meshes; print('jax' in sys.modules)"],
                          env=env, cwd=tmp_path, capture_output=True, text=True)
    assert bare.stdout.strip() == "False", bare.stderr


def test_preset_reaches_the_config_and_builds_a_mesh_on_fake_devices():
    import jax
    from absl import flags
    from ml_collections import config_flags

    from paravt_jax.cli import assembly
    from paravt_jax.configs import base

    assert jax.device_count() == 8

    config = meshes.apply_mesh_preset(base.get_config("tiny"), "gpu8_tp2")
    assert build_run(config).mesh.axes() == {"data": 1, "fsdp": 4, "tensor": 2}
    mesh = assembly.build_mesh(build_run(config))
    assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2}

    # The overrides the launch scripts append parse in the real config flag system.
    argv = ["prog", f"--config={ROOT}/configs/base.py:tiny", *meshes.command_line_overrides("gpu8_tp4")]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values, sys_argv=argv)
    flag_values(argv)
    assert build_run(flag_values.config).mesh.axes() == meshes.mesh_shape("gpu8_tp4")


def test_hybrid_mesh_single_slice_on_fake_devices():
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from paravt_jax.infra import sharding as sh

    preset = meshes.get_mesh("gpu8_tp2")
    mesh = sh.make_hybrid_mesh(preset["ici"], preset["dcn"])
    assert meshes.MESH_AXES == sh.MESH_AXES  # the table's stdlib copy of the axis order
    assert mesh.axis_names == sh.MESH_AXES and dict(mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2}
    assert sorted(d.id for d in mesh.devices.flat) == list(range(8))
    values = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    placed = jax.device_put(values, NamedSharding(mesh, PartitionSpec("fsdp", "tensor")))
    assert placed.sharding.shard_shape(values.shape) == (2, 3)
    np.testing.assert_array_equal(np.asarray(placed), values)

    with pytest.raises(ValueError, match="2 slices or hosts.*1 slices and 1 processes"):
        sh.make_hybrid_mesh({"fsdp": 4}, {"data": 2})  # one process cannot be two hosts
    with pytest.raises(ValueError, match="needs 16 devices, 8 available"):
        sh.make_hybrid_mesh({"fsdp": 16})
    with pytest.raises(ValueError, match="fsdp=-1 must be a positive int"):
        sh.make_hybrid_mesh({"fsdp": -1})
    with pytest.raises(ValueError, match="unknown axes \\['expert'\\]"):
        sh.make_hybrid_mesh({"expert": 8})


@dataclasses.dataclass(frozen=True)
class FakeDevice:
    """Just the attributes mesh_utils reads; platform "cpu" keeps the layout a plain reshape."""
    id: int
    process_index: int
    slice_index: int | None = None
    platform: str = "cpu"
    device_kind: str = "fake"


def test_hybrid_arrangement_puts_each_slice_in_its_own_dcn_block():
    from paravt_jax.infra import sharding as sh

    # Interleaved ids so that a plain reshape would mix the slices.
    tpu = [FakeDevice(id=i, process_index=i // 4, slice_index=i % 2) for i in range(16)]
    preset = meshes.get_mesh("gpu16")  # ici fsdp 8, dcn data 2
    array = sh.hybrid_device_array(preset["ici"], preset["dcn"], tpu)
    assert array.shape == (2, 8, 1)
    for block in range(2):
        assert {d.slice_index for d in array[block].flat} == {block}

    # GPU hosts have no slices: one process per host is the unit across the DCN.
    gpus = [FakeDevice(id=i, process_index=i % 2) for i in range(16)]
    array = sh.hybrid_device_array({"fsdp": 4, "tensor": 2}, {"data": 2}, gpus)
    assert array.shape == (2, 4, 2)
    for block in range(2):
        assert {d.process_index for d in array[block].flat} == {block}


def test_gpu_real_run_over_a_fake_ssh_reaches_each_process(sandbox):
    """ssh is replaced by a local shell with an EMPTY environment, so the secret can only
    arrive through stdin; the "python" on each host reports what it received."""
    hosts = sandbox.path / "hosts"
    for host in ("h0", "h1"):
        python = hosts / host / "paravt_jax" / ".venv-gpu" / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text(f'#!/bin/bash\nok=no; [[ "$HF_TOKEN" != {shlex.quote(SECRET)} ]] || ok=yes\n'
                          'echo "id=$PARAVT_PROCESS_ID of $PARAVT_NUM_PROCESSES at $PARAVT_COORDINATOR '
                          'devices=$CUDA_VISIBLE_DEVICES token_ok=$ok args=$*"\n'
                          'exit $(( PARAVT_PROCESS_ID == ${FAIL_ID:--1} ? 5 : 0 ))\n')
        python.chmod(0o755)
    write_tool(sandbox.bin, "ssh", f"""echo "ssh $*" >> {sandbox.calls}
while [[ "$1" == -* ]]; do [[ "$1" == -o ]] && shift; shift; done
host="$1"; shift
cd {hosts}/"$host" && exec env -i PATH=/usr/bin:/bin FAIL_ID="$FAKE_FAIL_ID" bash -c "$*"
""")
    write_tool(sandbox.bin, "rsync", f'echo "rsync $*" >> {sandbox.calls}\n')
    settings = dict(HOSTS="h0 h1", GPUS_PER_HOST="2", COPY_CODE="0", SETUP="0", RUN_NAME="r4",
                    LOG_DIR=str(sandbox.path / "logs"), RESULTS_DIR=str(sandbox.path / "results"),
                    HF_TOKEN=SECRET, FAKE_FAIL_ID="")
    result = launch(sandbox, "gpu.sh", "eval", "--limit=2", "--workdir=runs/e", **settings)
    for i in (0, 1):
        log = (sandbox.path / "logs" / f"host-{i}.log").read_text()
        assert log.strip() == (f"id={i} of 2 at h0:12355 devices=0,1 token_ok=yes "
                               "args=-m paravt_jax.cli eval --limit=2 --workdir=runs/e")
        assert f"[host {i}] id={i} of 2" in result.stdout
    assert SECRET not in result.stdout + result.stderr
    fetch = sandbox.calls.read_text().splitlines()[-1]
    assert fetch.startswith("rsync -az") and "h0:paravt_jax/runs/e/" in fetch  # host 0's results

    failed = launch(sandbox, "gpu.sh", "eval", check=False, **dict(settings, FAKE_FAIL_ID="1"))
    assert failed.returncode == 1 and "host 1 (h1) failed" in failed.stderr


# ----------------------------------------------------------------------------- env.sh
def test_env_builds_only_what_a_request_lacks(tmp_path):
    """env.sh keeps a venv whose stamps cover the requested extras (the main job asks for none,
    the tests for `test`), installs into it through requirements.lock when they do not, and
    drops stamps of an older setup.py or lock. pip is a fake that records its arguments."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log, python_log = tmp_path / "pip.log", tmp_path / "python.log"
    write_tool(venv / "bin", "python", f'echo "$*" >> {python_log}\n')
    write_tool(venv / "bin", "pip", f'echo "$*" >> {log}\n')

    def env(extras=None, **more):
        environ = {**os.environ, "PARAVT_VENV": str(venv), **more}
        environ.pop("PARAVT_EXTRAS", None)
        if extras is not None:
            environ["PARAVT_EXTRAS"] = extras
        out = subprocess.run(["bash", os.path.join(LAUNCH, "env.sh")], env=environ, capture_output=True,
                             text=True, check=True)
        return out.stdout.strip(), out.stderr

    def installs():
        return [line for line in log.read_text().splitlines() if "-e" in line] if log.exists() else []

    def stamps():
        return sorted(p.name.rsplit("-", 1)[1] for p in venv.glob(".paravt-setup-*"))

    def byte_compiles():  # compileall runs: an environment with extras is byte-compiled, the runtime's not
        lines = python_log.read_text().splitlines() if python_log.exists() else []
        return [line for line in lines if "compileall" in line]

    (venv / ".paravt-setup-0123456789abcdef-test").touch()  # a build of another setup.py
    python, err = env("")  # the main job: the runtime alone
    assert python == f"{venv}/bin/python" and "extras: none" in err
    lock = f"-c {ROOT}/requirements.lock"
    assert installs() == [f"install -q --no-compile -e {ROOT} {lock}"] and stamps() == ["none"]
    assert byte_compiles() == []
    assert env("") == (python, "")  # met: nothing built
    _, err = env()  # the tests: the test extra, installed into the same venv
    assert "extras: test" in err and installs()[-1] == f"install -q --no-compile -e {ROOT}[test] {lock}"
    assert len(byte_compiles()) == 1 and "-j 0" in byte_compiles()[0]
    assert stamps() == ["none", "test"]
    count = len(installs())
    assert env("")[1] == "" and env("test")[1] == "" and len(installs()) == count
    env("test,gpu")
    assert installs()[-1] == f"install -q --no-compile -e {ROOT}[test,gpu] {lock}" and "test,gpu" in stamps()
    assert env("gpu")[1] == "" and len(installs()) == count + 1  # covered by test,gpu
    # without the lock: setup.py's ranges, under a stamp of their own (a locked build does not meet it)
    _, err = env("", PARAVT_LOCK="0")
    assert "extras: none" in err and installs()[-1] == f"install -q --no-compile -e {ROOT}" and stamps() == ["none"]
