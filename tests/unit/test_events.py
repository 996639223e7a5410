"""The `events` toy task (paravt_jax/data/events.py), its tokenizer split and the toy config."""
import json
import os
import re

import numpy as np
import pyarrow.parquet as pq
import pytest

from paravt_jax.data import events as ev
from paravt_jax.run_config import build_run
from paravt_jax.video.reader import count_frames, sample_indices

FPS = 2.0  # the dataset's video frame rate
DURATION = 48.0


def seen_times(times: np.ndarray, event) -> bool:
    return bool(((times >= event.start) & (times < event.end)).any())


def overview_times(k: int) -> np.ndarray:
    """The K overview frames' timestamps, as read_frames(nframes=k) picks them."""
    n = count_frames(int(DURATION * FPS), FPS, k, None, None, None)
    return sample_indices(0, int(DURATION * FPS) - 1, n) / FPS


def crop_times(window) -> np.ndarray:
    """A 1 fps crop's timestamps, as the crop dispatcher reads them."""
    first, last = int(np.ceil(window[0] * FPS)), min(int(np.floor(window[1] * FPS)), int(DURATION * FPS) - 1)
    n = count_frames(last - first + 1, FPS, None, 1.0, 1, 16)
    return sample_indices(first, last, n) / FPS


QUESTIONS = ev.make_questions(200, seed=0, duration=DURATION)


def test_deterministic_from_the_seed():
    again = ev.make_questions(200, seed=0, duration=DURATION)
    assert [q.question for q in again] == [q.question for q in QUESTIONS] and again[7].video == QUESTIONS[7].video
    assert [q.question for q in ev.make_questions(20, seed=1)] != [q.question for q in QUESTIONS[:20]]


def test_windows_hold_exactly_their_event_and_crops_catch_it():
    for q in QUESTIONS:
        assert len(q.windows) == ev.WINDOWS[q.kind] and len(set(q.centres)) == len(q.centres)
        for window, colour in zip(q.windows, q.facts):
            inside = [e for e in q.video.events if e.start < window[1] and e.end > window[0]]
            assert len(inside) == 1 and inside[0].color == colour  # only the named event
            assert window[0] <= inside[0].start and inside[0].end <= window[1]
            times = crop_times(window)
            assert ((times >= inside[0].start) & (times < inside[0].end)).sum() >= 2  # on two crop frames
            assert f"{window[0]:.0f}-{window[1]:.0f}" in q.question  # the window is named
        assert set(q.centres) <= set(ev.slots(DURATION).tolist())  # on the slot grid
        assert all(ev.centre(e) in ev.slots(DURATION) for e in q.video.events)
        assert q.video.name.endswith("/" + ev.VIDEO_FILE)  # one file name: the call's path is a constant
    assert ev.slots(DURATION).tolist() == [4, 12, 20, 28, 36, 44]
    with pytest.raises(ValueError, match="has 3 slots"):
        ev.make_events_video(0, 24.0, 4)


def test_answers_follow_from_the_events_only():
    """The options are the colours in one fixed order, so the letter is a fixed function of
    the answer's colour: that of the one window (colour) or of the named windows' only shape
    of the asked kind (find2, find3). The question states no colour of its events; every kind
    occurs and the questions average two windows or more."""
    for q in QUESTIONS:
        options = dict(re.findall(r"^([ABCD])\. (.+)$", q.question, re.M))
        assert [options[letter] for letter in "ABCD"] == list(ev.TOY_COLORS)
        assert len(q.shapes) == len(q.facts) == ev.WINDOWS[q.kind]
        if q.kind == "colour":
            assert options[q.answer] == q.facts[0]
        else:
            assert len(set(q.shapes)) == len(q.shapes) and q.shapes.count(q.target) == 1
            assert options[q.answer] == q.facts[q.shapes.index(q.target)]
            assert f"What colour is the {q.target}?" in q.question
        stem = q.question.split("\n")[0]
        assert not any(c in stem for c in ev.TOY_COLORS)
        assert ev.final_turn(q).endswith(f": {options[q.answer].capitalize()}.\n</think>\n<answer>{q.answer}</answer>")
    kinds = [q.kind for q in QUESTIONS]
    assert set(kinds) == set(ev.KINDS)
    assert np.mean([ev.WINDOWS[k] for k in kinds]) >= 2.0
    assert len({q.answer for q in QUESTIONS}) == 4


def test_no_answer_is_likely_before_looking():
    """Within each kind the answer letters are near uniform, and one crop of a find question
    usually does not answer it (the asked shape is in another window), so a model that ignores
    the video scores near chance and one call is not enough."""
    for kind in ev.KINDS:
        answers = [q.answer for q in QUESTIONS if q.kind == kind]
        shares = [answers.count(letter) / len(answers) for letter in "ABCD"]
        assert max(shares) < 0.4 and min(shares) > 0.1, (kind, shares)
    for kind, share in (("find2", 1 / 2), ("find3", 1 / 3)):
        first = [q.shapes[0] == q.target for q in QUESTIONS if q.kind == kind]
        assert abs(np.mean(first) - share) < 0.15, (kind, np.mean(first))


