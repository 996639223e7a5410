"""Evaluation driver: prompt modes, batched protocol, resume, sharding, comparison, CLI."""
import dataclasses
import glob
import hashlib
import json
import os

import numpy as np
import pytest

from paravt_jax.agent.protocol import PromptFormat
from paravt_jax.data.builtin import ensure_builtin
from paravt_jax.eval import datasets, driver, prompts
from paravt_jax.eval import records as store
from paravt_jax.run_config import build_run
from paravt_jax.text import chat
from paravt_jax.text.tokenizer import Tokenizer
from support.scripted import ScriptedSampler

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return ensure_builtin(str(tmp_path_factory.mktemp("builtin")), num_train=2, num_eval=6)


@pytest.fixture(scope="module")
def tokenizer(assets):
    return Tokenizer.from_directory(assets.model_dir)


@pytest.fixture(scope="module")
def benchmark(assets):
    return datasets.load_benchmark("synthetic", os.path.join(assets.data_dir, "rl_eval.parquet"), assets.data_dir)


CALLS = "<think>look</think>" + "".join(
    '<tool_call>\n{"name": "crop_video", "arguments": {"video_path": "v.mp4", '
    f'"start_time": {s}, "end_time": {s + 3}}}}}\n</tool_call>' for s in (1, 6))


def half_call_tools(prompt_text: str, sample: int) -> list[str]:
    """Deterministic per prompt: half the prompts call crop_video twice in each of the two tool
    rounds, then answer C when forced; the rest answer at once with a letter of their own."""
    digest = int(hashlib.sha1(prompt_text.encode()).hexdigest(), 16)
    if digest % 2:
        return [CALLS, CALLS, "C"]
    return [f"<think>sure</think><answer>{'ABCD'[digest % 4]}</answer>"]


def scripted(tokenizer):
    return ScriptedSampler(tokenizer, half_call_tools)


def policy_rows(sampler) -> int:
    """Rows the episodes' first turns were generated for (finished samples are never run)."""
    return sum(call.rows for call in sampler.calls if call.kind == "policy")


def config(**kw):
    base = dict(nframes=4, max_turns=2, max_new_tokens=128, mcq_answer_tokens=4, grounding_answer_tokens=5,
                batch_size=4, crop_max_pixels=96 * 160,
                prompt=dataclasses.replace(PromptFormat.reference_eval(), overview_max_pixels=96 * 160))
    base.update(kw)
    return driver.DriverConfig(**base)


def strip_timing(summary):
    return {k: v for k, v in summary.items() if k not in ("elapsed", "samples_per_minute")}


def test_prompt_modes():
    minimal = prompts.prompt_mode("agentic_minimal")
    assert minimal.tools and minimal.system == chat.tools_system_prompt([prompts.EVAL_CROP_TOOL])
    general = prompts.prompt_mode("agentic_general")
    assert general.tools and '"name": "crop_video"' in general.system and "<answer>" in general.system
    assert json.loads(general.system.split("<tools>\n")[1].split("\n</tools>")[0]) == prompts.EVAL_CROP_TOOL
    assert not prompts.prompt_mode("direct").tools and "<answer></answer>" in prompts.prompt_mode("direct").system
    assert "<think>" in prompts.prompt_mode("reasoning").system
    with pytest.raises(ValueError, match="agentic_sage"):
        prompts.prompt_mode("agentic_sage")
    assert "X.X - Y.Y seconds" in prompts.final_instruction("tvg")
    with pytest.raises(ValueError, match=r"dispatch='async': must be one of \('parallel', 'sequential'\)"):
        driver.DriverConfig(dispatch="async")


