"""The crop_video tool: Hermes-style call parsing (with the `<tool_code>` Python fallback) and
argument validation.

Parsing reproduces the reference parser's output whenever every block is well-formed. By
default, unlike it, one malformed block does not discard the valid ones: it becomes an entry of
`.errors` (which the dispatcher reports back to the model); `all_or_nothing=True` is the
reference's reading, where one malformed `<tool_call>` block discards every `<tool_call>` call of
the turn (the `<tool_code>` fallback is then read, as the reference's parser does). Python calls are read with
`ast` and `ast.literal_eval` only; nothing the model writes is ever executed, and the
`video_path` argument is never opened (the episode's own video is always used).
"""
from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
from typing import Any

from paravt_jax.text.chat import CROP_VIDEO_TOOL

TOOL_NAME = "crop_video"
POSITIONAL_ARGUMENTS = {"crop_video": ("video_path", "start_time", "end_time")}
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
_TOOL_CODE = re.compile(r"<tool_code>(.*?)</tool_code>|<tool_code>(.*)", re.DOTALL)

__all__ = ["CROP_VIDEO_TOOL", "ToolCall", "ParsedCalls", "CropRequest", "parse_tool_calls",
           "parse_time", "validate_crop", "crop_window", "quote", "cap_errors"]

QUOTE_CHARS = 60  # model-written text quoted back in an error response is cut to this length
# Python refuses int<->str conversions above 4300 digits (sys.int_info.str_digits_check_threshold):
# the model can write such a number, so it must be read (and quoted) without that conversion.
MAX_NUMBER_DIGITS = 400


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """repr(value) cut to `limit` characters, safe for any value the model can write (an
    integer too long to print becomes its digit count, never a ValueError)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * MAX_NUMBER_DIGITS:
        return f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        text = f"<an unprintable {type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _read_int(text: str) -> int | float:
    """JSON integers: exact up to MAX_NUMBER_DIGITS digits, beyond that a float (inf), so a
    number of any length parses (the time check then rejects it)."""
    return int(text) if len(text) <= MAX_NUMBER_DIGITS else float(text)


def _loads(text: str):
    """json.loads that raises only ValueError for anything the model can write (deep nesting
    included)."""
    try:
        return json.loads(text, parse_int=_read_int)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def cap_errors(messages: list[str], limit: int) -> list[str]:
    """At most `limit` error messages: the first limit-1 and one line counting the rest (a turn
    with thousands of bad calls must not add thousands of tool responses to the context)."""
    if limit <= 0 or len(messages) <= limit:
        return list(messages)
    omitted = len(messages) - (limit - 1)
    return list(messages[:limit - 1]) + [f"{omitted} more errors in this turn were not reported "
                                         f"(at most {limit} error responses per turn)"]


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclasses.dataclass(frozen=True)
class ParsedCalls:
    calls: list[ToolCall]
    errors: list[str]  # one message per malformed block / line


def _json_block(body: str, index: int) -> tuple[ToolCall | None, str | None]:
    try:
        obj = _loads(body)
    except ValueError as e:
        return None, f"<tool_call> block {index + 1}: not valid JSON ({quote(getattr(e, 'msg', str(e)))[1:-1]})"
    if not isinstance(obj, dict) or "name" not in obj or "arguments" not in obj:
        return None, f'<tool_call> block {index + 1}: expected {{"name": ..., "arguments": {{...}}}}'
    arguments = obj["arguments"]
    if isinstance(arguments, str):  # some models JSON-encode the arguments twice
        try:
            arguments = _loads(arguments)
        except ValueError:
            pass
    if not isinstance(arguments, dict):
        return None, f"<tool_call> block {index + 1}: arguments must be a JSON object"
    return ToolCall(str(obj["name"]), arguments), None


def _strip_stray_quotes(line: str) -> str:
    line = re.sub(r"\)\s*['\"].*$", ")", line)
    return re.sub(r"(['\"])(\s*\))", r"\2", line)


# What ast.literal_eval can raise on a model-written expression.
_LITERAL_ERRORS = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError)


def _parse_expression(line: str) -> ast.Expression | None:
    """`line` as a Python expression, or else without the stray quotes after its call; None
    when neither parses."""
    try:
        return ast.parse(line, mode="eval")
    except SyntaxError:
        cleaned = _strip_stray_quotes(line)
    if cleaned == line:
        return None
    try:
        return ast.parse(cleaned, mode="eval")
    except SyntaxError:
        return None


def _callee_name(call: ast.Call) -> str | None:
    """`name` of `name(...)` and of `module.name(...)`; None for any other callee."""
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _literal_arguments(call: ast.Call, name: str) -> dict[str, Any]:
    """The call's literal keyword arguments; when it has none, its literal positional
    arguments under the tool's parameter names. Non-literal values are left out."""
    arguments: dict[str, Any] = {}
    for keyword in call.keywords:
        if keyword.arg is None:
            continue
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except _LITERAL_ERRORS:
            pass
    if arguments:
        return arguments
    for parameter, arg in zip(POSITIONAL_ARGUMENTS.get(name, ()), call.args):
        try:
            arguments[parameter] = ast.literal_eval(arg)
        except _LITERAL_ERRORS:
            pass
    return arguments


