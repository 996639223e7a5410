"""paravt_jax.infra.storage on local paths and on gs:// (a real GCS API emulator on 127.0.0.1), and
the workdir writers on gs://: checkpoints, metrics, TensorBoard events, a killed run resumed."""
import json
import os

import jax
import numpy as np
import pytest

from paravt_jax.infra import storage
from paravt_jax.infra.storage import write_json_atomic


def test_write_json_atomic_replaces_and_cleans_up(tmp_path):
    path = str(tmp_path / "summary.json")
    write_json_atomic(path, {"eval": [1, 2]})
    write_json_atomic(path, {"eval": [3], "where": tmp_path})  # a Path goes through str()
    with open(path) as f:
        assert json.load(f) == {"eval": [3], "where": str(tmp_path)}
    assert os.listdir(tmp_path) == ["summary.json"]


def test_only_local_paths_and_gs_urls():
    assert storage.is_remote("gs://b/run") and not storage.is_remote("runs/x")
    assert storage.join("gs://b/run", "rl", "metrics.jsonl") == "gs://b/run/rl/metrics.jsonl"
    assert storage.absolute("gs://b/run") == "gs://b/run"
    with pytest.raises(ValueError, match="s3://b/run: only local paths and gs:// URLs"):
        storage.exists("s3://b/run")


