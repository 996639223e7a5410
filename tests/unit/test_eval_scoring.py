"""Scoring for the benchmark evaluation (reference `paravt/eval/utils.py`, `driver.py`).

Expected values were derived by hand from the reference code paths (noted per case).
"""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paravt_jax.eval import scoring as S

# (response, expected letter, which reference step produces it)
LETTER_CASES = [
    ("C", "C", "whole text is one letter"),
    ("  D \n", "D", "stripped first"),
    ("H.", "H", "stand-alone letter"),
    ("(J)", "J", "stand-alone letter, up to J"),
    ("E-F", "E", "first stand-alone letter"),
    ("Option D", "D", "stand-alone letter"),
    ("**B**", "B", "asterisks are word boundaries"),
    ("The answer is (C).", "C", "'answer is' needs the letter right after spaces; lone C wins"),
    ("The answer is F", "F", "answer-is pattern"),
    ("Answer: J", "J", "Answer: pattern"),
    ("answer:G", "G", "answer: without spaces"),
    ("Answer is\nC", "C", "newline counts as the space"),
    ("I think the answer is B", "B", "answer-is runs before the stand-alone scan"),
    ("Between B and C, the answer is C", "C", "answer-is beats the earlier lone B"),
    ("answer is A, no wait, Answer: B", "A", "first answer-is match"),
    ("I think it is B", "I", "pronoun I is a stand-alone A-J letter"),
    ("A or B", "A", "first of several letters"),
    ("ANSWER: C", "C", "upper-case ANSWER is not the pattern; lone C"),
    ("The answer is Definitely wrong", "D", "no boundary after the answer-is letter"),
    ("Because the man ran away", "B", "first-character fallback"),
    ("<answer>B</answer>", "B", "answer tag, single letter"),
    ("<answer> (E) </answer>", "E", "answer tag, lone letter inside"),
    ("<think>A looks wrong</think><answer>C</answer>", "C", "answer tag beats earlier text"),
    ("<answer>A</answer><answer>B</answer>", "A", "first answer tag"),
    ("<answer>none of them</answer> so A", "A", "empty tag verdict falls through to whole text"),
    ("<answer>AB</answer>", "", "no lone letter anywhere; first char '<'"),
    ("<answer>b</answer>", "", "lower case never matches"),
    ("b", "", "lower case single letter"),
    ("the answer is c", "", "lower-case letter after answer is"),
    ("K", "", "letters beyond J"),
    ("Option K", "", "letters beyond J; first char 'O'"),
    ("no letter here", "", "nothing; first char 'n'"),
    ("42", "", "digits only"),
    ("", "", "empty"),
    ("   \n\t", "", "whitespace only"),
]


@pytest.mark.parametrize("text,expected,why", LETTER_CASES)
def test_extract_option_letter(text, expected, why):
    assert S.extract_option_letter(text) == expected, why


@pytest.mark.parametrize("text,raw", [("no idea", "n"), ("b", "b"), ("K", "K"), ("<answer>b</answer>", "<"),
                                      ("C", "C"), ("", "")])
def test_verbatim_keeps_reference_first_character(text, raw):
    assert S.extract_letter_verbatim(text) == raw


# (response, expected span or None)
SPAN_CASES = [
    ("The event happens in the 24.3 - 30.4 seconds.", (24.3, 30.4)),
    ("<time>00:19.7 - 00:25.6</time>", (19.7, 25.6)),  # mm:ss before bare seconds
    ("from 1:05 \u2013 1:20", (65.0, 80.0)),  # en dash, 1*60+5, 1*60+20
    ("12\u201415", (12.0, 15.0)),  # em dash
    ("<time>5-9</time> but also 1-2", (5.0, 9.0)),  # tag body first
    ("<time>soon</time> at 3.0-4.0", (3.0, 4.0)),  # tag fails, whole text
    ("59:00 - 61:00", (0.0, 61.0)),  # end 3660 >= 3600 rejected; bare range hits "00 - 61"
    ("start time: 5.5, end time: 9", (5.5, 9.0)),  # start/end words
    ("Starting 40 and ending 12", (40.0, 12.0)),  # word fallback does not check the order
    ("30 - 10 seconds", (30.0, 10.0)),  # reversed range rejected, first-two-numbers fallback
    ("10-5 then 6-8", (10.0, 5.0)),  # only the first bare range is tried
    ("It occurs around 3 and 8.", (3.0, 8.0)),  # first two numbers
    ("It occurs at 3", None),
    ("no numbers", None),
    ("", None),
    ("  ", None),
]


