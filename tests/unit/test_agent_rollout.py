"""Dispatcher concurrency and safety; a hand-checked scripted rollout; real tiny rollouts."""
import dataclasses
import json

import numpy as np
import pytest

from paravt_jax.agent import dispatch as dispatch_module
from paravt_jax.agent.dispatch import CropDispatcher, CropTask, DispatchConfig
from paravt_jax.agent.protocol import PromptFormat, ToolProtocol
from paravt_jax.agent.rollout import Episode, RolloutConfig, run_rollouts
from paravt_jax.agent.tools import ToolCall
from paravt_jax.data.synthetic import Event, write_video
from paravt_jax.text.tokenizer import train_tokenizer
from support.scripted import ScriptedSampler

CORPUS = ["<think>I will look at two windows.</think> the answer is blue", "crop_video start_time end_time",
          '{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 1, "end_time": 5}}'] * 20


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("agent") / "episode.mp4")
    return write_video(path, 40.0, [Event(10.0, 14.0, "blue", "circle")], fps=4.0, height=96, width=128, seed=1)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CORPUS)


def crop(row, k, video, start, end, path="model_path.mp4"):
    arguments = {"video_path": path, "start_time": start, "end_time": end}
    return CropTask(row, k, video, 40.0, ToolCall("crop_video", arguments))


def test_calls_run_concurrently_in_order_and_failures_become_errors(video, tmp_path):
    tasks = [crop(0, 0, video, 1, 9), crop(0, 1, video, 10, 18), crop(1, 0, video, 20, 28),
             crop(1, 1, video, 30, 20), crop(2, 0, str(tmp_path / "missing.mp4"), 1, 5)]
    with CropDispatcher(DispatchConfig(max_workers=4)) as dispatcher:
        results = dispatcher.run(tasks)
    assert [r.task for r in results] == tasks
    ok = [r for r in results if r.ok]
    assert len(ok) == 3 and max(r.started for r in ok) < min(r.finished for r in ok)  # overlapping
    assert "must be less than" in results[3].error
    assert "missing.mp4: file not found" in results[4].error
    assert dispatcher.counters == {"calls": 5, "errors": 2, "timeouts": 0}
    assert len(ok[0].clip.frames) == 8  # 1 fps over 8 s


def test_model_written_paths_are_never_opened(video, monkeypatch):
    opened = []
    real = dispatch_module.read_frames

    def spy(path, **kwargs):
        opened.append(path)
        return real(path, **kwargs)

    monkeypatch.setattr(dispatch_module, "read_frames", spy)
    tasks = [crop(0, 0, video, 1, 5, path="/etc/passwd"), crop(0, 1, video, 6, 9, path="../../secret.mp4")]
    with CropDispatcher() as dispatcher:
        results = dispatcher.run(tasks)
    assert all(r.ok for r in results) and opened == [video, video]


def test_timeout_becomes_error(video, monkeypatch):
    import time

    monkeypatch.setattr(dispatch_module, "read_frames", lambda *a, **k: time.sleep(2))
    with CropDispatcher(DispatchConfig(timeout_s=0.2)) as dispatcher:
        results = dispatcher.run([crop(0, 0, video, 1, 5)])
    assert "timed out" in results[0].error and dispatcher.counters["timeouts"] == 1


def calls_text(*windows):
    return "<think>check windows</think>\n" + "\n".join(
        "<tool_call>\n"
        + json.dumps({"name": "crop_video",
                      "arguments": {"video_path": "/etc/passwd", "start_time": s, "end_time": e}})
        + "\n</tool_call>"
        for s, e in windows)


