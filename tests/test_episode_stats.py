"""Format compliance, kappa and calls per tool turn: one definition, hand-counted cases."""
from paravt_jax.rl.episode_stats import calls_per_tool_turn, tool_use

CALL = ('<tool_call>{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 1, "end_time": 5}}'
        "</tool_call>")
COMPLIANT_WITH_CALL = f"<think>look closer</think>{CALL}{CALL}<think>seen</think><answer>B</answer>"
COMPLIANT_NO_CALL = "<think>easy</think><answer>A</answer>"
BROKEN_CALL = "<think>x</think><tool_call>{not json</tool_call><answer>C</answer>"
NO_ANSWER = f"<think>x</think>{CALL}"


def test_tool_use_counts():
    texts = [COMPLIANT_WITH_CALL, COMPLIANT_NO_CALL, BROKEN_CALL, NO_ANSWER]
    calls = [(2,), (), (), (1, 3, 0)]
    got = tool_use(texts, calls)
    assert got["format_compliance"] == 0.5  # the first two
    assert got["kappa"] == 0.5  # the first and the last parse a named call
    assert got["calls_per_tool_turn"] == 2.0  # turns with calls: 2, 1, 3


def test_empty_sets_are_zero():
    assert tool_use([], []) == {"format_compliance": 0.0, "kappa": 0.0, "calls_per_tool_turn": 0.0}
    assert calls_per_tool_turn([(0, 0), ()]) == 0.0