def test_sparse_overview_misses_the_events_and_dense_one_sees_them():
    named = [(e, q) for q in QUESTIONS for e in q.video.events if ev.centre(e) in q.centres]
    rate = lambda k: np.mean([seen_times(overview_times(k), e) for e, _ in named])
    all_seen = lambda k: np.mean([all(seen_times(overview_times(k), e) for e in q.video.events
                                      if ev.centre(e) in q.centres) for q in QUESTIONS])
    assert rate(4) == 0 and all_seen(4) == 0  # K = 4 falls between the slots
    assert rate(8) < 0.5 and all_seen(8) < 0.3
    assert rate(64) > 0.95


def test_trajectories_crop_the_named_windows():
    q = next(q for q in QUESTIONS if q.kind == "find3")
    messages = ev.main_messages(q, "videos/x.mp4", "frames")
    calls = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", messages[2]["content"][0]["text"])
    windows = [(json.loads(c)["arguments"]["start_time"], json.loads(c)["arguments"]["end_time"]) for c in calls]
    assert windows == [tuple(int(t) for t in w) for w in q.windows] and len(windows) == 3
    crops = [m["content"][0] for m in messages[3:6]]
    assert [(c["video_start"], c["video_end"]) for c in crops] == list(q.windows)
    assert all(c["crop_response"] == "timestamped" for c in crops)
    assert messages[-1]["content"][0]["text"].endswith(f"<answer>{q.answer}</answer>")
    sub = ev.main_messages(q, "videos/x.mp4", "subagent")
    for message, colour, shape in zip(sub[3:6], q.facts, q.shapes):
        assert f"A {colour} {shape} is visible" in message["content"][0]["text"]
    assert len(ev.subagent_rows(q, "videos/x.mp4")) == 3
    with pytest.raises(ValueError, match="events SFT mode 'x'"):
        ev.main_messages(q, "videos/x.mp4", "x")


def test_written_dataset_and_frames_mode_rows_render_as_rollouts_do(tmp_path):
    from paravt_jax.data.sft_examples import FrameSpec, sft_inputs
    from paravt_jax.text.tokenizer import train_tokenizer

    ds = ev.write_events_dataset(str(tmp_path), num_train=3, num_eval=2, seed=3, duration=24.0)
    assert len(pq.read_table(ds.rl_train)) == 3 and len(pq.read_table(ds.rl_eval)) == 2
    info = json.loads(pq.read_table(ds.rl_eval).to_pylist()[0]["extra_info"])
    assert info["question_type"] == "mcq" and info["answer"] == ds.eval_questions[0].answer
    rows = pq.read_table(ds.sft).to_pylist()
    kinds = [r["kind"] for r in rows]
    assert kinds.count("main_frames") == 3 and kinds.count("main_subagent") == 3
    assert kinds.count("subagent") == 3  # one sub-agent example per question (subagent_examples=1)
    every = ev.write_events_dataset(str(tmp_path / "all"), num_train=3, num_eval=2, seed=3, duration=24.0,
                                    sft_modes=("subagent",), subagent_examples=0)
    counted = [r["kind"] for r in pq.read_table(every.sft).to_pylist()].count("subagent")
    assert counted == sum(len(q.windows) for q in every.questions)
    q = ds.questions[0]
    row = json.loads(next(r["messages"] for r in rows if r["kind"] == "main_frames"))
    tokenizer = train_tokenizer(ev.corpus(list(ds.questions)), split="json")
    inputs = sft_inputs(row, tokenizer, str(tmp_path), FrameSpec(nframes=4, max_pixels=96 * 160))
    text = tokenizer.decode(inputs.input_ids)
    start, end = q.windows[0]
    assert f"<tool_response>\n4 frames from {start:.1f} s to {end:.1f} s.\n<{start:.1f} seconds>" in text
    assert text.count("<tool_response>") == len(q.windows)
    assert os.path.isfile(os.path.join(str(tmp_path), "videos", q.video.name))


def test_digits_split_makes_the_prompt_and_the_call_cheap():
    """Only digit runs stand apart: the repeated system prompt and call skeleton shrink to a
    few tokens, and a copied number is one token, the same in the question and in the call."""
    from paravt_jax.text.chat import crop_video_tool, tools_system_prompt
    from paravt_jax.text.tokenizer import train_tokenizer

    corpus = ev.corpus(QUESTIONS[:80])
    words, digits = train_tokenizer(corpus, split="words"), train_tokenizer(corpus, split="digits")
    system = tools_system_prompt([crop_video_tool(layout="flat")])
    assert len(digits.encode(system)) <= 0.15 * len(words.encode(system))
    q = QUESTIONS[0]
    block = ev.tool_call_block(ev.VIDEO_FILE, q.windows[0])
    assert len(digits.encode(block)) <= 0.3 * len(words.encode(block))
    for text in (system, block, q.question, ev.final_turn(q), ev.first_turn(q)):
        assert digits.decode(digits.encode(text)) == text
    for number in (str(int(w)) for w in q.windows[0]):
        token = digits.encode(number)
        assert len(token) == 1 and token[0] in digits.encode(q.question) and token[0] in digits.encode(block)
    # a turn that starts after the rollouts' forced "<think>\n" tokenizes as the SFT text does
    turn = ev.first_turn(q)
    assert turn.startswith("<think>\n")
    assert digits.encode(turn) == digits.encode("<think>\n") + digits.encode(turn[len("<think>\n"):])
    # special tokens cut the corpus: no regular token spans one
    assert all("<tool_call>" not in digits.decode([i]) or digits.decode([i]) == "<tool_call>"
               for i in range(900))