@pytest.fixture(params=["local", "gs"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "root")
    bucket = request.getfixturevalue("gcs_emulator")
    return f"{bucket}/{request.node.name.replace('[', '-').rstrip(']')}"


def test_the_same_operations_on_local_paths_and_gs(root):
    j = storage.join
    assert not storage.exists(root) and storage.listdir(root) == []
    storage.makedirs(j(root, "a"))
    storage.write_atomic(j(root, "a", "x.json"), b'{"v": 1}')
    storage.write_json_atomic(j(root, "a", "x.json"), {"v": 2})  # replaced whole
    storage.write_atomic(j(root, "b.txt"), "text")
    assert json.loads(storage.read_bytes(j(root, "a", "x.json"))) == {"v": 2}
    assert storage.read_text(j(root, "b.txt")) == "text"
    assert storage.listdir(root) == ["a", "b.txt"] and storage.listdir(j(root, "a")) == ["x.json"]
    assert storage.isdir(j(root, "a")) and not storage.isfile(j(root, "a"))
    assert storage.isfile(j(root, "b.txt")) and not storage.isdir(j(root, "b.txt"))
    assert not storage.exists(j(root, "missing"))
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(j(root, "missing"))

    appender = storage.Appender(j(root, "a", "log.jsonl"))
    for i in range(3):
        appender.write(f"{i}\n")
        assert storage.read_text(j(root, "a", "log.jsonl")) == "".join(f"{k}\n" for k in range(i + 1))
    appender.sync()
    appender.close()
    again = storage.Appender(j(root, "a", "log.jsonl"))  # a later writer continues the file
    again.write(b"3\n")
    again.close()
    assert storage.read_text(j(root, "a", "log.jsonl")) == "0\n1\n2\n3\n"

    storage.makedirs(j(root, "model"))
    for name in ("old-shard.bin", "keep.txt"):
        storage.write_atomic(j(root, "model", name), b"old")
    with storage.staged_directory(j(root, "model"), last=("config.json",)) as local:
        assert os.path.isdir(local)
        for name, data in (("config.json", b"{}"), ("keep.txt", b"new"), ("weights.bin", b"w")):
            with open(os.path.join(local, name), "wb") as f:
                f.write(data)
    # a local directory is written in place (its writer removes what is stale); a gs:// one is
    # uploaded, and files the block did not write are removed
    assert storage.listdir(j(root, "model")) == (["config.json", "keep.txt", "old-shard.bin", "weights.bin"]
                                                 if not storage.is_remote(root) else
                                                 ["config.json", "keep.txt", "weights.bin"])
    assert storage.read_bytes(j(root, "model", "keep.txt")) == b"new"

    storage.remove(j(root, "b.txt"))
    storage.remove(j(root, "b.txt"))  # a missing file is fine
    assert storage.listdir(root) == ["a", "model"]
    storage.rmtree(root)
    assert not storage.exists(root) and storage.listdir(root) == []
    storage.rmtree(root)


def test_a_gs_upload_that_fails_leaves_the_old_object(gcs_emulator):
    """A staged directory whose block raises uploads nothing: the old files stay whole."""
    path = f"{gcs_emulator}/failed-export"
    storage.write_atomic(f"{path}/config.json", b"old")
    with pytest.raises(RuntimeError):
        with storage.staged_directory(path) as local:
            with open(os.path.join(local, "config.json"), "wb") as f:
                f.write(b"new")
            raise RuntimeError("killed while writing")
    assert storage.read_bytes(f"{path}/config.json") == b"old"


def test_gs_appends_read_back_as_the_local_file_and_leave_no_parts(gcs_emulator, tmp_path):
    """Many appends of mixed sizes (an empty one, one without a newline, binary) to gs:// and to a local
    file: after every write the object holds the same bytes as the local file; a later writer
    continues the file; no part object is left beside it. (Their cost: bench/append.py, run by
    tests/integration/test_bench.py: requests and bytes per append constant, where re-uploading grew.)"""
    writes = [json.dumps({"step": i, "pad": "x" * (i * 37 % 300)}).encode() + b"\n" for i in range(40)]
    writes[5:5] = [b"", "caf\u00e9 \u2603\n", b"no newline yet", b" ... now\n", bytes(range(256)) + b"\r\n\r\n"]
    directory = f"{gcs_emulator}/appends"
    local, remote = storage.Appender(str(tmp_path / "metrics.jsonl")), storage.Appender(f"{directory}/metrics.jsonl")
    for i, data in enumerate(writes):
        if i == 30:  # a later writer (a resumed run) continues both files
            local.close(), remote.close()
            local, remote = storage.Appender(local.path), storage.Appender(remote.path)
        local.write(data)
        remote.write(data)
        assert storage.read_bytes(remote.path) == storage.read_bytes(local.path), i
    local.close(), remote.close()
    assert storage.read_bytes(remote.path) == b"".join(w.encode() if isinstance(w, str) else w for w in writes)
    assert storage.listdir(directory) == ["metrics.jsonl"]

    empty = storage.Appender(f"{directory}/empty.log")  # an empty first write creates the file, as locally
    empty.write(b"")
    assert storage.read_bytes(f"{directory}/empty.log") == b""


def test_a_gs_append_is_neither_lost_nor_doubled(gcs_emulator):
    """The compose is conditioned on the file's generation: a file that already holds the write
    (a compose that gcsfs retried after its reply was lost) is taken as written, once; a file
    changed by someone else is an error naming it, and the file is left as it was. Parts a killed
    writer left behind are removed by the next writer."""
    path = f"{gcs_emulator}/append-retry/log.jsonl"
    storage.write_atomic(f"{gcs_emulator}/append-retry/.log.jsonl.append-deadbeef0000", b"a killed writer's part\n")
    appender = storage.Appender(path)
    appender.write("1\n")
    assert storage.listdir(f"{gcs_emulator}/append-retry") == ["log.jsonl"]
    storage.write_atomic(path, "1\n2\n")  # what the first, lost-reply attempt of the next write did
    appender.write("2\n")
    appender.write("3\n")
    assert storage.read_text(path) == "1\n2\n3\n"
    storage.write_atomic(path, "1\n2\nX\n")  # another writer: the same size as ours would be
    with pytest.raises(RuntimeError, match=f"{path}: changed under its appender"):
        appender.write("4\n")
    assert storage.read_text(path) == "1\n2\nX\n"
    assert storage.listdir(f"{gcs_emulator}/append-retry") == ["log.jsonl"]


def test_generation_preconditions_on_gs(gcs_emulator):
    """write_if_generation / remove_if_generation act only on the version read (0: absent)."""
    path = f"{gcs_emulator}/generations/object"
    first = storage.write_if_generation(path, b"one", 0)
    assert first and storage.write_if_generation(path, b"two", 0) is None  # something is there
    assert storage.read_versioned(path) == (b"one", first)
    second = storage.write_if_generation(path, "two", first)
    assert second and second != first and storage.write_if_generation(path, b"three", first) is None
    assert not storage.remove_if_generation(path, first) and storage.read_bytes(path) == b"two"
    assert storage.remove_if_generation(path, second) and not storage.exists(path)
    assert not storage.remove_if_generation(path, second)
    with pytest.raises(FileNotFoundError):
        storage.read_versioned(path)
    with pytest.raises(ValueError, match="runs/x: object generations .* expected a gs:// path"):
        storage.write_if_generation("runs/x", b"", 0)


def test_a_stopped_loop_resumes_from_gs_bit_exact(gcs_emulator, tmp_path):
    """The training loop with its workdir on gs://: orbax checkpoints, metrics.jsonl and the
    TensorBoard events go to the bucket; stopped after step 1 and resumed, it ends with the
    same parameters as an uninterrupted local run, every step logged once."""
    from integration.test_training import _toy_loop
    from paravt_jax.infra.metrics_writer import event_records, parse_event
    from paravt_jax.infra.preemption import Preempted

    straight = _toy_loop(str(tmp_path / "local"), 4)
    workdir = f"{gcs_emulator}/loop"
    with pytest.raises(Preempted, match="checkpoint at step 2 of 4"):
        _toy_loop(workdir, 4, stop_after=1)
    assert storage.listdir(f"{workdir}/checkpoints") == ["2"]
    assert not os.path.exists(workdir) and not os.path.exists("gs:")  # nothing written locally
    resumed = _toy_loop(workdir, 4)
    assert resumed.steps_done == 4 and len(resumed.history) == 2
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(straight.state.params),
                                                    jax.tree.leaves(resumed.state.params), strict=True))
    assert [h["loss"] for h in straight.history[2:]] == [h["loss"] for h in resumed.history]
    lines = [json.loads(line) for line in storage.read_text(f"{workdir}/metrics.jsonl").splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2, 3]
    steps = []
    for name in storage.listdir(f"{workdir}/tensorboard"):
        data = storage.read_bytes(f"{workdir}/tensorboard/{name}")
        steps += [parse_event(body)[0] for _, _, body in event_records(data) if parse_event(body)[1]]
    assert sorted(steps) == [0, 1, 2, 3]


