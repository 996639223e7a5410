"""Anything a model can write in a turn goes through parse -> validate -> dispatch -> rollout
as error tool responses, never as an exception."""
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paravt_jax.agent.dispatch import CropDispatcher, CropTask, DispatchConfig
from paravt_jax.agent.protocol import PromptFormat
from paravt_jax.agent.rollout import Episode, RolloutConfig, run_rollouts
from paravt_jax.agent.tools import QUOTE_CHARS, cap_errors, parse_tool_calls, quote, validate_crop
from paravt_jax.data.synthetic import Event, write_video
from paravt_jax.text.tokenizer import train_tokenizer
from unit.test_agent_rollout import CORPUS, ScriptedSampler

DURATION = 20.0
ERROR_CHARS = 400  # no error message may echo more than a capped quote


def call_json(arguments, name="crop_video") -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


HOSTILE = {
    "309-digit start_time": '<tool_call>{"name": "crop_video", "arguments": {"start_time": ' + "9" * 309
                            + ', "end_time": 5}}</tool_call>',
    "309-digit start_time in tool_code": ("<tool_code>crop_video('v.mp4', " + "9" * 309
                                           + ", 5)</tool_code>"),
    "5000-digit start_time": '<tool_call>{"name": "crop_video", "arguments": {"start_time": ' + "9" * 5000
                             + ', "end_time": 5}}</tool_call>',
    "5000-digit start_time in tool_code": ("<tool_code>crop_video(start_time=" + "9" * 5000
                                            + ", end_time=5)</tool_code>"),
    "negative 400-digit end_time": call_json({"start_time": 1, "end_time": -int("9" * 400)}),
    "double-encoded deep nesting": '<tool_call>{"name": "crop_video", "arguments": '
                                   + json.dumps("[" * 100_000 + "]" * 100_000) + "}</tool_call>",
    "double-encoded nested object": '<tool_call>{"name": "crop_video", "arguments": '
                                    + json.dumps('{"start_time": ' + "[" * 50_000 + "]" * 50_000 + "}")
                                    + "}</tool_call>",
    "deep nesting": "<tool_call>" + "[" * 100_000 + "</tool_call>",
    "deep nesting in tool_code": ("<tool_code>crop_video(start_time=" + "[" * 100_000
                                  + ")</tool_code>"),
    "1 MB string": call_json({"start_time": "x" * 1_000_000, "end_time": 5}),
    "1 MB tool name": call_json({"start_time": 1, "end_time": 5}, name="n" * 1_000_000),
    "1 MB tool_code line": "<tool_code>" + "y" * 1_000_000 + "(</tool_code>",
    "non-string name": ('<tool_call>{"name": ' + "7" * 5000
                        + ', "arguments": {"start_time": 1, "end_time": 2}}</tool_call>'),
    "list name": '<tool_call>{"name": [[[1]]], "arguments": {"start_time": 1, "end_time": 2}}</tool_call>',
    "NaN and Infinity": ('<tool_call>{"name": "crop_video", "arguments": {"start_time": NaN, '
                         '"end_time": Infinity}}</tool_call>'),
    "1e999": call_json({"start_time": "1e999", "end_time": "2e999"}),
    "object times": call_json({"start_time": {"a": [1, 2]}, "end_time": [3]}),
    "huge MM:SS": call_json({"start_time": "9" * 400 + ":00", "end_time": "1:" + "9" * 5000}),
    "boolean times": call_json({"start_time": True, "end_time": False}),
    "start in the last frame interval": call_json({"start_time": DURATION - 0.2, "end_time": DURATION}),
}


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("hostile") / "episode.mp4")
    return write_video(path, DURATION, [Event(2.0, 4.0, "red", "square")], fps=4.0, height=64, width=96, seed=0)


@pytest.fixture(scope="module")
def dispatcher():
    with CropDispatcher(DispatchConfig(max_workers=2, max_frames=2, max_pixels=64 * 96)) as d:
        yield d


