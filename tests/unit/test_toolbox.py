"""The tool seam (agent/toolbox.py): a second tool is a class given to the dispatcher, and the
rollout lists it, runs it beside crop_video in one round and answers with its text."""
import dataclasses
import json

import pytest

from paravt_jax.agent.dispatch import CropDispatcher, CropTask, CropVideo, DispatchConfig
from paravt_jax.agent.rollout import Episode, RolloutConfig, run_rollouts
from paravt_jax.agent.toolbox import Observation, Tool, find_tool
from paravt_jax.agent.tools import ToolCall, parse_time
from paravt_jax.data.synthetic import Event, write_video
from paravt_jax.text.tokenizer import train_tokenizer
from support.scripted import ScriptedSampler


@dataclasses.dataclass(frozen=True)
class Clock:
    """A text tool: the time of day a timestamp of the video reads as, m:ss."""
    name: str = "clock"

    def schema(self, layout: str) -> dict:
        parameters = {"time": {"type": "number", "description": "seconds into the video"}}
        if layout == "object":
            parameters = {"type": "object", "properties": parameters, "required": ["time"]}
        return {"type": "function", "function": {"name": self.name, "description": "m:ss of a time",
                                                 "parameters": parameters}}

    def request(self, call: ToolCall, duration: float, lenient: bool) -> float:
        seconds = parse_time(call.arguments.get("time"))
        if not 0 <= seconds < duration:
            raise ValueError(f"time {seconds:g} is outside the video (0 to {duration:g} s)")
        return seconds

    def run(self, request: float, video_path: str) -> Observation:
        return Observation(text=f"{int(request) // 60}:{int(request) % 60:02d}")


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("toolbox") / "episode.mp4")
    return write_video(path, 40.0, [Event(10.0, 14.0, "blue", "circle")], fps=4.0, height=96, width=128, seed=1)


def call_block(name, **arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_tools_are_protocol_members_and_calls_find_theirs_by_name():
    tools = (CropVideo(), Clock())
    assert all(isinstance(tool, Tool) for tool in tools)
    assert find_tool(tools, ToolCall("clock", {}), lenient=False) is tools[1]
    with pytest.raises(ValueError, match="unknown tool 'zoom'; the tools are crop_video, clock"):
        find_tool(tools, ToolCall("zoom", {}), lenient=False)
    assert find_tool(tools, ToolCall("zoom", {}), lenient=True) is tools[0]  # the driver's reading
    with pytest.raises(ValueError, match="either a clip or a text"):
        Observation()
    with pytest.raises(ValueError, match="each name once"):
        CropDispatcher(tools=(Clock(), Clock()))


def test_the_dispatcher_runs_each_call_with_its_tool(video):
    tasks = [CropTask(0, 0, video, 40.0, ToolCall("clock", {"time": 75})),
             CropTask(0, 1, video, 40.0, ToolCall("clock", {"time": 125})),
             CropTask(0, 2, video, 40.0, ToolCall("crop_video", {"start_time": 1, "end_time": 5})),
             CropTask(0, 3, video, 40.0, ToolCall("zoom", {}))]
    with CropDispatcher(DispatchConfig(), tools=(CropVideo(), Clock())) as dispatcher:
        results = dispatcher.run(tasks)
    assert results[0].error == "invalid arguments: time 75 is outside the video (0 to 40 s)"
    tasks[0] = CropTask(0, 0, video, 40.0, ToolCall("clock", {"time": "0:35"}))
    with CropDispatcher(DispatchConfig(), tools=(CropVideo(), Clock())) as dispatcher:
        results = dispatcher.run(tasks)
    assert results[0].ok and results[0].text == "0:35" and results[0].clip is None
    assert "outside the video" in results[1].error
    assert results[2].ok and len(results[2].clip.frames) == 4 and results[2].text is None
    assert results[3].error == "invalid arguments: unknown tool 'zoom'; the tools are crop_video, clock"
    assert dispatcher.counters == {"calls": 4, "errors": 2, "timeouts": 0}


@pytest.mark.parametrize("mode", ["subagent", "frames"])
def test_a_second_tool_runs_beside_the_crop_in_one_round(video, mode):
    tokenizer = train_tokenizer([call_block("crop_video", video_path="v.mp4", start_time=1, end_time=5),
                                 call_block("clock", time=12), "<think>done</think> <answer>blue</answer>"] * 20)
    turn = "<think>two tools</think>\n" + call_block("crop_video", video_path="/etc/passwd", start_time=9,
                                                     end_time=15) + "\n" + call_block("clock", time=12)
    scripts = [[turn, "<think>done</think>\n<answer>blue</answer>"]]
    sampler = ScriptedSampler(tokenizer, scripts)
    episode = Episode("e0", "What colour?", "blue", "oe", video, nframes=4)
    with CropDispatcher(DispatchConfig(), tools=(CropVideo(), Clock())) as dispatcher:
        (rollout,), skipped = run_rollouts(sampler, tokenizer, [episode], 1, RolloutConfig(mode=mode, max_turns=2),
                                           dispatcher)
    assert skipped == [] and rollout.calls_per_turn == (2,) and rollout.errors == ()
    prompt = tokenizer.decode(rollout.inputs.input_ids[:rollout.prompt_length])
    assert '"name": "crop_video"' in prompt and '"name": "clock"' in prompt  # both schemas listed
    assert "<tool_response>\n0:12\n</tool_response>" in rollout.completion
    assert [record.response for record in rollout.calls][1] == "0:12"
    if mode == "subagent":  # only the crop goes to a sub-agent
        assert [c.rows for c in sampler.calls if c.kind == "subagent"] == [1] and len(rollout.subagents) == 1
    else:
        assert rollout.completion.count("frames from 9.0 s to 15.0 s") == 1