def test_scripted_rollout_masks_and_metadata(video, tokenizer):
    scripts = [
        [calls_text((1, 5), (9, 15), (20, 25)), "<think>it was blue</think>\n<answer>blue</answer>"],
        ["<think>no need</think>\n<answer>red</answer>"],
    ]
    sampler = ScriptedSampler(tokenizer, scripts)
    episode = Episode("e0", "What colour?", "blue", "oe", video, nframes=4)
    config = RolloutConfig(mode="subagent", max_turns=3)
    with CropDispatcher(DispatchConfig(max_parallel=2)) as dispatcher:
        rollouts, skipped = run_rollouts(sampler, tokenizer, [episode], 2, config, dispatcher)
    assert skipped == [] and len(rollouts) == 2
    a, b = rollouts
    assert a.calls_per_turn == (2,) and a.turns == 2 and b.calls_per_turn == () and b.turns == 1
    assert any("at most 2 tool calls" in e for e in a.errors)
    # both crops of the turn in ONE sub-agent call
    assert [c.rows for c in sampler.calls if c.kind == "subagent"] == [2]
    assert len(a.subagents) == 2 and all(s.row == 0 for s in a.subagents)
    gen_a = tokenizer.encode(scripts[0][0]) + [tokenizer.special.im_end] + \
        tokenizer.encode(scripts[0][1]) + [tokenizer.special.im_end]
    ids = a.inputs.input_ids
    assert a.inputs.loss_mask.sum() == len(gen_a)
    assert ids[a.inputs.loss_mask == 1].tolist() == gen_a
    assert np.all(a.logprobs[a.inputs.loss_mask == 1] == -0.5) and np.all(a.logprobs[a.inputs.loss_mask == 0] == 0)
    sp = tokenizer.special
    structural_ids = ids[a.structural_mask == 1]
    assert (structural_ids == sp.tool_call).sum() == 3 and (structural_ids == sp.think_end).sum() == 2
    assert tokenizer.decode(ids[a.structural_mask == 1]).count("answer") == 2  # <answer> and </answer>
    assert "<tool_response>\na blue circle from 10 to 14 seconds\n</tool_response>" in a.completion
    assert "Error: call 3 was not executed" in a.completion
    assert a.completion.rstrip().endswith("<answer>blue</answer><|im_end|>")
    assert a.inputs.position_ids[0, -1] == a.inputs.next_position - 1
    assert not a.truncated and a.nframes == 4


def test_random_streams_follow_each_rows_place_in_the_step(video, tokenizer, tmp_path):
    """Row streams are row_offset + episode * G + sample (an unreadable episode keeps its
    slots); turn t extends with seed + t + 1; the round's sub-agents draw seed + 1000 (t + 1)
    on stream row_stream * max_parallel + call index."""
    answer = "<think>done</think>\n<answer>blue</answer>"
    scripts = [[calls_text((1, 5), (9, 15)), calls_text((20, 25)), answer], [answer],
               [answer], [calls_text((30, 35)), answer]]
    sampler = ScriptedSampler(tokenizer, scripts)
    episodes = [Episode("e0", "What colour?", "blue", "oe", video, nframes=4),
                Episode("e1", "Unreadable", "red", "oe", str(tmp_path / "missing.mp4"), nframes=4),
                Episode("e2", "What shape?", "circle", "oe", video, nframes=4)]
    config = RolloutConfig(mode="subagent", max_turns=3, seed=5, row_offset=10)
    with CropDispatcher(DispatchConfig(max_parallel=3)) as dispatcher:
        rollouts, skipped = run_rollouts(sampler, tokenizer, episodes, 2, config, dispatcher)
    assert len(skipped) == 1 and [r.episode.episode_id for r in rollouts] == ["e0", "e0", "e2", "e2"]
    rows = [10, 11, 14, 15]
    streams = [(call.kind, call.seed, list(call.row_ids)) for call in sampler.calls]
    assert streams == [("policy", 5, rows),
                               ("subagent", 1005, [30, 31, 45]), ("extend", 6, rows),
                               ("subagent", 2005, [30]), ("extend", 7, rows)]
    assert [r.calls_per_turn for r in rollouts] == [(2, 1), (), (), (1,)]


