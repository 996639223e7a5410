import json
import os

import pytest

from paravt_jax.agent.tools import ToolCall, parse_time, parse_tool_calls, validate_crop


def call(name="crop_video", **arguments):
    return ToolCall(name, arguments)


def block(start, end, path="v.mp4"):
    return "<tool_call>\n" + json.dumps({"name": "crop_video", "arguments": {
        "video_path": path, "start_time": start, "end_time": end}}) + "\n</tool_call>"


def test_parallel_json_blocks_in_order():
    text = "<think>two windows</think>\n" + block(10, 20) + "\n" + block(30.5, 41)
    parsed = parse_tool_calls(text)
    assert parsed.errors == []
    assert [c.arguments["start_time"] for c in parsed.calls] == [10, 30.5]
    assert all(c.name == "crop_video" for c in parsed.calls)


def test_unclosed_last_block_runs_to_the_end():
    text = block(1, 2) + '<tool_call>{"name": "crop_video", "arguments": {"start_time": 3, "end_time": 4}}'
    parsed = parse_tool_calls(text)
    assert [c.arguments["start_time"] for c in parsed.calls] == [1, 3]


def test_one_malformed_block_keeps_the_valid_ones():
    text = block(1, 2) + "<tool_call>{not json}</tool_call>" + block(5, 6) + \
        '<tool_call>{"arguments": {}}</tool_call>'
    parsed = parse_tool_calls(text)
    assert [c.arguments["start_time"] for c in parsed.calls] == [1, 5]
    assert len(parsed.errors) == 2 and "block 2" in parsed.errors[0] and "block 4" in parsed.errors[1]


def test_tool_code_fallback_forms():
    text = ("<tool_code>\ncrop_video(video_path='a.mp4', start_time=1, end_time=2)\n"
            "print(crop_video('a.mp4', 3, 4))\n"
            "tools.crop_video(video_path='a.mp4', start_time=5, end_time=6')\n"
            "</tool_code>")
    parsed = parse_tool_calls(text)
    assert [c.arguments for c in parsed.calls] == [
        {"video_path": "a.mp4", "start_time": 1, "end_time": 2},
        {"video_path": "a.mp4", "start_time": 3, "end_time": 4},
        {"video_path": "a.mp4", "start_time": 5, "end_time": 6}]


def test_tool_code_used_only_when_no_valid_json_block():
    text = "<tool_call>{bad</tool_call><tool_code>crop_video(start_time=1, end_time=2)</tool_code>"
    parsed = parse_tool_calls(text)
    assert parsed.calls == [ToolCall("crop_video", {"start_time": 1, "end_time": 2})]
    assert len(parsed.errors) == 1
    both = block(7, 8) + "<tool_code>crop_video(start_time=1, end_time=2)</tool_code>"
    assert [c.arguments["start_time"] for c in parse_tool_calls(both).calls] == [7]


def test_literal_evaluation_only(tmp_path):
    marker = tmp_path / "pwned"
    text = (f"<tool_code>crop_video(video_path=__import__('os').system('touch {marker}'), "
            "start_time=1, end_time=2)\n"
            f"crop_video(open('{marker}', 'w'), 3, 4)</tool_code>")
    parsed = parse_tool_calls(text)
    assert not marker.exists()
    assert parsed.calls[0].arguments == {"start_time": 1, "end_time": 2}
    # positional non-literals are dropped, literals kept at their positions
    assert parsed.calls[1].arguments == {"start_time": 3, "end_time": 4}


def test_no_calls_and_garbage_never_raise():
    assert parse_tool_calls("just an answer").calls == []
    for junk in ["<tool_call>", "<tool_code>", "<tool_call>[]</tool_call>", "<tool_code>((((</tool_code>",
                 "<tool_call>" + "[" * 5000 + "</tool_call>", "<tool_code>" + "(" * 5000 + "</tool_code>"]:
        parse_tool_calls(junk)


@pytest.mark.parametrize("value,seconds", [(12, 12.0), (12.5, 12.5), ("12.5", 12.5), (" 7 ", 7.0),
                                           ("01:30", 90.0), ("1:02:03", 3723.0), ("45s", 45.0)])
def test_parse_time(value, seconds):
    assert parse_time(value) == seconds


@pytest.mark.parametrize("value", ["abc", "1:2:3:4", None, True, float("nan"), [1], "1::2"])
def test_parse_time_rejects(value):
    with pytest.raises(ValueError):
        parse_time(value)


def test_validate_crop_rules():
    assert validate_crop(call(start_time=10, end_time=20), 60).end == 20
    assert validate_crop(call(start="00:10", end="00:50"), 60).start == 10
    assert validate_crop(call(start_time=50, end_time=90), 60).end == 60  # end clamped
    with pytest.raises(ValueError, match="start_time \\(or start\\) is required"):
        validate_crop(call(end_time=5), 60)
    with pytest.raises(ValueError, match="end_time \\(or end\\) is required"):
        validate_crop(call(start_time=5), 60)
    with pytest.raises(ValueError, match="must be less than"):
        validate_crop(call(start_time=20, end_time=10), 60)
    with pytest.raises(ValueError, match="exceeds video duration"):
        validate_crop(call(start_time=61, end_time=70), 60)
    with pytest.raises(ValueError, match="unknown tool 'rm'"):
        validate_crop(call("rm", start_time=1, end_time=2), 60)
    # a model-written path is irrelevant to validation
    assert validate_crop(call(video_path="/etc/passwd", start_time=1, end_time=2), 60).start == 1
    assert os.path.exists("/etc/passwd")
