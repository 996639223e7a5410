"""Malformed call blocks under the reference workflow's reading (`protocol.malformed =
"reference"`, the reference recipes' default): the reference parser reads a turn's
`<tool_call>` blocks in one try, so one block that is not valid JSON, or lacks "name" or
"arguments", drops every call of the turn (its `<tool_code>` fallback is read instead), and a
turn left without a call is the episode's end."""
import json

import pytest

from paravt_jax.agent.dispatch import CropDispatcher, DispatchConfig
from paravt_jax.agent.protocol import ToolProtocol
from paravt_jax.agent.rollout import Episode, RolloutConfig, run_rollouts
from paravt_jax.agent.tools import parse_tool_calls
from paravt_jax.data.synthetic import Event, write_video
from paravt_jax.text.tokenizer import train_tokenizer
from support.scripted import ScriptedSampler


def block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def call(start, end) -> str:
    return block(json.dumps({"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": start,
                                                                 "end_time": end}}))


# (turn text, the calls the reference parser returns: their windows)
REFERENCE_READING = [
    (call(1, 5) + call(9, 15), [(1, 5), (9, 15)]),  # every block valid: every call
    (call(1, 5) + block("{not json"), []),  # one block not JSON: none
    (call(1, 5) + block('{"arguments": {"start_time": 2, "end_time": 4}}'), []),  # no "name": none
    (call(1, 5) + block('{"name": "crop_video"}'), []),  # no "arguments": none
    (call(1, 5) + "<tool_call>\n" + json.dumps({"name": "crop_video", "arguments": {"start_time": 20,
                                                                                  "end_time": 25}}),
     [(1, 5), (20, 25)]),  # an unclosed last block runs to the end of the text
    (block("{not json") + '\n<tool_code>\ncrop_video("v.mp4", 30, 35)\n</tool_code>', [(30, 35)]),  # the fallback
]


def windows(parsed):
    return [(c.arguments["start_time"], c.arguments["end_time"]) for c in parsed.calls]


@pytest.mark.parametrize("text,expected", REFERENCE_READING)
def test_all_or_nothing_reads_a_turn_as_the_reference_parser_does(text, expected):
    parsed = parse_tool_calls(text, all_or_nothing=True)
    assert windows(parsed) == expected
    if expected != windows(parse_tool_calls(text)):  # the default keeps the valid blocks instead
        assert windows(parse_tool_calls(text)) == [(1, 5)] and parsed.errors


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("malformed") / "v.mp4")
    return write_video(path, 40.0, [Event(10.0, 14.0, "blue", "circle")], fps=4.0, height=96, width=128, seed=1)


def run(video, malformed: str):
    tokenizer = train_tokenizer(["<think>look</think> the answer is blue crop_video start_time end_time"] * 20)
    answer = "<think>done</think>\n<answer>blue</answer>"
    bad_turn = "<think>look</think>\n" + call(1, 5) + "\n" + block("{not json")
    sampler = ScriptedSampler(tokenizer, [[bad_turn, answer]])
    config = RolloutConfig(mode="subagent", max_turns=2, protocol=ToolProtocol(malformed=malformed))
    with CropDispatcher(DispatchConfig()) as dispatcher:
        (rollout,), _ = run_rollouts(sampler, tokenizer, [Episode("e", "Colour?", "blue", "oe", video, 4)], 1,
                                     config, dispatcher)
    return rollout, [c.kind for c in sampler.calls]


def test_reference_handling_ends_the_episode_at_a_turn_with_a_malformed_block(video):
    rollout, calls = run(video, "reference")
    assert rollout.turns == 1 and rollout.calls_per_turn == () and calls == ["policy"]  # no crop, no sub-agent
    assert "<tool_response>" not in rollout.completion and rollout.errors == ()
    rollout, calls = run(video, "respond")  # today's default elsewhere: the valid call runs, the error is answered
    assert rollout.turns == 2 and rollout.calls_per_turn == (1,) and calls == ["policy", "subagent", "extend"]
    assert "not valid JSON" in rollout.completion


def test_the_reference_recipes_read_malformed_calls_as_the_reference():
    from paravt_jax.configs import paragrpo, vanilla_grpo

    for preset in ("qwen3vl_8b", "qwen3vl_2b", "qwen3vl_32b", "qwen3vl_8b_async_v5p16"):
        assert paragrpo.get_config(preset).rl.rollout.protocol.malformed == "reference", preset
    assert vanilla_grpo.get_config("qwen3vl_8b").rl.rollout.protocol.malformed == "reference"
    for preset in ("tiny", "toy"):  # the toy recipes answer each malformed block (docs/deviations.md)
        assert paragrpo.get_config(preset).rl.rollout.protocol.malformed == "respond", preset