def test_max_turns_enforced(video, tokenizer):
    scripts = [[calls_text((1, 5))] * 10]
    sampler = ScriptedSampler(tokenizer, scripts)
    episode = Episode("e0", "What colour?", "blue", "oe", video, nframes=4)
    with CropDispatcher() as dispatcher:
        rollouts, _ = run_rollouts(sampler, tokenizer, [episode], 1,
                                   RolloutConfig(mode="frames", max_turns=2), dispatcher)
    r = rollouts[0]
    assert r.turns == 3 and r.calls_per_turn == (1, 1, 1)  # 2 rounds executed, the third call unanswered
    assert r.completion.count("<tool_response>") == 2
    assert r.inputs.image_grid_thw.shape[0] == 4 + 2 * 4  # overview + two crops of 4 frames


def test_final_answer_round_forces_a_short_answer(video, tokenizer):
    """Evaluation protocol: max_turns rounds; after the last round's tool responses, the
    final-answer instruction and one short turn (its own budget)."""
    scripts = [[calls_text((1, 5), (6, 9)), calls_text((10, 14)), "B"]]
    sampler = ScriptedSampler(tokenizer, scripts)
    episode = Episode("e0", "Which option?", "B", "mcq", video, nframes=4)
    config = RolloutConfig(mode="frames", max_turns=2, max_new_tokens=200,
                           prompt=PromptFormat(system_prompt="SYSTEM TEXT"),
                           protocol=ToolProtocol(final_answer=True, final_answer_tokens=7,
                                                 final_answer_instruction="Reply with the letter only."))
    with CropDispatcher() as dispatcher:
        rollouts, _ = run_rollouts(sampler, tokenizer, [episode], 1, config, dispatcher)
    r = rollouts[0]
    budgets = [call.max_new_tokens for call in sampler.calls if call.kind == "extend"]
    assert r.turns == 3 and r.calls_per_turn == (2, 1) and budgets == [200, 7]
    assert r.completion.count("<tool_response>") == 3
    assert r.completion.count("Reply with the letter only.") == 1
    assert r.completion.index("Reply with the letter only.") > r.completion.rindex("</tool_response>")
    prompt = tokenizer.decode(r.inputs.input_ids[:r.prompt_length])
    assert prompt.startswith("<|im_start|>system\nSYSTEM TEXT<|im_end|>") and "<tools>" not in prompt


def test_turn_texts_carry_the_forced_prefix_and_the_anchor_lands_on_generated_tags(video, tokenizer):
    from paravt_jax.episodes.rewards import RewardConfig, score

    first = "I see sparse frames.\n</think>\n" + calls_text((1, 5)).split("\n", 1)[1]
    scripts = [[first, "The circle is blue.\n</think>\n<answer>blue</answer>"],
               ["<think>I write my own think.</think>\n<answer>blue</answer>"]]
    episode = Episode("e0", "What colour?", "blue", "oe", video, nframes=4)
    with CropDispatcher() as dispatcher:
        rollouts, _ = run_rollouts(ScriptedSampler(tokenizer, scripts), tokenizer, [episode], 2,
                                   RolloutConfig(mode="frames", max_turns=2), dispatcher)
    a, b = rollouts
    assert a.turn_texts == ("<think>\n" + first + "<|im_end|>",
                            "<think>\n" + scripts[0][1] + "<|im_end|>")
    assert b.turn_texts == ("<think>\n" + scripts[1][0] + "<|im_end|>",)
    assert "<tool_response>" not in a.assistant_text and not a.generated_text.startswith("<think>")
    # Structural positions: exactly the tags the policy generated, in order; the forced
    # "<think>" tokens of the prompt (loss mask 0) are never among them.
    ids, sp = a.inputs.input_ids, tokenizer.special
    tags = lambda r: tokenizer.decode(r.inputs.input_ids[r.structural_mask == 1])
    assert tags(a) == "</think><tool_call></tool_call></think><answer></answer>"
    assert tags(b) == "<think></think><answer></answer>"
    assert np.all(a.inputs.loss_mask[a.structural_mask == 1] == 1)
    assert (ids == sp.think).sum() == 2 and not np.any(a.structural_mask[ids == sp.think])
    # rewards: the turns text scores the forced think, the released text does not
    rewards, _, anchors = score(rollouts, RewardConfig(), 0.5, token_anchor=True)
    assert anchors.tolist() == [pytest.approx(0.7), pytest.approx(0.7)]
    assert rewards[0]["format_reward"] == pytest.approx(1.0)  # .2 + .5 + tool .3 + balanced .1 -> 1.0
    released, _, released_anchors = score(rollouts, RewardConfig(text="released"), 0.5, token_anchor=True)
    assert released_anchors.tolist() == [0.0, pytest.approx(0.7)]
    assert released[0]["format_reward"] == pytest.approx(0.5)  # answer tags only; think unbalanced


