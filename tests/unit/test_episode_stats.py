"""Format compliance, kappa and calls per tool turn: one definition, hand-counted cases."""
import pytest

from paravt_jax.episodes.episode_stats import calls_per_tool_turn, format_compliant, tool_use, turn_problems

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


def test_summarize_splits_the_tool_call_rate_and_accuracy_by_overview_budget():
    from types import SimpleNamespace

    import numpy as np

    from paravt_jax.episodes.episode_stats import summarize

    def rollout(text, k, tools=True):
        return SimpleNamespace(turn_texts=(text,), nframes=k, tools=tools, calls_per_turn=(), turns=1, errors=(),
                               inputs=SimpleNamespace(loss_mask=np.ones(3)))

    rollouts = [rollout(COMPLIANT_WITH_CALL, 4), rollout(COMPLIANT_NO_CALL, 4), rollout(COMPLIANT_NO_CALL, 64),
                rollout(COMPLIANT_WITH_CALL, 0)]
    rewards = [{"total": t, "acc_reward": a, "format_reward": 0.0, "tool_reward": 0.0}
               for t, a in ((2.0, 1.0), (1.0, 0.0), (0.5, 0.0), (1.5, 1.0))]
    got = summarize(rollouts, rewards, prefix="rl/")
    assert got["rl/nframes_4"] == 0.5 and got["rl/nframes_64"] == 0.25 and got["rl/nframes_fps"] == 0.25
    assert got["rl/kappa_at_4"] == 0.5 and got["rl/kappa_at_64"] == 0.0 and got["rl/kappa_at_fps"] == 1.0
    assert got["rl/acc_reward_at_4"] == 0.5 and got["rl/acc_reward_at_64"] == 0.0
    assert "rl/acc_reward_at_4" not in summarize(rollouts, [], prefix="rl/")  # no rewards: no accuracy
    assert "rl/tool_free" not in got  # every prompt offered the tools
    tool_free = [rollout(COMPLIANT_WITH_CALL, 4, tools=False), rollout(COMPLIANT_NO_CALL, 64, tools=False)]
    free = summarize(rollouts + tool_free, [], prefix="rl/")
    assert free["rl/tool_free"] == 2 / 6 and free["rl/kappa_tool_free"] == 0.5


# Turns the episode log flags, each with the problem it names: none of them counts as compliant,
# alone or as one turn of an otherwise well-formed episode.
MALFORMED = {
    "<think>a</think></think><answer>A</answer>": "unbalanced tags",  # a second </think>
    "<think>a</think><answer>A</answer></answer>": "unbalanced tags",
    "<think>a<answer>A</answer>": "<think> is never closed",
    f"<think>a</think>{CALL}</tool_call>": "unbalanced tags",
    "<think>a</think><tool_call>{not json</tool_call>": "not valid JSON",
    "<think>a</think>": "neither a tool call nor an answer",
}


@pytest.mark.parametrize("turn", sorted(MALFORMED))
def test_a_turn_the_log_flags_is_never_compliant(turn):
    from paravt_jax.episodes.episode_log import turn_problems as logged

    assert logged is turn_problems  # the log shows the metric's own definition
    assert any(MALFORMED[turn] in problem for problem in turn_problems(turn))
    assert not format_compliant(turn)
    assert not format_compliant([f"<think>a</think>{CALL}", turn])
    assert tool_use([[turn]], [()])["format_compliance"] == 0.0


def test_a_well_formed_episode_of_two_turns_is_compliant():
    turns = [f"<think>\nlook</think>\n{CALL}\n{CALL}", "<think>\nseen</think>\n<answer>B</answer>"]
    assert [turn_problems(t) for t in turns] == [[], []]
    assert format_compliant(turns) and tool_use([turns], [(2,)])["format_compliance"] == 1.0
    assert not format_compliant(turns[:1])  # no answer yet