def test_the_main_job_and_export_write_their_files_to_gs(gcs_emulator, tmp_path, builtin_root):
    """`run` and `export` with --workdir=gs://...: the metrics, the cold start's table, the
    summary, the curves, the final model (with its chat template and processor configs) and
    the export are in the bucket, and nothing is written to a local directory of that name."""
    from integration.test_cli import ROOT, run_cli, run_cli_logged
    from paravt_jax.models.qwen3_vl import load_pretrained

    workdir = f"{gcs_emulator}/main-job"
    common = [f"--config={ROOT}/configs/paragrpo.py:tiny", f"--workdir={workdir}",
              f"--config.data.builtin_root={builtin_root}"]
    _, log = run_cli_logged("run", *common, "--config.sft.steps=2", "--config.sft.batch_size=2",
                            "--config.sft.nframes=2", "--config.sft.train_frames=8", "--config.rl.steps=1",
                            "--config.rl.samples_per_prompt=2",
                            "--config.rl.prompts_per_step=1", "--config.rl.rollout.max_new_tokens=4",
                            "--config.rl.rollout.max_turns=1", "--config.rl.rollout.subagent_max_tokens=4",
                            "--config.rl.eval_every=0", "--config.evals.held_out.limit=1",
                            "--config.evals.held_out.nframes=(4,)",
                            "--config.evals.held_out.max_new_tokens=4", "--config.evals.held_out.max_turns=1",
                            "--config.evals.held_out.after_sft=(4,)")
    assert f"[run] workdir {workdir};" in log
    summary = json.loads(storage.read_bytes(f"{workdir}/summary.json"))
    assert summary["workdir"] == workdir and len(summary["sft_loss"]) == 2 and len(summary["rl"]) == 1
    assert summary["curves"] == f"{workdir}/curves.png" and storage.read_bytes(summary["curves"])[:4] == b"\x89PNG"
    assert json.loads(storage.read_bytes(f"{workdir}/sft/eval.json"))["results"] == summary["eval_after_sft"]
    for phase in ("sft", "rl"):
        assert storage.listdir(f"{workdir}/{phase}/tensorboard")
        assert storage.isdir(f"{workdir}/{phase}/checkpoints")
    final = storage.listdir(f"{workdir}/final")
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "preprocessor_config.json",
            "video_preprocessor_config.json"} <= set(final)
    assert not os.path.exists("gs:") and not os.path.exists(os.path.join(ROOT, "gs:"))

    run_cli("export", *common)
    local = tmp_path / "export"
    storage.filesystem().get(f"{workdir}/export/".removeprefix("gs://"), str(local), recursive=True)
    assert load_pretrained(str(local)).config.text.hidden_size == 64
    assert (local / "chat_template.jinja").is_file()