def test_the_answer_is_one_look_up_of_the_subject():
    """The final think's subject (the asked shape) is one token and its capitalised colour the
    next, a token of its own; each summary names colour and shape in one token. Without the
    apart words the whole sentence would merge into one token."""
    from paravt_jax.text.tokenizer import TokenizerError, train_tokenizer

    corpus = ev.corpus(QUESTIONS[:80])
    tok = train_tokenizer(corpus, split="digits", apart=ev.ANSWER_WORDS)
    ids = {w: tok.encode(w) for w in ev.ANSWER_WORDS}
    assert all(len(i) == 1 for i in ids.values()) and len({i[0] for i in ids.values()}) == 4
    for q in (q for q in QUESTIONS[:40] if q.kind != "colour"):
        final = ev.final_turn(q)
        pieces = [tok.decode([i]) for i in tok.encode(final)]
        colour = ev.ANSWER_WORDS["ABCD".index(q.answer)]
        k = pieces.index(colour)
        assert pieces[k - 1] == f"The {q.target}: " and tok.decode(tok.encode(final)) == final
        summary = ev.window_summary(q, q.windows[0])
        first = tok.decode(tok.encode(summary)[:1])
        assert q.facts[0] in first and q.shapes[0] in first, first  # colour and shape: one token
    plain = train_tokenizer(corpus, split="digits")
    assert len(plain.encode(ev.final_turn(QUESTIONS[0]))) < len(tok.encode(ev.final_turn(QUESTIONS[0])))
    for bad, split in ((("red!",), "digits"), (("red",), "words")):
        with pytest.raises(TokenizerError, match="apart words"):
            train_tokenizer(corpus, split=split, apart=bad)


def test_json_split_makes_the_tool_call_cheap():
    from paravt_jax.text.tokenizer import TokenizerError, train_tokenizer

    corpus = ev.corpus(QUESTIONS[:80])
    words, json_split = train_tokenizer(corpus, split="words"), train_tokenizer(corpus, split="json")
    block = ev.tool_call_block(QUESTIONS[0].video.name, QUESTIONS[0].windows[0])
    assert len(json_split.encode(block)) <= 0.7 * len(words.encode(block))
    for text in (block, QUESTIONS[1].question, ev.final_turn(QUESTIONS[1])):
        assert json_split.decode(json_split.encode(text)) == text
    # the numbers a call copies are the same tokens in the question and in the call
    q = QUESTIONS[0]
    number = str(int(q.windows[0][0]))
    token = json_split.encode(number)
    assert len(token) == 1 and token[0] in json_split.encode(q.question) and token[0] in json_split.encode(block)
    with pytest.raises(TokenizerError, match="split 'x'"):
        train_tokenizer(corpus, split="x")


def test_toy_config_builds():
    from paravt_jax.configs import paragrpo
    from paravt_jax.data.builtin import BUILTIN_MODELS

    c = paragrpo.get_config("toy")
    assert c.data.task == "events" and c.data.num_eval >= 32 and c.model.preset in BUILTIN_MODELS
    assert build_run(c).sft.nframes == 4 and build_run(c).rl.rollout.mode == "subagent"
    held_out = build_run(c).evals["held_out"]
    assert held_out.mode == "subagent" and tuple(c.data.sft_modes) == ("subagent",)
    assert held_out.limit == 0  # every held-out question
    tiny = paragrpo.get_config("tiny")
    assert tiny.data.task == "shapes" and "sft_modes" not in tiny.data


def test_call_validity_counts_blocks_less_their_errors():
    from types import SimpleNamespace as Rollout

    from paravt_jax.eval.held_out import call_validity

    call = '<tool_call>\n{"name": "crop_video", "arguments": {}}\n</tool_call>'
    good = Rollout(turn_texts=(f"<think>\nx\n</think>\n{call}\n{call}", "<answer>A</answer>"), errors=())
    bad = Rollout(turn_texts=(f"{call}\n{call}\n{call}",),
                  errors=("tool_call 2: not JSON", "call 3 was not executed: at most 2 tool calls run per turn"))
    assert call_validity([good]) == 1.0 and call_validity([good, bad]) == 0.8
    assert call_validity([Rollout(turn_texts=("<answer>A</answer>",), errors=())]) == 1.0