def test_gating_off_overview_samples_one_fps_up_to_64(video, tokenizer, tmp_path):
    """K = 0: the overview at rollout.prompt.overview_fps capped at overview_max_frames (the reference
    with gating off: 1 fps, at most 64), not a fixed 64 frames."""
    from paravt_jax.agent.rollout import overview_prompts

    long_video = write_video(str(tmp_path / "long.mp4"), 100.0, [Event(10.0, 14.0, "red", "square")], fps=2.0,
                             height=64, width=96, seed=2)
    episodes = [Episode("a", "q?", "A", "mcq", video, nframes=0), Episode("b", "q?", "A", "mcq", long_video, nframes=0),
                Episode("c", "q?", "A", "mcq", video, nframes=8)]
    with CropDispatcher() as pool:
        prompts, errors, durations, _ = overview_prompts(episodes, tokenizer, PromptFormat(), pool)
    assert errors == [None] * 3 and durations == pytest.approx([40.0, 100.0, 40.0], abs=0.5)
    assert [p.image_grid_thw.shape[0] for p in prompts] == [40, 64, 8]


def test_rl_prompt_layout_system_and_subagent(video, tokenizer):
    """RL prompt: the row's system prompt kept (no second schema when it has <tools>), else the
    flat schema of the RL workflow; timestamped overview frames. Sub-agent prompts: bare
    frames, then the segment's range and duration."""
    from paravt_jax.agent.rollout import overview_prompts

    def prompt_text(episode, prompt_format=None):
        prompt_format = prompt_format or PromptFormat.training()
        with CropDispatcher() as pool:
            (prompt,), _, _, _ = overview_prompts([episode], tokenizer, prompt_format, pool)
        return tokenizer.decode(prompt.input_ids)

    plain = prompt_text(Episode("a", "What colour?", "blue", "oe", video, nframes=2))
    assert ('"parameters": {"video_path": {"type": "string", "description": "Path of the video file"}, '
            '"start_time": {"type": "number"') in plain and '"required"' not in plain
    assert "<|vision_end|><5.0 seconds>" not in plain and "<0.0 seconds><|vision_start|>" in plain
    assert plain.endswith("What colour?\nThe video path for this video is: episode.mp4<|im_end|>\n"
                          "<|im_start|>assistant\n<think>\n")
    own = prompt_text(Episode("a", "What colour?", "blue", "oe", video, nframes=2,
                              system_prompt="You are a video agent.\n<tools>\nX\n</tools>"))
    assert own.startswith("<|im_start|>system\nYou are a video agent.\n<tools>\nX\n</tools><|im_end|>")
    assert own.count("<tools>") == 1
    bare = prompt_text(Episode("a", "Q?", "A", "mcq", video, nframes=2),
                       PromptFormat(overview_timestamps=False, video_path_line="space_if_absent", tools=False))
    assert "seconds>" not in bare and "<|vision_end|>Q?<|im_end|>" in bare
    # the sub-agent prompt of one crop: frames without timestamps, then the instruction
    sampler = ScriptedSampler(tokenizer, [[calls_text((1, 5)), "<think>done</think><answer>blue</answer>"]])
    seen = []
    real = sampler.generate

    def spy(prompts, **kwargs):
        seen.extend(prompts)
        return real(prompts, **kwargs)

    sampler.generate = spy
    with CropDispatcher() as dispatcher:
        run_rollouts(sampler, tokenizer, [Episode("e", "Q?", "blue", "oe", video, nframes=2)], 1,
                     RolloutConfig(mode="subagent", max_turns=1), dispatcher)
    sub = tokenizer.decode(seen[-1].input_ids)
    assert sub.startswith("<|im_start|>user\n<|vision_start|>") and "seconds>" not in sub
    assert "<|vision_end|>You are looking at a video segment from 00:01 to 00:05 (duration: 4.0 seconds)." in sub