@pytest.mark.parametrize("text,expected", SPAN_CASES)
def test_parse_span(text, expected):
    got = S.parse_span(text)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_temporal_iou_basic_and_degenerate():
    assert S.temporal_iou((0, 10), (0, 10)) == 1.0
    assert S.temporal_iou((5, 15), (0, 10)) == pytest.approx(5 / 15)  # inter 5, union 15
    assert S.temporal_iou((20, 30), (0, 10)) == 0.0  # disjoint
    assert S.temporal_iou((8, 4), (0, 10)) == 0.0  # end < start
    assert S.temporal_iou((4, 4), (0, 10)) == 0.0  # end == start
    assert S.temporal_iou((3, 3), (3, 3)) == 0.0  # empty hull
    assert S.temporal_iou(None, (0, 10)) == 0.0
    assert S.temporal_iou(("a", "b"), (0, 10)) == 0.0
    assert S.temporal_iou((0, math.inf), (0, 10)) == 0.0
    assert S.temporal_iou("2 - 4", (0, 10)) == pytest.approx(0.2)  # text is parsed


def test_grounding_metrics_hand_computed():
    truth = (0.0, 10.0)
    pairs = [
        ((0, 10), truth),  # IoU 1
        ((5, 15), truth),  # inter 5 / union 15 = 1/3
        ((0, 5), truth),  # 5/10 = 0.5
        ((2, 4), truth),  # 2/10 = 0.2
        (None, truth),  # unparseable -> 0, still counted
        ((8, 4), truth),  # reversed -> 0
    ]
    m = S.grounding_metrics(pairs)
    # mIoU = (1 + 1/3 + 0.5 + 0.2 + 0 + 0) / 6 = 2.0333.. / 6 = 0.33888..
    assert m["miou"] == pytest.approx((1 + 1 / 3 + 0.5 + 0.2) / 6)
    assert m["r@0.3"] == pytest.approx(3 / 6)  # 1, 1/3, 0.5
    assert m["r@0.5"] == pytest.approx(2 / 6)  # 1, 0.5 (inclusive)
    assert m["r@0.7"] == pytest.approx(1 / 6)  # 1
    assert set(m) == {"miou", "r@0.3", "r@0.5", "r@0.7"}


@pytest.mark.parametrize("t", [0.3, 0.5, 0.7])
def test_recall_thresholds_are_inclusive(t):
    end = round(t * 10)  # (0, 3|5|7) vs (0, 10): IoU is exactly 0.3 / 0.5 / 0.7 in floats
    at = S.grounding_metrics([((0.0, float(end)), (0.0, 10.0))])
    assert S.temporal_iou((0.0, float(end)), (0.0, 10.0)) == t
    assert at[f"r@{t}"] == 1.0
    below = S.grounding_metrics([((0.0, end - 1e-6), (0.0, 10.0))])
    assert below[f"r@{t}"] == 0.0


def test_grounding_metrics_empty():
    assert S.grounding_metrics([]) == {"miou": 0.0, "r@0.3": 0.0, "r@0.5": 0.0, "r@0.7": 0.0}


def test_score_sample_like_reference():
    mcq = {"is_mcq": True, "answer": "B"}
    assert S.score_sample(mcq, "The answer is B") == (True, 1.0, "B")
    assert S.score_sample(mcq, "no idea") == (False, 0.0, "n")
    tvg = {"is_mcq": False, "answer": [0, 10], "gt_start": 0.0, "gt_end": 10.0}
    correct, score, pred = S.score_sample(tvg, "The event happens in the 5 - 15 seconds.")
    assert correct is None and score == pytest.approx(1 / 3) and pred == "5.0-15.0"
    assert S.score_sample(tvg, "I cannot tell") == (None, 0.0, "I cannot tell")


def test_mcq_accuracy_and_tool_stats():
    recs = [{"correct": True}, {"correct": False}, {"correct": True}, {"correct": None}, {}]
    assert S.mcq_accuracy(recs) == pytest.approx(2 / 3)  # None / missing are skipped
    assert S.mcq_accuracy([]) == 0.0
    assert S.avg_tool_calls([0, 2, 3, 0]) == pytest.approx(1.25)
    assert S.tool_usage_rate([0, 2, 3, 0]) == pytest.approx(0.5)
    assert S.avg_tool_calls([]) == 0.0 and S.tool_usage_rate([]) == 0.0
    assert S.tool_usage_rate([{"tool_calls": 1}, {}]) == pytest.approx(0.5)