def through_dispatch(text: str, video: str, dispatcher: CropDispatcher) -> list[str]:
    """Every message the turn would produce: parse errors, then each call's result."""
    parsed = parse_tool_calls(text)
    for call in parsed.calls:  # validation raises ValueError and nothing else
        try:
            validate_crop(call, DURATION)
        except ValueError:
            pass
    results = dispatcher.run([CropTask(0, k, video, DURATION, call) for k, call in enumerate(parsed.calls)])
    return list(parsed.errors) + [r.error for r in results if not r.ok]


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_calls_become_short_error_responses(name, video, dispatcher):
    errors = through_dispatch(HOSTILE[name], video, dispatcher)
    if name == "start in the last frame interval":  # a valid call: one frame from the final interval
        assert errors == []
    else:
        assert errors, name
    assert all(len(e) <= ERROR_CHARS for e in errors), [len(e) for e in errors]


TAGS = st.sampled_from(["<tool_call>", "</tool_call>", "<tool_code>", "</tool_code>", '{"name": "crop_video", ',
                        '"arguments": {', '"start_time": ', '"end_time": ', "crop_video(", ")", "}", "{", "[", "]",
                        '"', "'", ",", ":", "\n", "9" * 400, "1e999", "NaN", "-", "0.5", "12:30", "\\"])
MODEL_TEXT = st.lists(st.one_of(TAGS, st.text(max_size=12)), max_size=40).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=MODEL_TEXT)
def test_any_model_text_goes_through_without_an_exception(text, video, dispatcher):
    for error in through_dispatch(text, video, dispatcher):
        assert isinstance(error, str) and len(error) <= ERROR_CHARS


@settings(max_examples=200, deadline=None)
@given(value=st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                       max_size=3)))
def test_any_json_arguments_validate_or_raise_value_error(value, video, dispatcher):
    text = call_json({"start_time": value, "end_time": value}) + call_json(value)
    for error in through_dispatch(text, video, dispatcher):
        assert len(error) <= ERROR_CHARS


def test_quote_caps_and_handles_unprintable_integers():
    assert quote("x" * 10_000).startswith("'xxx") and len(quote("x" * 10_000)) < QUOTE_CHARS + 30
    assert quote(10 ** 5000) == "<an integer of about 5000 digits>"
    assert quote(12) == "12" and quote("ok") == "'ok'"


def test_cap_errors_keeps_the_first_and_counts_the_rest():
    assert cap_errors(["a", "b"], 3) == ["a", "b"]
    capped = cap_errors([str(i) for i in range(10_000)], 4)
    assert capped[:3] == ["0", "1", "2"] and len(capped) == 4
    assert capped[3].startswith("9997 more errors") and cap_errors(["a"] * 5, 0) == ["a"] * 5


@pytest.mark.parametrize("mode", ["subagent", "frames"])
def test_a_rollout_survives_every_hostile_turn(mode, video):
    tokenizer = train_tokenizer(CORPUS)
    flood = "".join(call_json({"start_time": 1, "end_time": 2}) for _ in range(2_000))
    # (the 1 MB cases cost a minute of tokenising here; their error text is checked above)
    texts = [text for name, text in sorted(HOSTILE.items()) if "1 MB" not in name] + [flood]
    scripts = [[text, "<answer>done</answer>"] for text in texts]
    sampler = ScriptedSampler(tokenizer, scripts)
    episode = Episode("e0", "What colour?", "red", "oe", video, nframes=2)
    # a budget the 2,000-call flood fits in (the scripted sampler cuts a turn at its budget)
    config = RolloutConfig(mode=mode, max_turns=1, max_new_tokens=200_000,
                           prompt=PromptFormat(overview_max_pixels=64 * 96))
    with CropDispatcher(DispatchConfig(max_workers=2, max_frames=2, max_pixels=64 * 96)) as dispatcher:
        rollouts, skipped = run_rollouts(sampler, tokenizer, [episode], len(texts), config, dispatcher)
    assert skipped == [] and len(rollouts) == len(texts)
    flooded = rollouts[-1]
    limit = DispatchConfig().max_error_responses
    responses = flooded.completion.count("<tool_response>")
    assert responses == DispatchConfig().max_parallel + limit  # 5 crops + 10 error responses, not 1,995
    assert "1986 more errors in this turn were not reported" in flooded.completion
    assert len(flooded.errors) == 2_000 - DispatchConfig().max_parallel  # all counted
    for rollout in rollouts[:-1]:
        responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", rollout.completion, re.DOTALL)
        assert responses and all(len(r) <= ERROR_CHARS + len("Error: ") for r in responses if r.startswith("Error")), \
            [len(r) for r in responses]