def test_protocol_records_and_batching(benchmark, tokenizer, tmp_path):
    sampler = scripted(tokenizer)
    summary = driver.run_dataset(sampler, tokenizer, benchmark, config(), str(tmp_path), log=lambda _: None)
    records = store.read_records([store.shard_path(str(tmp_path), "synthetic", 0, 1)])
    assert summary["complete"] and sorted(records) == list(range(len(benchmark.samples)))
    kinds = {s.question_type for s in benchmark.samples}
    assert policy_rows(sampler) == len(benchmark.samples) and len(sampler.calls) <= 3 * len(kinds)  # per type
    assert 0 < sum(bool(r["tool_calls"]) for r in records.values()) < len(records)  # both kinds of episode
    for index, r in records.items():
        sample = benchmark.samples[index]
        if r["tool_calls"]:  # two calls in each of the two rounds, then the forced answer with its instruction
            assert r["calls_per_turn"] == [2, 2] and r["turns"] == 3 and r["final_text"] == "C"
            assert prompts.final_instruction(sample.question_type) in r["response"]
        else:
            assert r["turns"] == 1 and r["final_text"].startswith("<think>sure</think><answer>")
        if sample.question_type == "mcq":
            assert r["correct"] == (r["pred"] == sample.answer) and r["score"] == float(r["correct"])
    saved = json.load(open(tmp_path / "synthetic.json"))
    assert saved["summary"]["total"] == len(benchmark.samples) and len(saved["results"]) == len(benchmark.samples)
    assert saved["summary"]["avg_tool_calls"] == pytest.approx(np.mean([r["tool_calls"] for r in records.values()]))