def _python_line(line: str) -> tuple[ToolCall | None, str | None]:
    """One `name(...)` (or `print(name(...))`) line -> a call (literal evaluation only)."""
    tree = _parse_expression(line)
    if tree is None:
        return None, f"<tool_code> line {quote(line)}: not a Python call"
    call = tree.body
    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print"
            and call.args and isinstance(call.args[0], ast.Call)):
        call = call.args[0]
    if not isinstance(call, ast.Call):
        return None, None  # a non-call line (comment, text) is not an error
    name = _callee_name(call)
    if name is None:
        return None, f"<tool_code> line {quote(line)}: unsupported callee"
    arguments = _literal_arguments(call, name)
    if not arguments:
        return None, f"<tool_code> line {quote(line)}: no literal arguments"
    return ToolCall(name, arguments), None


def parse_tool_calls(text: str, all_or_nothing: bool = False) -> ParsedCalls:
    """All tool calls of one assistant turn, in order.

    `<tool_call>{json}</tool_call>` blocks first (an unclosed last block runs to the end);
    if none of them is valid (all_or_nothing: if any of them is not), the `<tool_code>` Python
    fallback (one call per line). The errors name every malformed block either way.
    """
    errors: list[str] = []
    if "<tool_call>" in text:
        calls = []
        for i, match in enumerate(_TOOL_CALL.findall(text)):
            call, error = _json_block(match[0] if match[0] else match[1], i)
            if call is not None:
                calls.append(call)
            if error:
                errors.append(error)
        if calls and not (all_or_nothing and errors):
            return ParsedCalls(calls, errors)
    if "<tool_code>" in text:
        calls = []
        for match in _TOOL_CODE.findall(text):
            for line in (match[0] if match[0] else match[1]).strip().split("\n"):
                line = line.strip()
                if not line:
                    continue
                try:
                    call, error = _python_line(line)
                except (RecursionError, MemoryError, ValueError) as e:
                    call, error = None, f"<tool_code> line {quote(line)}: {type(e).__name__}"
                if call is not None:
                    calls.append(call)
                if error:
                    errors.append(error)
        return ParsedCalls(calls, errors)
    return ParsedCalls([], errors)


# ----------------------------------------------------------------------------- validation
@dataclasses.dataclass(frozen=True)
class CropRequest:
    start: float
    end: float  # clamped to the video duration


def parse_time(value: Any) -> float:
    """Seconds from a number, a numeric string, "MM:SS" or "HH:MM:SS"."""
    if isinstance(value, bool):
        raise ValueError(f"time {quote(value)} is a boolean")
    if isinstance(value, int):
        seconds = float(value) if value.bit_length() <= 1023 else math.inf  # float() overflows
    elif isinstance(value, float):
        seconds = value
    elif isinstance(value, str):
        text = value.strip().rstrip("s").strip()
        parts = text.split(":")
        if len(parts) > 3 or (len(parts) > 1 and not all(p.strip() for p in parts)):
            raise ValueError(f"time {quote(value)} is not MM:SS or HH:MM:SS")
        seconds = 0.0
        for part in parts:
            try:
                seconds = seconds * 60 + float(part)
            except ValueError:  # float()'s own message would echo the whole string
                raise ValueError(f"time {quote(value)} is not a number or a time string") from None
    else:
        raise ValueError(f"time {quote(value)} is not a number or a time string")
    if not math.isfinite(seconds):
        raise ValueError(f"time {quote(value)} is not finite")
    return seconds


def validate_crop(call: ToolCall, duration: float) -> CropRequest:
    """Checks one call against the episode's video; raises ValueError with the reason."""
    if call.name != TOOL_NAME:
        raise ValueError(f"unknown tool {quote(call.name)}; the only tool is {TOOL_NAME}")
    return crop_window(call.arguments, duration)


def crop_window(args: dict, duration: float) -> CropRequest:
    """A crop's window from its arguments (start_time or start, end_time or end), checked
    against a video of `duration` seconds and clamped to it; raises ValueError with the reason."""
    raw_start = args.get("start_time", args.get("start"))
    raw_end = args.get("end_time", args.get("end"))
    if raw_start is None:
        raise ValueError("start_time (or start) is required")
    if raw_end is None:
        raise ValueError("end_time (or end) is required")
    start, end = parse_time(raw_start), parse_time(raw_end)
    if start >= end:
        raise ValueError(f"start_time {start:g} must be less than end_time {end:g}")
    if start >= duration:
        raise ValueError(f"start_time ({start:.1f}s) exceeds video duration ({duration:.1f}s)")
    return CropRequest(start=max(0.0, start), end=min(end, duration))


# ----------------------------------------------------------------------------- evaluation reading
DEFAULT_WINDOW_S = 10.0  # the evaluation driver's window length when end_time is missing


def lenient_time(value: Any) -> float:
    """The evaluation driver's reading of a time: a number, a numeric string, MM:SS or
    HH:MM:SS; anything else (and a non-finite value) is 0.0 instead of an error."""
    try:
        seconds = parse_time(value)
    except ValueError:
        return 0.0
    return seconds


def lenient_window(call: ToolCall) -> tuple[float, float]:
    """(start, end) as the evaluation driver reads a call, whatever its name: start_time (or
    start, default 0), end_time (or end, default start + 10 s), each by `lenient_time`."""
    args = call.arguments
    start = lenient_time(args.get("start_time", args.get("start", 0)))
    end = args.get("end_time", args.get("end"))
    return start, start + DEFAULT_WINDOW_S if end is None else lenient_time(end)