def test_subagent_summary_cut_at_the_budget_ends_with_the_marker(video, tokenizer):
    """A summary that reaches subagent_max_tokens without its stop token is cut there with the
    reference's ' [truncated]' marker; a finished one is kept as is."""
    summary = "a blue circle from 10 to 14 seconds"
    length = len(tokenizer.encode(summary))
    for budget, marker in ((length + 1, False), (length, True)):  # + 1: room for the stop token
        sampler = ScriptedSampler(tokenizer, [[calls_text((1, 5)), "<think>ok</think><answer>blue</answer>"]],
                                  summary=summary)
        with CropDispatcher() as dispatcher:
            (r,), _ = run_rollouts(sampler, tokenizer, [Episode("e", "Q?", "blue", "oe", video, nframes=2)], 1,
                                   RolloutConfig(mode="subagent", max_turns=1, subagent_max_tokens=budget),
                                   dispatcher)
        assert [c.max_new_tokens for c in sampler.calls if c.kind == "subagent"] == [budget]
        body = summary + (" [truncated]" if marker else "")
        assert f"<tool_response>\n{body}\n</tool_response>" in r.completion


IMG = "<|vision_start|><|image_pad|><|vision_end|>"


def eval_rollout(video, tokenizer, scripts, question="Which colour?", max_turns=1, **protocol_changes):
    """One greedy episode under the evaluation protocol (driver defaults: the reference's;
    `protocol_changes`: of its tool protocol)."""
    from paravt_jax.eval import driver

    prompt = dataclasses.replace(PromptFormat.reference_eval(), overview_min_pixels=784, overview_max_pixels=64 * 96)
    protocol = dataclasses.replace(ToolProtocol.reference_eval(), **protocol_changes)
    config = driver.DriverConfig(nframes=2, max_turns=max_turns, crop_min_pixels=784, crop_max_pixels=64 * 96,
                                 prompt=prompt, protocol=protocol)
    with driver.crop_dispatcher(config) as dispatcher:
        (r,), _ = run_rollouts(ScriptedSampler(tokenizer, scripts), tokenizer,
                               [Episode("e", question, "B", "mcq", video, nframes=2)], 1,
                               driver.rollout_config(config, "mcq"), dispatcher)
    import re
    return r, re.sub(r"(<\|image_pad\|>)+", "<|image_pad|>", tokenizer.decode(r.inputs.input_ids))