def test_resume_after_interruption_gives_the_same_summary(benchmark, tokenizer, tmp_path):
    full = driver.run_dataset(scripted(tokenizer), tokenizer, benchmark, config(batch_size=2), str(tmp_path / "a"),
                              log=lambda _: None)
    out = tmp_path / "b"
    path = store.shard_path(str(out), "synthetic", 0, 1)
    driver.run_dataset(scripted(tokenizer), tokenizer, benchmark, config(batch_size=2), str(out), log=lambda _: None)
    lines = open(path).read().splitlines()
    with open(path, "w") as f:  # interrupted: two samples kept, a torn third line
        f.write("\n".join(lines[:2]) + "\n" + lines[2][: len(lines[2]) // 2])
    os.remove(out / "synthetic.json")
    sampler = scripted(tokenizer)
    resumed = driver.run_dataset(sampler, tokenizer, benchmark, config(batch_size=2), str(out), log=lambda _: None)
    assert policy_rows(sampler) == len(benchmark.samples) - 2  # finished samples are skipped
    assert strip_timing(resumed) == strip_timing(full)
    again = scripted(tokenizer)
    driver.run_dataset(again, tokenizer, benchmark, config(batch_size=2), str(out), log=lambda _: None)
    assert policy_rows(again) == 0


def test_records_and_summaries_on_gs_resume(benchmark, tokenizer, tmp_path, gcs_emulator):
    """An output directory on gs:// (a Cloud Storage emulator): the records, the dataset JSON
    and summary_all.json go to the bucket, and an interrupted shard (a torn last line) resumes
    to the same summary as a local run."""
    from paravt_jax.infra import storage

    local = driver.run_dataset(scripted(tokenizer), tokenizer, benchmark, config(batch_size=2),
                               str(tmp_path / "local"), log=lambda _: None)
    out = f"{gcs_emulator}/eval-records"
    path = store.shard_path(out, "synthetic", 0, 1)
    driver.run_dataset(scripted(tokenizer), tokenizer, benchmark, config(batch_size=2), out, log=lambda _: None)
    lines = storage.read_text(path).splitlines()
    storage.write_atomic(path, "\n".join(lines[:2]) + "\n" + lines[2][: len(lines[2]) // 2])
    storage.remove(f"{out}/synthetic.json")
    sampler = scripted(tokenizer)
    resumed = driver.run_dataset(sampler, tokenizer, benchmark, config(batch_size=2), out, log=lambda _: None)
    assert policy_rows(sampler) == len(benchmark.samples) - 2
    assert strip_timing(resumed) == strip_timing(local)
    assert len(storage.read_text(path).splitlines()) == len(benchmark.samples)
    assert json.loads(storage.read_bytes(f"{out}/synthetic.json"))["summary"]["total"] == len(benchmark.samples)
    store.write_summary_all(out, {"synthetic": resumed})
    assert json.loads(storage.read_bytes(f"{out}/summary_all.json"))["synthetic"]["complete"]


def test_shards_cover_every_sample_once(benchmark, tokenizer, tmp_path):
    n = len(benchmark.samples)
    assert sorted(i for s in range(3) for i in driver.shard_indices(n, s, 3)) == list(range(n))
    with pytest.raises(ValueError, match="shard_id=3"):
        driver.shard_indices(n, 3, 3)
    summaries = [driver.run_dataset(scripted(tokenizer), tokenizer, benchmark, config(), str(tmp_path),
                                    shard_id=s, num_shards=3, log=lambda _: None) for s in range(3)]
    assert [s["complete"] for s in summaries] == [False, False, True]
    ids = [json.loads(l)["index"] for p in glob.glob(str(tmp_path / "*.jsonl")) for l in open(p)]
    assert sorted(ids) == list(range(n))
    single = driver.run_dataset(scripted(tokenizer), tokenizer, benchmark, config(), str(tmp_path / "one"),
                                log=lambda _: None)
    assert strip_timing(summaries[-1]) == strip_timing(single)


def test_unreadable_video_is_an_error_record(benchmark, tokenizer, tmp_path):
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video")
    bad = dataclasses.replace(benchmark.samples[0], video_path=str(broken))
    bench = dataclasses.replace(benchmark, samples=(bad,) + benchmark.samples[1:2])
    summary = driver.run_dataset(scripted(tokenizer), tokenizer, bench, config(), str(tmp_path / "o"),
                                 log=lambda _: None)
    records = store.read_records(glob.glob(str(tmp_path / "o" / "*.jsonl")))
    assert "broken.mp4" in records[0]["error"] and records[0]["score"] == 0.0
    assert summary["errors"] == 1 and summary["total"] == 2


IDENTITY_A = {"checkpoint": {"path": "/ckpt/a", "files": "0123"}, "model": {"preset": "tiny"}}
IDENTITY_B = {"checkpoint": {"path": "/ckpt/b", "files": "4567"}, "model": {"preset": "tiny"}}


def test_records_are_keyed_by_checkpoint_and_settings(benchmark, tokenizer, tmp_path):
    """A directory with another checkpoint's or other settings' records is refused with the
    fields that differ (no silent reuse, no relabelled summary); --overwrite drops them and
    evaluates everything again; the same producer resumes; unkeyed records are refused."""
    out = str(tmp_path / "o")
    quiet = dict(log=lambda _: None)
    first = driver.run_dataset(scripted(tokenizer), tokenizer, benchmark, config(), out, identity=IDENTITY_A,
                               **quiet)
    assert first["complete"] and first["producer"]["checkpoint"]["path"] == "/ckpt/a"
    with pytest.raises(store.ForeignRecords, match=r"6 synthetic record\(s\) of another evaluation "
                       r"\(checkpoint.files: '0123' -> '4567'; checkpoint.path: '/ckpt/a' -> '/ckpt/b'\).*--overwrite"):
        driver.run_dataset(scripted(tokenizer), tokenizer, benchmark, config(), out, identity=IDENTITY_B, **quiet)
    with pytest.raises(store.ForeignRecords, match=r"settings.nframes: 4 -> 8"):
        driver.run_dataset(scripted(tokenizer), tokenizer, benchmark, config(nframes=8), out, identity=IDENTITY_A,
                           **quiet)
    with pytest.raises(store.ForeignRecords, match=r"settings.prompt_mode: 'agentic_general' -> 'direct'"):
        driver.run_dataset(scripted(tokenizer), tokenizer, benchmark, config(prompt_mode="direct"), out,
                           identity=IDENTITY_A, **quiet)
    same = scripted(tokenizer)  # the same producer (another batch size) resumes: nothing to run
    driver.run_dataset(same, tokenizer, benchmark, config(batch_size=2), out, identity=IDENTITY_A, **quiet)
    assert policy_rows(same) == 0
    again = scripted(tokenizer)
    second = driver.run_dataset(again, tokenizer, benchmark, config(), out, identity=IDENTITY_B, overwrite=True,
                                **quiet)
    assert policy_rows(again) == len(benchmark.samples) and second["complete"]
    assert second["producer"]["checkpoint"]["path"] == "/ckpt/b" and second["producer_id"] != first["producer_id"]
    records = store.read_records(glob.glob(os.path.join(out, "*.jsonl")))
    assert {r["producer"] for r in records.values()} == {second["producer_id"]}
    saved = json.load(open(os.path.join(out, "synthetic.json")))
    assert saved["summary"]["producer"]["checkpoint"]["path"] == "/ckpt/b"
    # records written before they named their producer are not reused either
    path = store.shard_path(out, "synthetic", 0, 1)
    lines = [json.loads(line) for line in open(path)]
    with open(path, "w") as f:
        f.writelines(json.dumps({k: v for k, v in r.items() if k != "producer"}) + "\n" for r in lines)
    with pytest.raises(store.ForeignRecords, match="written before records named their producer"):
        driver.run_dataset(scripted(tokenizer), tokenizer, benchmark, config(), out, identity=IDENTITY_B, **quiet)


# The producer ids of configs/eval.py's presets for one checkpoint: a change means records written
# before it are another evaluation's. Since 2026-12-04 the frame sizing (overview_sizing,
# crop_sizing: the reference's two stages by default, one resize for the synthetic preset) and
# the reference's crop budget are part of the key; a video item's layout too (charades).
PRODUCER_IDS = {("synthetic", "videomme", "parallel"): "818bf46016a5be35",
                ("synthetic", "videomme", "sequential"): "7e03daa41ce80f1b",
                ("synthetic", "charades", "parallel"): "d7dbb3a3bcf76932",
                ("paravt_8b", "videomme", "parallel"): "282554b3608c6897",
                ("paravt_8b", "charades", "parallel"): "04a6ade81f91e8c9",
                ("paravt_8b", "charades", "sequential"): "8e167999f47760e7"}


@pytest.mark.parametrize("preset,benchmark_name,dispatch", sorted(PRODUCER_IDS))
def test_producer_ids_of_the_presets_are_stable(preset, benchmark_name, dispatch):
    from paravt_jax.configs import eval as eval_config
    from paravt_jax.eval import provenance

    identity = {"checkpoint": {"path": "/ckpt", "files": "0123456789abcdef"},
                "model": {"preset": "8b", "param_dtype": "bfloat16", "dtype": "bfloat16"}}
    c = eval_config.get_config(preset)
    settings = driver.driver_config(build_run(c), benchmark_name, dispatch=dispatch)
    key = provenance.producer(identity, settings)
    assert provenance.producer_id(key) == PRODUCER_IDS[preset, benchmark_name, dispatch], key


def test_missing_videos_beyond_the_share_are_refused(benchmark, assets, tmp_path, capsys):
    total = len(benchmark.samples)
    short = dataclasses.replace(benchmark, samples=benchmark.samples[1:],
                                missing_videos=(benchmark.samples[0].video_path,))
    driver.check_missing_videos(short, 0.2)  # 1 of 6 is within 20 %
    with pytest.raises(driver.MissingVideos, match=rf"synthetic: 1 of {total} videos are missing \(16.7% > "
                       r"max_missing_videos=0.1\); first: .*video_dir"):
        driver.check_missing_videos(short, 0.1)
    # a video_dir without the videos: refused before any work, status 2, not a 0.000 score
    from paravt_jax.cli import main

    empty = tmp_path / "videos"
    empty.mkdir()
    status = main(["paravt-jax", "eval", f"--config={ROOT}/configs/eval.py:synthetic",
                   f"--config.data.builtin_root={os.path.dirname(os.path.dirname(assets.model_dir))}",
                   "--config.data.num_train=2", "--config.data.num_eval=6",  # the fixture's set, not another
                   f"--config.benchmarks.synthetic.video_dir={empty}", f"--output_dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert status == 2 and "synthetic: 6 of 6 videos are missing (100.0% > max_missing_videos=0.02)" in err
    assert not os.path.exists(tmp_path / "out" / "summary_all.json")


def test_a_checkpoint_is_known_by_its_content_not_its_path_or_times(assets, tmp_path):
    """A copy elsewhere (new path, new modification times) is the same model; other bytes in a
    weight file are another; a directory without checkpoint files is refused by name."""
    import shutil

    from paravt_jax.config import ConfigValueError
    from paravt_jax.eval import provenance

    original = provenance.checkpoint_identity(assets.model_dir, "tiny", 0)
    copy = shutil.copytree(assets.model_dir, tmp_path / "copy")
    os.utime(copy / "model.safetensors", (1, 1))
    assert provenance.checkpoint_identity(str(copy), "tiny", 0) == original and set(original) == {"content"}
    with open(copy / "model.safetensors", "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"\x01\x02\x03\x04")
    assert provenance.checkpoint_identity(str(copy), "tiny", 0) != original
    with pytest.raises(ConfigValueError, match=r"model.checkpoint=.*empty.*no checkpoint files"):
        provenance.checkpoint_identity(str(tmp_path / "empty"), "tiny", 0)
