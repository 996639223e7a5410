"""Rewards and metrics: hand-derived scores of the reference (ParaVT rl/rewards) semantics,
plus property tests that no reward function raises on any text."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paravt_jax.episodes import metrics, rewards
from paravt_jax.episodes.rewards import (
    accuracy_reward,
    anchor_reward,
    compose_reward,
    extract_answer,
    format_reward,
    has_parseable_tool_call,
    has_substantive_think,
    normalize_text,
    think_before_tool,
    tool_reward,
)

approx = lambda x: pytest.approx(x, abs=1e-12)  # noqa: E731

CALL_JSON = ('{"name": "crop_video", "arguments": {"video_path": "v.mp4", '
             '"start_time": 10, "end_time": 20}}')
FULL = "<think>\nThe man picks up the red cup at 12 s.\n</think>\n<answer>B</answer>"
# What the released workflow actually scores with think-prefix on: `<think>\n` belongs to the
# prompt (loss mask 0), so the decoded completion starts inside the think block.
NO_OPEN = "The man picks up the red cup.\n</think>\n<answer>B</answer>"
UNCLOSED = "<think>\nI should look at the part where the cup appears"
TOOL = ("<think>\nI need a closer look at 10-20 s.\n</think>\n"
        f"<tool_call>\n{CALL_JSON}\n</tool_call>")
TOOL_RESP = (TOOL + "\n<tool_response>\nA man lifts a red cup.\n</tool_response>\n"
             "<think>\nThe crop shows the red cup.\n</think>\n<answer>B</answer>")
EMPTY_TAGS = "<think></think><answer></answer>"
ANSWER_ONLY = "<answer>B</answer>"
SHORT_THINK = "<think>ok</think><answer>B</answer>"
TOOL_CODE = ("<think>\nLet me crop the video segment.\n"
             "<tool_code>\ncrop_video('v.mp4', 5, 9)\n</tool_code>")
BLANK_ANSWER = "<think>\nThe man picks up the red cup.\n</think>\n<answer>   </answer>"


# ------------------------------------------------------------------ extraction / helpers

@pytest.mark.parametrize("text, expected", [
    ("<answer> B </answer>", "B"),
    ("<answer>A</answer> then <answer>C</answer>", "A"),  # first pair wins
    ("<answer>\nline one\nline two\n</answer>", "line one\nline two"),
    ("<think>hm</think>\nThe answer is C.<|im_end|>", "The answer is C."),
    # after </think>: complete tool blocks removed, then the rest
    ("<think>x</think>\n<tool_response>\nfoo\n</tool_response>\nC", "C"),
    ("<think>x</think><tool_code>crop_video(1,2)</tool_code> 12.5, 20.0 <|im_end|>", "12.5, 20.0"),
    # nothing left after </think> -> last usable line of the WHOLE text; "</tool_call>"
    # does not start with "<tool_" so it is the "answer" here
    (TOOL, "</tool_call>"),
    ("no tags at all\nB\n<|im_end|>", "B"),
    ("B\n<tool_response>x", "B"),
    ("<answer>unclosed", "<answer>unclosed"),
    ("", ""),
    ("   \n<|im_end|>\n<tool_call>", ""),
    (EMPTY_TAGS, ""),  # first pair has an empty body -> "" (no fallback)
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("  The Answer: A cat!  ", "answer cat"),
    ("Theatre and an_apple", "theatre and an_apple"),  # whole words only; _ is a word char
    ("[12.5, 20.0]", "125 200"),
    ("(B)", "b"),
    ("a an the", ""),
])
def test_normalize_text(text, expected):
    assert normalize_text(text) == expected


@pytest.mark.parametrize("text, expected", [
    (TOOL, True),
    (f"<tool_call>{CALL_JSON}", True),  # unclosed last block runs to the end
    ('<tool_call>{"x": 1}</tool_call>', False),  # no "name"
    ('<tool_call>[{"name": "crop_video"}]</tool_call>', False),  # not an object
    ("<tool_call>crop_video(1, 2)</tool_call>", False),  # not JSON
    ("<tool_call><|im_end|></tool_call>", False),
    ("<tool_call></tool_call>", False),
    ('<tool_call>bad</tool_call><tool_call>{"name": 1}</tool_call>', True),  # any block
    ("<tool_code>\ncrop_video('v.mp4', 5, 9)\n</tool_code>", True),
    ("<tool_code>\n# crop_video(1, 2)\n</tool_code>", False),  # comment only
    ("<tool_code>crop_video</tool_code>", False),  # no "("
    ("<tool_code></tool_code>", False),
    ("<tool_code>  \n  x (\n", True),
    ("<tool_call>" + "[" * 100000, False),  # the reference crashes (RecursionError)
])
def test_has_parseable_tool_call(text, expected):
    assert has_parseable_tool_call(text) is expected


@pytest.mark.parametrize("text, expected", [
    (FULL, True),
    (UNCLOSED, True),  # open block up to the end
    ("<think>0123456789</think>", True),  # exactly 10 chars
    ("<think> 012345678 </think>", False),  # 9 after strip
    ("<think>short</think> <think>this is a long enough thought", False),  # closed wins
    ("<think>long enough reasoning<answer>B</answer>", True),
    ("<think>tiny<tool_call>x</tool_call> and many more characters later", False),
    ("<think>tiny<|im_end|>lots of further characters", False),
    (NO_OPEN, False),
    ("", False),
])
def test_has_substantive_think(text, expected):
    assert has_substantive_think(text) is expected


@pytest.mark.parametrize("text, expected", [
    (TOOL, True),
    ("<tool_call>x</tool_call><think>late</think>", False),
    ("<think>x</think>", False),  # no tool tag at all
    ("<think>x</think><tool_response>y</tool_response>", False),  # responses don't count
    ("<tool_code>a(</tool_code><think>x</think><tool_call>", False),
    ("<think><tool_code>a(</tool_code>", True),
])
def test_think_before_tool(text, expected):
    assert think_before_tool(text) is expected


# ------------------------------------------------------------------ metrics

@pytest.mark.parametrize("pred, truth, expected", [
    ("the cat sat", "cat sat", 1.0),
    # sets for the overlap, token LISTS for the denominators: common = {cat} (1),
    # P = 1/3, R = 1/2, F1 = 2PR/(P+R) = 0.4 (SQuAD's multiset F1 would give 0.8)
    ("cat cat cat", "cat cat", 0.4),
    # common {cat, sat}: P = 2/3 ("the" dropped), R = 2/4 -> 4/7
    ("the cat cat sat", "cat sat on mat", 4 / 7),
    ("dog", "cat", 0.0),
    ("", "cat", 0.0),
    ("the", "a", 0.0),  # both normalise to nothing
])
def test_f1_score(pred, truth, expected):
    assert metrics.f1_score(pred, truth) == approx(expected)


@pytest.mark.parametrize("pred, truth, expected", [
    ("B", "B", 1.0), ("b", "B", 1.0), ("B", " b ", 1.0), ("(B)", "B", 1.0),
    ("Option B", "B", 1.0), ("option (B)", "B", 1.0), ("The answer is B", "B", 1.0),
    ("the answer is (B).", "B", 1.0), ("B.", "B", 1.0), ("B) blue cup", "B", 1.0),
    ("B: blue", "B", 1.0), ("I think B is right", "B", 1.0),
    ("A or B", "B", 0.0),  # the catch-all takes the FIRST stand-alone letter (A)
    ("The answer is B", "A", 0.0),
    ("(b)", "B", 0.0),  # letters in patterns are case-sensitive
    ("Option b", "B", 0.0),
    ("BEST", "B", 0.0),  # no word boundary
    ("E", "E", 0.0), ("B", "AB", 0.0), ("B", "", 0.0),  # truth must be one of A-D
    ("", "B", 0.0),
])
def test_mcq_accuracy(pred, truth, expected):
    assert metrics.mcq_accuracy(pred, truth) == expected


@pytest.mark.parametrize("pred, truth, expected", [
    # [12.5, 20] vs [10, 20]: overlap 7.5, union 7.5 + 10 - 7.5 = 10
    ("The event happens at [12.5, 20.0] seconds.", "10.0, 20.0", 0.75),
    ("[3, 7]", "[3.0,7.0]", 1.0),
    ("[0, 5]", "[5, 10]", 0.0),  # touching, no overlap
    ("[0, 10]", "[5, 15]", 5 / 15),
    ("20, 10", "10, 20", 0.0),  # end <= start
    ("5, 5", "5, 5", 0.0),
    ("from 3 to 7", "3, 7", 0.0),  # needs a comma-separated pair
    ("1.2.3, 4", "1, 4", 0.0),  # the reference raises ValueError here
    ("., 5", "1, 4", 0.0),
    ("start 2, end 6 or 8, 9", "2, 6", 0.0),  # "2, end" is no pair; the first is [8, 9]
])
def test_temporal_iou(pred, truth, expected):
    assert metrics.temporal_iou(pred, truth) == approx(expected)


def test_temporal_iou_first_pair_only():
    # "6 or 8, 9": the first digit run followed by ", <digits>" is "8, 9" -> [8, 9] vs [2, 6]
    assert metrics.temporal_iou("start 2 to 6 or 8, 9", "8, 10") == approx(0.5)


# ------------------------------------------------------------------ format / anchor / tool

# columns: (answer_suffix, anchor_weight) = (on, 0), (on, 0.5), (off, 0), (off, 0.5)
FORMAT_TABLE = [
    # on: think .2 + <answer> .3 + </answer> .2 = .7, balanced +.1 -> .8;
    # anchor .4 + .3 (answer body + </answer>) = .7, x.5 = .35 -> 1.15 -> clipped 1.0
    # off: .3 + .2 + .1 = .6, +.1 -> .7; with anchor -> 1.05 -> 1.0
    ("full", FULL, (0.8, 1.0, 0.7, 1.0)),
    # no <think>: no think credit, no anchor (needs a substantive think), unbalanced think
    ("no_open", NO_OPEN, (0.5, 0.5, 0.3, 0.3)),
    # think .2; anchor -.3 (open, never closed) x.5 -> .05; unbalanced (1 vs 0)
    ("unclosed", UNCLOSED, (0.2, 0.05, 0.3, 0.15)),
    # think .2 + think-before-tool .3 + balanced .1 = .6; anchor .4 x .5 = .2 -> .8
    ("tool", TOOL, (0.6, 0.8, 0.7, 0.9)),
    # .2 + .3 + .2 + tool .3 = 1.0 (+ balanced) -> clipped 1.0
    ("tool_resp", TOOL_RESP, (1.0, 1.0, 1.0, 1.0)),
    # empty think and empty answer: nothing scores, so no balanced bonus either
    ("empty_tags", EMPTY_TAGS, (0.0, 0.0, 0.0, 0.0)),
    ("answer_only", ANSWER_ONLY, (0.6, 0.6, 0.4, 0.4)),
    ("short_think", SHORT_THINK, (0.6, 0.6, 0.4, 0.4)),
    # think open up to <tool_code>: .2 + tool .3 = .5; anchor -.3 x .5; think unbalanced
    ("tool_code", TOOL_CODE, (0.5, 0.35, 0.6, 0.45)),
    # blank answer body: no answer credit and no +.3 anchor; anchor .4 x .5 = .2
    ("blank_answer", BLANK_ANSWER, (0.3, 0.5, 0.4, 0.6)),
]


@pytest.mark.parametrize("name, text, expected", FORMAT_TABLE, ids=[r[0] for r in FORMAT_TABLE])
def test_format_reward_table(name, text, expected):
    got = tuple(format_reward(text, answer_suffix=s, anchor_weight=w)
                for s, w in ((True, 0.0), (True, 0.5), (False, 0.0), (False, 0.5)))
    assert got == tuple(approx(e) for e in expected)


def test_format_reward_negative_and_weights():
    # "<think>" with no content: not substantive, anchor -0.3 x 1.0; score <= 0 -> no bonus
    assert format_reward("<think>", answer_suffix=True, anchor_weight=1.0) == approx(-0.3)
    # a negative or zero anchor weight disables the anchor term
    assert format_reward(UNCLOSED, answer_suffix=True, anchor_weight=-1.0) == approx(0.2)
    assert format_reward(UNCLOSED, answer_suffix=True, anchor_weight=2.0) == approx(-0.4)


@pytest.mark.parametrize("text, expected", [
    (FULL, 0.7), (TOOL, 0.4), (BLANK_ANSWER, 0.4), (UNCLOSED, -0.3), ("<think>", -0.3),
    (NO_OPEN, 0.0), (SHORT_THINK, 0.0), (ANSWER_ONLY, 0.0), ("", 0.0),
])
def test_anchor_reward(text, expected):
    assert anchor_reward(text) == approx(expected)


@pytest.mark.parametrize("text, acc, expected", [
    (TOOL, 0.0, 0.1), (TOOL, 1.0, 0.6), (TOOL, 0.25, 0.6),
    (TOOL_RESP, 0.0, 0.3), (TOOL_RESP, 1.0, 0.8),
    ("<tool_response>x</tool_response>", 1.0, 0.0),  # response without a call
    ("<tool_code></tool_code><tool_response>", 1.0, 0.0),  # empty-call exploit
    (TOOL_CODE, 0.5, 0.6),
])
def test_tool_reward(text, acc, expected):
    assert tool_reward(text, acc) == approx(expected)


# ------------------------------------------------------------------ accuracy / compose

class _FixedJudge:
    def __init__(self, value):
        self.value, self.calls = value, []

    def score(self, question, prediction, truth):
        self.calls.append((question, prediction, truth))
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


@pytest.mark.parametrize("pred, answer, qtype, mode, expected", [
    ("", "B", "mcq", "f1", 0.0), ("B", "", "mcq", "f1", 0.0),
    ("The cat!", "cat", "oe", "exact", 1.0),  # normalised equality first, any type/mode
    ("B.", "B", "mcq", "exact", 1.0),
    ("I think B", "B", "mcq", "exact", 1.0),  # mcq ignores the mode
    ("[12.5, 20.0]", "10.0, 20.0", "tvg", "f1", 0.75),
    ("cat sat", "cat sat on mat", "oe", "exact", 0.0),
    ("cat sat", "cat sat on mat", "oe", "f1", 2 * 1 * 0.5 / 1.5),
    ("cat sat", "cat sat on mat", None, "f1", 2 / 3),  # None -> open-ended
    ("cat sat", "cat sat on mat", "oe", "something", 2 / 3),  # unknown mode -> F1
    ("12", 12, "oe", "f1", 1.0),  # non-string answers are str()-ed
    ("None", None, "oe", "f1", 0.0),
])
def test_accuracy_reward(pred, answer, qtype, mode, expected):
    assert accuracy_reward(pred, answer, qtype, mode=mode) == approx(expected)


def test_accuracy_reward_llm_judge_and_fallback():
    judge = _FixedJudge(0.5)
    assert accuracy_reward("a feline", "cat", "oe", mode="llm", judge=judge,
                           question="What animal?") == 0.5
    assert judge.calls == [("What animal?", "a feline", "cat")]
    # the judge is not consulted for mcq / tvg or on a normalised match
    assert accuracy_reward("B", "b", "oe", mode="llm", judge=judge) == 1.0
    assert accuracy_reward("A", "B", "mcq", mode="llm", judge=judge) == 0.0
    assert len(judge.calls) == 1
    # failures -> token F1 ("cat sat" vs "cat sat on mat": 2/3)
    for bad in (RuntimeError("boom"), float("nan"), "not a number", None):
        assert accuracy_reward("cat sat", "cat sat on mat", "oe", mode="llm",
                               judge=_FixedJudge(bad)) == approx(2 / 3)
    assert accuracy_reward("cat sat", "cat sat on mat", "oe", mode="llm") == approx(2 / 3)
    assert accuracy_reward("x", "y", "oe", mode="llm", judge=_FixedJudge(7)) == 1.0  # clamped


KW = dict(answer_suffix=True, anchor_weight=0.5, format_weight=1.0, mode="f1")


@pytest.mark.parametrize("text, answer, qtype, kw, expected", [
    (FULL, "B", "mcq", KW, (2.0, 1.0, 1.0, 0.0)),
    (FULL, "B", "mcq", {**KW, "format_weight": 0.5}, (1.5, 1.0, 1.0, 0.0)),
    (FULL, "C", "mcq", KW, (1.0, 0.0, 1.0, 0.0)),
    # accuracy sees the EXTRACTED answer ("</tool_call>" here) -> 0; tool 0.1
    (TOOL, "B", "mcq", KW, (0.9, 0.0, 0.8, 0.1)),
    (TOOL_RESP, "B", "mcq", KW, (2.8, 1.0, 1.0, 0.8)),
    (UNCLOSED, "B", "mcq", KW, (0.05, 0.0, 0.05, 0.0)),
    ("<think>\nThe event is early on.\n</think>\n<answer>[12.5, 20.0]</answer>", "10, 20",
     "tvg", {**KW, "answer_suffix": False, "anchor_weight": 0.0},
     # acc .75; fmt .3 + .2 + .1 + balanced .1 = .7; total 1.45
     (1.45, 0.75, 0.7, 0.0)),
    # vanilla recipe (all off), open-ended F1
    ("<answer>the cat sat</answer>", "cat sat on mat", "oe",
     dict(answer_suffix=False, anchor_weight=0.0, format_weight=1.0, mode="f1"),
     (2 / 3 + 0.4, 2 / 3, 0.4, 0.0)),
])
def test_compose_reward(text, answer, qtype, kw, expected):
    total, parts = compose_reward(text, answer, qtype, **kw)
    assert set(parts) == {"acc_reward", "format_reward", "tool_reward"}
    assert (total, parts["acc_reward"], parts["format_reward"], parts["tool_reward"]) == \
        tuple(approx(e) for e in expected)


def test_degenerate_guard():
    spam = "<|im_start|>" * 5 + "<think>\nplenty of thought here\n</think><answer>B</answer>"
    assert len(spam) < 300
    assert compose_reward(spam, "B", "mcq", **KW) == (
        0.0, {"acc_reward": 0.0, "format_reward": 0.0, "tool_reward": 0.0})
    # four markers, or 300+ characters: scored normally
    four = spam.replace("<|im_start|>", "", 1)
    assert compose_reward(four, "B", "mcq", **KW)[0] > 0
    long = spam + " " * (300 - len(spam))
    assert len(long) == 300 and compose_reward(long, "B", "mcq", **KW)[0] > 0


def test_question_from_prompt():
    prompt = ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
              "<|vision_start|><|image_pad|><|vision_end|>\nWhat is he holding?<|im_end|>\n"
              "<|im_start|>assistant\n")
    assert rewards.question_from_prompt(prompt) == "What is he holding?"
    assert rewards.question_from_prompt("no vision here<|im_end|>") == ""


# ------------------------------------------------------------------ never raise

FRAGMENTS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_code>", "</tool_code>",
             "<answer>", "</answer>", "<tool_response>", "</tool_response>", "<|im_start|>",
             "<|im_end|>", CALL_JSON, '{"name": 1}', '{"a": [1, {"b": null}]}', "{", "[[[",
             "crop_video(1, 2)", "# x(", "12.5, 20.0", "[3, 7]", "1.2.3, 4", "., 5", "..,..",
             "B", "(B)", "Option C", "The answer is A", "A.", "the", "\n", " ", "0", "9.99",
             "1e309", "x" * 64, "<tool_", "<|im_"]
frag_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=5)),
                     max_size=16).map("".join)
any_text = st.one_of(frag_text, st.text(max_size=60))
answers = st.one_of(st.sampled_from(["B", "a", "12.5, 20.0", "1.2.3, 4", "cat sat", ""]),
                    st.text(max_size=10))


class _FlakyJudge:
    def score(self, question, prediction, truth):
        raise TimeoutError("judge down")


@settings(max_examples=300, deadline=None)
@given(text=any_text, answer=answers, qtype=st.sampled_from(["mcq", "tvg", "oe", None]),
       suffix=st.booleans(), aw=st.sampled_from([0.0, 0.5, 1.0]),
       fw=st.sampled_from([0.5, 1.0]), mode=st.sampled_from(["f1", "exact", "llm"]))
def test_rewards_never_raise(text, answer, qtype, suffix, aw, fw, mode):
    sol = extract_answer(text)
    assert isinstance(sol, str) and sol == sol.strip()
    assert isinstance(normalize_text(text), str)
    for fn in (has_parseable_tool_call, has_substantive_think, think_before_tool):
        assert isinstance(fn(text), bool)
    for metric in (metrics.f1_score, metrics.mcq_accuracy, metrics.temporal_iou):
        for a, b in ((text, answer), (answer, text)):
            v = metric(a, b)
            assert 0.0 <= v <= 1.0
    anchor = anchor_reward(text)
    assert anchor in (0.0, 0.4, 0.4 + 0.3, -0.3)
    fmt = format_reward(text, answer_suffix=suffix, anchor_weight=aw)
    assert -0.3 * aw - 1e-12 <= fmt <= 1.0
    assert tool_reward(text, 0.0) in (0.0, 0.1, 0.3)
    assert tool_reward(text, 1.0) in (0.0, 0.1 + 0.5, 0.3 + 0.5)
    judge = _FlakyJudge() if mode == "llm" else None
    acc = accuracy_reward(sol, answer, qtype, mode=mode, judge=judge)
    assert 0.0 <= acc <= 1.0
    total, parts = compose_reward(text, answer, qtype, answer_suffix=suffix, anchor_weight=aw,
                                  format_weight=fw, mode=mode, judge=judge)
    assert math.isfinite(total)
    if not rewards.is_degenerate(text):
        assert parts == {"acc_reward": acc, "format_reward": fmt,
                         "tool_reward": tool_reward(text, acc)}
        assert total == acc + fw * fmt + parts["tool_reward"]


@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet=st.characters(), max_size=200))
def test_metrics_never_raise_on_unicode(text):
    for metric in (metrics.f1_score, metrics.mcq_accuracy, metrics.temporal_iou):
        assert 0.0 <= metric(text, text) <= 1.0
    assert 0.0 <= accuracy_reward(text, text, "tvg") <= 1.0


# A well-formed first turn under think_prefix: the "<think>\n" that opens it is forced by the
# prompt, so the generated tokens start inside the think block.
PREFIXED_TURN = ("I see sparse frames, so I zoom into two windows.\n</think>\n<tool_call>\n"
                 '{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 10, '
                 '"end_time": 20}}\n</tool_call>')


def test_forced_think_prefix_counts_for_format_and_anchor():
    # generated tokens alone (the released scoring): the think block is invisible
    assert anchor_reward(PREFIXED_TURN) == 0.0
    assert format_reward(PREFIXED_TURN, answer_suffix=True, anchor_weight=0.5) == 0.0
    # the turn as the model's context shows it: think .2 + anchor .5 x .4 + think-before-tool .3
    # + balanced .1
    shown = "<think>\n" + PREFIXED_TURN
    assert anchor_reward(shown) == approx(0.4)
    assert format_reward(shown, answer_suffix=True, anchor_weight=0.5) == approx(0.8)
    kw = dict(answer_suffix=True, anchor_weight=0.5, format_weight=1.0)
    released = compose_reward(PREFIXED_TURN, "B", "mcq", **kw)
    turns = compose_reward(PREFIXED_TURN, "B", "mcq", format_text=shown, **kw)
    assert released[1] == {"acc_reward": 0.0, "format_reward": 0.0, "tool_reward": approx(0.1)}
    assert turns[1] == {"acc_reward": 0.0, "format_reward": approx(0.8), "tool_reward": approx(0.1)}
    assert turns[0] == approx(0.9)