def test_eval_two_call_round_renders_as_the_reference_driver(video, tokenizer):
    """The whole context of a two-call round, then the forced answer: bare overview images, the
    video-path sentence after a space, each crop's frames BEFORE its `<tool_response>` text,
    a missing end_time read as start + 10 s, the final-answer instruction, the answer."""
    from paravt_jax.eval import prompts

    first = ('<think>two windows</think>\n<tool_call>\n{"name": "crop_video", "arguments": {"video_path": "x", '
             '"start_time": 1, "end_time": 5}}\n</tool_call>\n<tool_call>\n{"name": "crop_video", "arguments": '
             '{"video_path": "x", "start_time": "00:09"}}\n</tool_call>')
    r, text = eval_rollout(video, tokenizer, [[first, "B"]])
    assert text == (
        f"<|im_start|>system\n{prompts.PromptTexts().agentic_general}<|im_end|>\n"
        f"<|im_start|>user\n{IMG * 2}Which colour? The video path for this video is: episode.mp4<|im_end|>\n"
        f"<|im_start|>assistant\n{first}<|im_end|>\n"
        f"<|im_start|>user\n{IMG * 4}<tool_response>\n4 frames from 1.0s to 5.0s.\n</tool_response><|im_end|>\n"
        f"<|im_start|>user\n{IMG * 10}<tool_response>\n10 frames from 9.0s to 19.0s.\n</tool_response><|im_end|>\n"
        f"<|im_start|>user\n{prompts.FINAL_MCQ}<|im_end|>\n"
        "<|im_start|>assistant\nB<|im_end|>")
    assert r.calls_per_turn == (2,) and r.turns == 2 and r.turn_texts[-1] == "B<|im_end|>"
    # a question that already names the video path gets no second sentence
    _, named = eval_rollout(video, tokenizer, [["B"]], question="Which colour? (video path: a.mp4)")
    assert f"{IMG * 2}Which colour? (video path: a.mp4)<|im_end|>" in named


def test_eval_crop_errors_and_extra_calls_as_the_reference_driver(video, tokenizer):
    """A crop that fails reads `[Error cropping S.Ss-E.Es]` in its tool response; calls past
    max_parallel are dropped without a response; our variants are named options."""
    calls = "<think>look</think>" + "".join(
        '<tool_call>\n{"name": "crop_video", "arguments": ' + json.dumps({"start_time": s, "end_time": e}) +
        "}\n</tool_call>" for s, e in ((50, 60), (1, 3), (5, 7), (8, 9), (10, 12), (20, 22)))
    r, text = eval_rollout(video, tokenizer, [[calls, "B"]])
    assert r.calls_per_turn == (5,) and text.count("<tool_response>") == 5
    assert "<|im_start|>user\n<tool_response>\n[Error cropping 50.0s-60.0s]\n</tool_response><|im_end|>" in text
    assert "20.0s" not in text and "Error: call 6" not in text
    ours, ours_text = eval_rollout(video, tokenizer, [[calls, "B"]], frames_response="timestamped",
                                   extra_calls="respond")
    assert "start_time (50.0s) exceeds video duration (40.0s)" in ours_text
    assert "Error: call 6 was not executed" in ours_text
    assert "<tool_response>\n2 frames from 1.0 s to 3.0 s.\n<1.0 seconds>" in ours_text


def test_eval_turn_without_a_valid_call_is_the_answer(video, tokenizer):
    """The reference driver ends the dialog at a response with no parseable call and scores that
    response; with malformed = respond the model gets an error response and another turn."""
    broken = "<think>hm</think><tool_call>\nnot json\n</tool_call> The answer is B"
    r, text = eval_rollout(video, tokenizer, [[broken, "B"]], max_turns=3)
    assert r.turns == 1 and r.calls_per_turn == () and "<tool_response>" not in text
    assert text.endswith(f"<|im_start|>assistant\n{broken}<|im_end|>")
    retry, retry_text = eval_rollout(video, tokenizer, [[broken, "B"]], max_turns=3, malformed="respond")
    assert retry.turns == 2 and "<tool_response>\nError: <tool_call> block 1: not valid JSON" in retry_text


