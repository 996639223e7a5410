"""The shortcut prior of a cold start (sft.direct_from_nframes, sft.direct_share): tool-calling
SFT rows on dense overviews trained as direct answers."""
import json

import pytest

from paravt_jax.config import ConfigValueError
from paravt_jax.data import events
from paravt_jax.data.sft_examples import DIRECT_THINK, FrameSpec, direct_answer
from paravt_jax.sft.trainer import SFTConfig, answers_directly


def trajectory(answer="C"):
    """A main trajectory in the SFT schema: system, user, a turn with two calls, the two tool
    responses (user messages), the final turn."""
    arguments = {"video_path": "v.mp4", "start_time": 2, "end_time": 6}
    call = "<tool_call>\n" + json.dumps({"name": "crop_video", "arguments": arguments}) + "\n</tool_call>"
    first = "<think>\nTwo windows.\n</think>\n" + call + call
    final = f"<think>\nFrom the crops.\n</think>\n<answer>{answer}</answer>"
    return [{"role": "system", "content": "tools"},
            {"role": "user", "content": [{"type": "video_url", "video_url": {"url": "v.mp4"}},
                                         {"type": "text", "text": "What colour is the circle?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": first}]},
            {"role": "user", "content": "<tool_response>\nA red circle.\n</tool_response>"},
            {"role": "user", "content": "<tool_response>\nA blue square.\n</tool_response>"},
            {"role": "assistant", "content": [{"type": "text", "text": final}]}]


def test_a_tool_calling_trajectory_becomes_its_prompt_and_the_final_answer():
    messages = trajectory("C")
    direct = direct_answer(messages)
    assert direct[:2] == messages[:2] and len(direct) == 3
    reply = DIRECT_THINK + "<answer>C</answer>"
    assert direct[2] == {"role": "assistant", "content": [{"type": "text", "text": reply}]}
    assert messages == trajectory("C")  # the row itself is not changed


def test_rows_without_a_call_or_an_answer_stay_as_they_are():
    tool_free = [{"role": "user", "content": "q"},
                 {"role": "assistant", "content": "<think>\nx\n</think>\n<answer>A</answer>"}]
    subagent = [{"role": "user", "content": "segment"}, {"role": "assistant", "content": "A red circle."}]
    no_answer = trajectory()
    no_answer[-1] = {"role": "assistant", "content": "<think>\nunsure\n</think>"}
    assert direct_answer(tool_free) is None and direct_answer(subagent) is None and direct_answer(no_answer) is None


def test_direct_rows_follow_the_overview_budget_and_the_share():
    config = SFTConfig(direct_from_nframes=32, direct_share=0.5, seed=3)
    rows = range(400)
    assert not any(answers_directly(i, FrameSpec(nframes=16), config) for i in rows)
    chosen = [i for i in rows if answers_directly(i, FrameSpec(nframes=64), config)]
    assert 150 < len(chosen) < 250  # about half, drawn per row
    assert chosen == [i for i in rows if answers_directly(i, FrameSpec(nframes=32), config)]  # per row, not per K
    assert chosen != [i for i in rows if answers_directly(i, FrameSpec(nframes=64), SFTConfig(
        direct_from_nframes=32, direct_share=0.5, seed=4))]  # another seed, other rows
    assert all(answers_directly(i, FrameSpec(nframes=64), SFTConfig(direct_from_nframes=32)) for i in rows)
    assert not any(answers_directly(i, FrameSpec(nframes=64), SFTConfig()) for i in rows)  # off by default
    with pytest.raises(ConfigValueError, match="direct_share"):
        SFTConfig(direct_share=1.5)


def test_the_events_main_rows_have_direct_forms():
    """Every main trajectory of the toy set has a direct form ending in its own answer, in the
    words of the set's tool-free rows."""
    for q in events.make_questions(6, seed=1):
        direct = direct_answer(json.loads(json.dumps(events.main_messages(q, "v.mp4", "subagent"))))
        assert direct[-1]["content"][0]["text"] == events.tool_free_turn(q)
        assert events.tool_free_turn(q).startswith(DIRECT_THINK)
