"""The rollout log: scripted episodes with parallel crop calls, written as the RL trainer writes
them, read back field by field; bounded texts; a resumed run drops the steps it repeats; the
evaluation log replaces a setting's earlier records."""
import json
import os

import numpy as np
import pytest

from paravt_jax.agent.dispatch import CropDispatcher, DispatchConfig
from paravt_jax.agent.rollout import Episode, RolloutConfig, run_rollouts
from paravt_jax.data.paravt_parquet import RLRow
from paravt_jax.data.synthetic import Event, write_video
from paravt_jax.episodes import episode_log as L
from paravt_jax.episodes.rewards import RewardConfig, score
from paravt_jax.text.tokenizer import train_tokenizer
from unit.test_agent_rollout import CORPUS, ScriptedSampler, calls_text

ANSWER = "the crops show it</think>\n<answer>blue</answer>"  # after the forced "<think>\n"


def calls_turn(*windows) -> str:
    return calls_text(*windows).removeprefix("<think>")


def scripted_step(directory: str, step: int = 0, count: int = 4):
    """Two prompts x 2 samples of scripted episodes on a 40 s video, logged as step `step`:
    row0/0 crops two windows in one turn (a third call refused) then answers, row0/1 answers at
    once, row1/0 writes a malformed call block, row1/1 crops one window. Returns (the rows,
    the rollouts, the advantages, the log file)."""
    video = os.path.join(directory, "videos", "v.mp4")
    if not os.path.exists(video):
        os.makedirs(os.path.dirname(video), exist_ok=True)
        write_video(video, 40.0, [Event(8.0, 11.0, "blue", "circle"), Event(20.0, 23.0, "red", "square")],
                    fps=4.0, height=96, width=128, seed=1)
    tokenizer = train_tokenizer(CORPUS)
    scripts = [[calls_turn((7.5, 11.5), (19.5, 23.5), (30, 34)), ANSWER], [ANSWER],
               ["look</think>\n<tool_call>\n{not json\n</tool_call>", ANSWER],
               [calls_turn((8, 12)), ANSWER]]
    rows = [RLRow(0, "What colour is the circle?", video, "blue", "oe", {"windows": [[7.5, 11.5], [19.5, 23.5]]}),
            RLRow(1, "What colour is the square?", video, "red", "oe", {})]
    episodes = [Episode(f"row{r.index}", r.question, r.answer, r.question_type, r.video_path, nframes=4) for r in rows]
    with CropDispatcher(DispatchConfig(max_parallel=2)) as dispatcher:
        rollouts, skipped = run_rollouts(ScriptedSampler(tokenizer, scripts, "a blue circle"), tokenizer, episodes, 2,
                                         RolloutConfig(mode="subagent", max_turns=2), dispatcher)
    assert not skipped
    rewards, _, _ = score(rollouts, RewardConfig(), 0.5, token_anchor=True)
    width = max(r.inputs.length for r in rollouts) + 5  # right-padded rows, as the trainer's
    advantages = np.zeros((len(rollouts), width), np.float32)
    for i, r in enumerate(rollouts):
        advantages[i, :r.inputs.length] = np.where(r.inputs.loss_mask > 0, np.linspace(-1, 1, r.inputs.length) + i, 9)
    log = L.EpisodeLog(directory, count, 2, rows)
    return rows, rollouts, advantages, log.write(step, rollouts, rewards, advantages)