def test_tool_free_episode_beside_a_tool_episode(video, tokenizer):
    """rl.tool_free_share's episodes in a mixed batch: the tool-free prompt (no schema, no video
    path line; the evaluation's without-tools prompt) and one turn, a call in it unanswered,
    while the tool episode beside it runs its round; the rewards give a call there nothing."""
    from paravt_jax.agent.rollout import prompt_inputs
    from paravt_jax.episodes import rewards as R
    from paravt_jax.video.reader import read_frames

    call, answer = calls_text((1, 5)), "<think>it was blue</think>\n<answer>blue</answer>"
    sampler = ScriptedSampler(tokenizer, [[call, answer], [call, answer]])
    with_tools = Episode("e0", "What colour?", "blue", "oe", video, nframes=4)
    tool_free = dataclasses.replace(with_tools, episode_id="e1", tools=False)
    with CropDispatcher() as dispatcher:
        rollouts, _ = run_rollouts(sampler, tokenizer, [with_tools, tool_free], 1,
                                   RolloutConfig(mode="frames", max_turns=2), dispatcher)
    a, b = rollouts
    assert a.turns == 2 and a.calls_per_turn == (1,) and "<tool_response>" in a.completion
    assert b.turns == 1 and b.calls_per_turn == () and "<tool_response>" not in b.completion
    clip = read_frames(video, nframes=4)
    free_prompt = tokenizer.decode(prompt_inputs(tool_free, clip, tokenizer, PromptFormat.training()).input_ids)
    eval_prompt = tokenizer.decode(prompt_inputs(with_tools, clip, tokenizer,
                                                 dataclasses.replace(PromptFormat.training(), tools=False)).input_ids)
    assert free_prompt == eval_prompt and "crop_video" not in free_prompt and "video path" not in free_prompt
    rewards, _, _ = R.score(rollouts, R.RewardConfig(), 0.0, False)
    assert rewards[0]["tool_reward"] > 0 and rewards[1]["tool_reward"] == 0.0
    offered = R.format_reward(b.assistant_text, answer_suffix=True, anchor_weight=0.0)
    assert rewards[1]["format_reward"] == pytest.approx(offered - 0.3)  # the tool term left out


def rollout_fields(r):
    return (r.episode.episode_id, r.sample, r.inputs.input_ids.tolist(), r.inputs.loss_mask.tolist(),
            r.inputs.position_ids.tolist(), r.logprobs.tolist(), r.structural_mask.tolist(), r.completion,
            r.turn_texts, r.calls_per_turn, r.turns, r.errors, r.truncated, len(r.subagents),
            [(c.turn, c.response) for c in r.calls])


def refill_scripts(video):
    """Two episodes, two rows each, of 1-3 turns: rows that end out of order, calls of 1-3 crops."""
    answer = "<think>done</think>\n<answer>blue</answer>"
    long_calls = calls_text((1, 5), (9, 15), (20, 25))
    scripts = [[calls_text((1, 5)), calls_text((9, 15), (2, 3)), "B", "x"], [answer],
               [long_calls, answer], [calls_text((30, 35)), long_calls, calls_text((3, 4)), "tail"]]
    episodes = [Episode("e0", "What colour?", "blue", "oe", video, nframes=4),
                Episode("e1", "What shape?", "circle", "oe", video, nframes=4)]
    return scripts, episodes


@pytest.mark.parametrize("mode,final_answer", [("subagent", False), ("frames", True)])
def test_turn_refill_plays_the_rounds_rollouts(video, tokenizer, mode, final_answer):
    """rl.rollout.turn_refill: each row's turns on their own (rows end out of order, a row's next
    turn starting while others are in theirs) give the rollouts of the round-by-round loop, each
    row's turn t + 1 on seed + t + 1 and its stream, the round's sub-agents on seed + 1000 (t + 1)."""
    scripts, episodes = refill_scripts(video)
    protocol = ToolProtocol(final_answer=True, final_answer_tokens=7) if final_answer else ToolProtocol.training()
    runs = {}
    for refill in (False, True):
        config = RolloutConfig(mode=mode, max_turns=2, seed=5, row_offset=10, turn_refill=refill, protocol=protocol)
        sampler = ScriptedSampler(tokenizer, scripts)
        with CropDispatcher(DispatchConfig(max_parallel=2)) as dispatcher:
            rollouts, _ = run_rollouts(sampler, tokenizer, episodes, 2, config, dispatcher)
        runs[refill] = rollouts, sampler.calls
    (rounds, round_calls), (rows, row_calls) = runs[False], runs[True]
    assert [rollout_fields(r) for r in rows] == [rollout_fields(r) for r in rounds]
    assert [r.turns for r in rows] == [3, 1, 2, 3]
    turns = sorted((c.row_ids[0], c.seed, c.max_new_tokens) for c in row_calls if c.kind == "turn")
    budget = 7 if final_answer else 512
    assert turns == [(10, 6, 512), (10, 7, budget), (12, 6, 512), (13, 6, 512), (13, 7, budget)]
    seeds = [c.seed for c in row_calls if c.kind == "turn"]
    assert seeds != sorted(seeds)  # a row's third turn began before another row's second

    def subagent_streams(calls):
        return sorted((c.seed, s) for c in calls if c.kind == "subagent" for s in c.row_ids)
    assert subagent_streams(row_calls) == subagent_streams(round_calls)