def test_breakdowns():
    recs = [
        {"duration_bucket": "short", "task": "count", "score": 1.0},
        {"duration_bucket": "short", "task": "order", "score": 0.0},
        {"duration_bucket": "long", "task": "count", "score": 1.0},
        {"duration": "medium", "config": "order", "score": 0.0},
        {"task": "count", "score": None},
    ]
    assert S.per_duration(recs) == {"short": {"accuracy": 0.5, "count": 2},
                                    "long": {"accuracy": 1.0, "count": 1},
                                    "medium": {"accuracy": 0.0, "count": 1}}
    assert S.per_task(recs) == {"count": {"accuracy": 1.0, "count": 2},
                                "order": {"accuracy": 0.0, "count": 2}}


def test_dataset_summary_mcq_videomme():
    results = [
        {"id": 1, "correct": True, "score": 1.0, "tool_calls": 2, "duration": "short"},
        {"id": 2, "correct": False, "score": 0.0, "tool_calls": 0, "duration": "short"},
        {"id": 3, "correct": True, "score": 1.0, "tool_calls": 1, "duration": "long"},
        {"id": 4, "correct": False, "score": 0.0, "tool_calls": 0, "error": "video not found"},
    ]
    s = S.dataset_summary("videomme", results, is_mcq=True, nframes=64)
    assert list(s)[:7] == ["dataset", "total", "errors", "avg_tool_calls", "tool_usage_rate",
                           "elapsed", "nframes"]
    assert s["total"] == 4 and s["errors"] == 1
    assert s["accuracy"] == pytest.approx(0.5) and s["mcq_total"] == 4  # error counts as wrong
    assert s["avg_tool_calls"] == pytest.approx(0.75) and s["tool_usage_rate"] == pytest.approx(0.5)
    assert s["acc_short"] == 0.5 and s["n_short"] == 2 and s["acc_long"] == 1.0
    assert "acc_medium" not in s
    assert "acc_short" not in S.dataset_summary("videomme_wsub", results, is_mcq=True, nframes=64)


def test_dataset_summary_grounding_drops_errors():
    results = [
        {"key": "v1>>>a", "score": 0.8, "tool_calls": 1, "pred_text": "1 - 2", "correct": None},
        {"key": "v2>>>b", "score": 0.4, "tool_calls": 0, "pred_text": "3 - 4", "correct": None},
        {"key": "v3>>>c", "score": 0.0, "tool_calls": 0, "error": "api error"},
    ]
    out = S.dataset_output("charades", results, is_mcq=False, nframes=64)
    s = out["summary"]
    assert s["mIoU"] == pytest.approx(0.6)  # (0.8 + 0.4) / 2, errored sample excluded
    assert s["R@0.3"] == 1.0 and s["R@0.5"] == 0.5 and s["R@0.7"] == 0.5
    assert s["submission_count"] == 2
    assert out["submission"] == {"v1>>>a": "1 - 2", "v2>>>b": "3 - 4"}


_TOKENS = st.sampled_from(["<answer>", "</answer>", "<time>", "</time>", "answer is ", "Answer:", "A",
                           "J", "I", "k", " ", "12", "3.5", " - ", "\u2013", "1:05", "9" * 400, ":",
                           "start ", "end ", "\u0663", "\n"])


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(), st.lists(_TOKENS, max_size=12).map("".join)))
def test_never_raises(text):
    letter = S.extract_option_letter(text)
    assert letter == "" or letter in "ABCDEFGHIJ" and len(letter) == 1
    span = S.parse_span(text)
    assert span is None or (len(span) == 2 and all(isinstance(v, float) for v in span))
    assert 0.0 <= S.temporal_iou(span, (0.0, 10.0)) <= 1.0


def test_long_digit_runs_are_fast():
    # the reference's bare-range regex backtracks cubically here (1,600 digits take ~20 s, so
    # these inputs would take minutes); linear parsing takes milliseconds, and the generous bound
    # keeps a loaded machine from failing it
    import time

    t0 = time.perf_counter()
    assert S.parse_span("9" * 5000) is None  # one number only
    assert S.parse_span("1" * 3000 + " and 2") == (math.inf, 2.0)  # float() of 3000 digits is inf
    assert S.parse_span("<time>" + "7" * 4000 + "</time>") is None
    assert time.perf_counter() - t0 < 30.0