def test_a_step_log_holds_every_turn_call_response_and_reward(tmp_path):
    rows, rollouts, advantages, path = scripted_step(str(tmp_path), step=3)
    assert path == str(tmp_path / "step_000003.jsonl")
    records = L.read_jsonl(path)
    assert [(r["episode_id"], r["sample"], r["group"]) for r in records] == [
        ("row0", 0, 0), ("row0", 1, 0), ("row1", 0, 1), ("row1", 1, 1)]
    a, b, c, d = records
    assert a["step"] == 3 and a["stage"] == "rl" and a["nframes"] == 4 and a["question_type"] == "oe"
    assert a["video"] == rows[0].video_path and a["answer"] == "blue" and a["predicted"] == "blue"
    assert a["overview_times"] == pytest.approx([0.0, 13.25, 26.5, 39.75], abs=0.3)
    assert a["truth_windows"] == [[7.5, 11.5], [19.5, 23.5]] and c["truth_windows"] == []
    first, second = a["turns"]
    assert first["text"].startswith("<think>\ncheck windows</think>") and second["text"].endswith("<|im_end|>")
    assert first["well_formed"] and second["well_formed"] and second["calls"] == []
    # the two executed calls of one turn, side by side: windows, frames (1 fps), sub-agent text
    assert [call["window"] for call in first["calls"]] == [[7.5, 11.5], [19.5, 23.5]]
    assert [call["asked"] for call in first["calls"]] == [[7.5, 11.5], [19.5, 23.5]]
    assert [len(call["frame_times"]) for call in first["calls"]] == [4, 4]
    assert all(7.5 <= t <= 11.5 for t in first["calls"][0]["frame_times"])
    assert [call["response"] for call in first["calls"]] == ["a blue circle", "a blue circle"]
    assert any("call 3 was not executed" in e for e in a["errors"])
    assert a["rewards"]["acc_reward"] == 1.0 and a["rewards"]["tool_reward"] > 0 and a["format_compliant"]
    mask = rollouts[0].inputs.loss_mask > 0
    expected = advantages[0, :len(mask)][mask]
    assert a["advantage"] == pytest.approx({"mean": expected.mean(), "min": expected.min(), "max": expected.max()},
                                           abs=1e-3)
    assert a["length"] == int(mask.sum())
    assert len(b["turns"]) == 1 and b["rewards"]["tool_reward"] == 0
    bad = c["turns"][0]
    assert not bad["well_formed"] and any("not valid JSON" in p for p in bad["problems"]) and bad["calls"] == []
    assert not c["format_compliant"]
    assert d["turns"][0]["calls"][0]["window"] == [8.0, 12.0]


def test_the_log_chooses_across_prompts_and_cuts_long_texts(tmp_path, monkeypatch):
    assert L.choose(3, 8, 4) == [0, 1, 4] and L.choose(2, 8, 4) == [0, 4] and L.choose(9, 4, 2) == [0, 1, 2, 3]
    monkeypatch.setattr(L, "MAX_TEXT", 20)
    _, _, _, path = scripted_step(str(tmp_path), count=2)
    records = L.read_jsonl(path)
    assert [r["episode_id"] for r in records] == ["row0", "row1"]
    text = records[0]["turns"][0]["text"]
    assert text.startswith("<think>\ncheck windo") and "more characters]" in text and len(text) < 60


def test_a_resumed_run_drops_the_steps_it_repeats(tmp_path):
    """Step logs an interrupted run wrote past its last checkpoint are removed by the first
    write of the resumed run; earlier steps stay."""
    for step in (0, 1, 2, 5):
        (tmp_path / f"step_{step:06d}.jsonl").write_text(json.dumps({"step": step}) + "\n")
    (tmp_path / "step_000002.jsonl.tmp.123").write_text("torn")
    scripted_step(str(tmp_path), step=1)
    assert sorted(L.step_files(str(tmp_path))) == [0, 1]
    assert L.read_jsonl(str(tmp_path / "step_000000.jsonl")) == [{"step": 0}]
    assert L.read_jsonl(str(tmp_path / "step_000001.jsonl"))[0]["episode_id"] == "row0"


def test_the_evaluation_log_keeps_one_copy_of_each_setting(tmp_path):
    rows, rollouts, _, _ = scripted_step(str(tmp_path / "rl"))
    path = str(tmp_path / "eval" / "episodes.jsonl")
    setting = {"tools": True, "nframes": 4}
    L.write_eval_episodes(path, "after_sft", L.eval_records(rollouts[:2], rows, **setting), setting)
    L.write_eval_episodes(path, "final", L.eval_records(rollouts, rows, **setting), setting)
    L.write_eval_episodes(path, "final", L.eval_records(rollouts[:1], rows, **setting), setting)  # a rerun
    records = L.read_jsonl(path)
    assert [(r["stage"], r["tools"], r["nframes"]) for r in records] == [("after_sft", True, 4)] * 2 + [
        ("final", True, 4)]
    assert records[0]["rewards"] == {"acc_reward": 1.0} and records[0]["advantage"] is None
    with open(path, "a") as f:
        f.write("{torn\n")
    with pytest.raises(ValueError, match="episodes.jsonl: line 4 is not JSON"):
        L.read_jsonl(path)


def test_every_record_is_strict_json(tmp_path):
    """Model-written windows can be any number: non-finite values are written as null, never
    as NaN or Infinity (which strict JSON readers, browsers included, refuse)."""
    assert L.finite(float("inf")) is None and L.finite(float("nan")) is None and L.finite(2.34567) == 2.346
    _, _, _, path = scripted_step(str(tmp_path))
    with open(path) as f:
        for line in f:
            json.loads(line, parse_constant=lambda name: pytest.fail(f"non-strict JSON constant {name}"))