@pytest.mark.parametrize("spare", [0, 2])
def test_subagents_in_the_turns_rows_play_the_rounds_rollouts(video, tokenizer, spare):
    """rl.rollout.subagent_in_turns: a round's sub-agent prompts decode in the turns' free rows
    (spare rows, the rows of ended episodes) beside the other rows' turns (Sampler.admit_turns),
    those that find none in calls of their own, and the rollouts are the round-by-round loop's:
    the same summaries (seed + 1000 (t + 1), each call's stream), responses, records and
    trajectories."""
    scripts, episodes = refill_scripts(video)
    runs = {}
    for rows in (False, True):
        config = RolloutConfig(mode="subagent", max_turns=2, seed=5, row_offset=10, turn_refill=rows,
                               subagent_in_turns=rows, subagent_spare_rows=spare if rows else 0)
        sampler = ScriptedSampler(tokenizer, scripts, summary=lambda text: f"seen {text.count('<|vision_start|>')}")
        with CropDispatcher(DispatchConfig(max_parallel=2)) as dispatcher:
            rollouts, _ = run_rollouts(sampler, tokenizer, episodes, 2, config, dispatcher)
        runs[rows] = rollouts, sampler.calls
    (rounds, round_calls), (guests, guest_calls) = runs[False], runs[True]
    assert [rollout_fields(r) for r in guests] == [rollout_fields(r) for r in rounds]
    assert [[(s.row, s.inputs.input_ids.tolist(), s.logprobs.tolist()) for s in r.subagents] for r in guests] == \
        [[(s.row, s.inputs.input_ids.tolist(), s.logprobs.tolist()) for s in r.subagents] for r in rounds]
    assert [c.response for r in guests for c in r.calls if c.response.startswith("seen")]  # summaries answered

    def summaries(calls):
        return sorted((c.seed, s, c.max_new_tokens) for c in calls if c.kind == "subagent" for s in c.row_ids)
    assert summaries(guest_calls) == summaries(round_calls)
    in_rows = [i for i, c in enumerate(guest_calls) if c.kind == "subagent" and c.shape is None]  # admit_turns
    own = [c for c in guest_calls if c.kind == "subagent" and c.shape is not None]  # no free row: own calls
    assert in_rows and (own if not spare else True)
    assert "turn" in [c.kind for c in guest_calls[in_rows[0]:]]  # summaries decoded beside other rows' turns


@pytest.mark.parametrize("fields,message", [
    (dict(subagent_in_turns=True), "subagent_in_turns=True: needs turn_refill=True and mode='subagent'"),
    (dict(subagent_in_turns=True, turn_refill=True, mode="frames"), "needs turn_refill=True and mode='subagent'"),
    (dict(subagent_spare_rows=2, turn_refill=True), "subagent_spare_rows=2: needs subagent_in_turns=True"),
    (dict(subagent_in_turns=True, turn_refill=True, subagent_max_tokens=600),
     "subagent_max_tokens=600 must not exceed"),
])
def test_subagents_in_turns_need_the_refilled_subagent_rollout(fields, message):
    with pytest.raises(ValueError, match=message):
        RolloutConfig(**fields)
