"""Sequence-level rewards with the reference's semantics (ParaVT `rl/rewards/*.py`).

    R = R_acc + format_weight * R_fmt + R_tool

* `extract_answer` pulls the final answer out of a completion; `accuracy_reward` scores it
  (`metrics` for mcq / tvg / F1, or an LLM judge).
* `format_reward` scores the think / answer / tool-call discipline, including the selective
  anchor term `anchor_weight * anchor_reward(text)`.
* `tool_reward` scores a parseable tool call, its execution evidence and a correct answer.
* `compose_reward` combines them with the reference's degenerate-completion guard.

Where we differ from the reference on purpose:

* Configuration is passed as arguments; the reference reads ANSWER_SUFFIX, ANCHOR_WEIGHT,
  FORMAT_WEIGHT and REWARD_MODE from the environment (FORMAT_WEIGHT defaulting to 0.5 there;
  the recipes set 1.0).
* Nothing here raises on any `str`: where the reference would crash (a "s, e" pair that is
  not a number in tvg scoring, a JSON body nested deeper than the recursion limit) we score
  0 / treat the body as not parseable. An `answer` that is not a string (e.g. a number read
  from JSON) is converted with `str()`, `None` counts as empty.
* The LLM judge is an explicit object (see `judge.LLMJudge`); the reference builds a global
  OpenAI client from the environment. Any judge failure, and a missing judge, falls back to
  token F1 as in the reference. The question shown to the judge is passed explicitly
  (`question_from_prompt` reproduces how the reference cuts it from the decoded prompt).
* In "token" anchor mode the trainer calls `compose_reward(..., anchor_weight=0)` and adds
  `anchor_reward` separately; `compose_reward` itself is the released (sequence) behaviour.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
from typing import Any

import numpy as np

from paravt_jax.config import checked, non_negative, one_of, validate
from paravt_jax.episodes import judge as J
from paravt_jax.episodes.metrics import f1_score, mcq_accuracy, normalize_text, temporal_iou

__all__ = [
    "extract_answer",
    "normalize_text",
    "has_parseable_tool_call",
    "has_substantive_think",
    "think_before_tool",
    "has_answer_body",
    "tags_balanced",
    "format_reward",
    "anchor_reward",
    "tool_reward",
    "accuracy_reward",
    "compose_reward",
    "question_from_prompt",
    "is_degenerate",
    "REWARD_KEYS",
]

log = logging.getLogger(__name__)

REWARD_KEYS = ("acc_reward", "format_reward", "tool_reward")
REWARD_MODES = ("f1", "exact", "llm")  # accuracy_reward for open-ended answers: token F1, exact match, LLM judge

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

# ---------------------------------------------------------------------------------------
# Tag helpers (reference `rl/rewards/utils.py`)
# ---------------------------------------------------------------------------------------

# First <answer>...</answer> (non-greedy, across lines).
_ANSWER_PAIR = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# Complete blocks removed from the text after </think>, in this order.
_COMPLETE_BLOCKS = (
    re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL),
    re.compile(r"<tool_code>.*?</tool_code>", re.DOTALL),
    re.compile(r"<tool_response>.*?</tool_response>", re.DOTALL),
)
# Tool bodies: up to the closing tag or, for an unclosed last block, to the end of text
# (`$` without MULTILINE also stops just before one final newline, which strip() drops).
_TOOL_CALL_BODY = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_TOOL_CODE_BODY = re.compile(r"<tool_code>(.*?)(?:</tool_code>|$)", re.DOTALL)
# A think block: closed, else open up to the next tool tag / answer / end of turn / end.
_THINK_CLOSED = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_THINK_OPEN = re.compile(r"<think>(.*?)(?:<tool_|<answer>|<\|im_end\|>|$)", re.DOTALL)

_TAG_PAIRS = (
    ("<think>", "</think>"),
    ("<tool_call>", "</tool_call>"),
    ("<tool_code>", "</tool_code>"),
    ("<answer>", "</answer>"),
)

SUBSTANTIVE_THINK_CHARS = 10


def extract_answer(text: str) -> str:
    """The model's final answer, by the reference's priority:

    1. the stripped body of the first `<answer>...</answer>`;
    2. if `</think>` occurs: the text after the first `</think>`, with complete
       tool_call, then tool_code, then tool_response blocks removed, then every
       `<|im_end|>` and then every `<|im_start|>` deleted, stripped (if non-empty);
    3. the last non-blank line of the whole text (stripped) that does not start with
       `<|im_` or `<tool_` (single letters are kept: bare MCQ answers);
    4. "".
    """
    first = _ANSWER_PAIR.search(text)
    if first is not None:
        return first.group(1).strip()

    _, sep, after_think = text.partition("</think>")
    if sep:
        for block in _COMPLETE_BLOCKS:
            after_think = block.sub("", after_think)
        after_think = after_think.replace(IM_END, "").replace(IM_START, "").strip()
        if after_think:
            return after_think

    for raw in reversed(text.splitlines()):
        line = raw.strip()
        if line and not line.startswith(("<|im_", "<tool_")):
            return line
    return ""


def _usable_body(body: str) -> str | None:
    stripped = body.strip()
    if not stripped or stripped.startswith(IM_END):
        return None
    return stripped


def _is_named_json_object(body: str) -> bool:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):  # the reference only survives ValueError
        return False
    return isinstance(value, dict) and "name" in value


def has_parseable_tool_call(text: str) -> bool:
    """True iff some `<tool_call>` body (closed, or an open one running to the end) is a JSON
    object with a "name" key, or some `<tool_code>` body has a line that, stripped, is
    non-empty, contains "(" and does not start with "#". Bodies that are blank or start with
    `<|im_end|>` are skipped. All tool_call bodies are checked before any tool_code body
    (the order does not change the result)."""
    for body in _TOOL_CALL_BODY.findall(text):
        usable = _usable_body(body)
        if usable is not None and _is_named_json_object(usable):
            return True
    for body in _TOOL_CODE_BODY.findall(text):
        usable = _usable_body(body)
        if usable is None:
            continue
        for raw in usable.splitlines():
            line = raw.strip()
            if line and "(" in line and not line.startswith("#"):
                return True
    return False


def has_substantive_think(text: str, min_chars: int = SUBSTANTIVE_THINK_CHARS) -> bool:
    """True iff the think block has at least `min_chars` characters after stripping.

    The block is the first `<think>` that has a later `</think>` (up to that closing tag);
    only when no closed block exists, the first `<think>` up to the next `<tool_`,
    `<answer>`, `<|im_end|>` or the end. A short closed block is NOT rescued by a longer
    open one (reference behaviour)."""
    block = _THINK_CLOSED.search(text) or _THINK_OPEN.search(text)
    if block is None:
        return False
    return len(block.group(1).strip()) >= min_chars


def think_before_tool(text: str) -> bool:
    """True iff `<think>` occurs and its first occurrence precedes the first `<tool_call>` /
    `<tool_code>` (tool_response does not count); False when there is no tool tag."""
    think_at = text.find("<think>")
    if think_at < 0:
        return False
    tool_at = [i for i in (text.find("<tool_call>"), text.find("<tool_code>")) if i >= 0]
    return bool(tool_at) and think_at < min(tool_at)


def has_answer_body(text: str) -> bool:
    """True iff some `<answer>...</answer>` pair encloses non-whitespace content (the gate
    against harvesting format reward with empty answer tags)."""
    return any(body.strip() for body in _ANSWER_PAIR.findall(text))


def tags_balanced(text: str) -> bool:
    """Every pair think / tool_call / tool_code / answer has as many openings as closings."""
    return all(text.count(open_tag) == text.count(close_tag) for open_tag, close_tag in _TAG_PAIRS)


# ---------------------------------------------------------------------------------------
# Format, anchor and tool rewards (reference `format.py`, `tool.py`)
# ---------------------------------------------------------------------------------------


def anchor_reward(text: str) -> float:
    """R_anchor, unweighted (reference: the `anchor_bonus` inside the format reward):
    +0.4 if `</think>` occurs and the think is substantive; +0.3 more if additionally there is
    an answer body and `</answer>` occurs; -0.3 if `<think>` occurs but `</think>` never does.
    Values: 0.0, 0.4, 0.7 (0.4 + 0.3 in floating point) or -0.3."""
    bonus = 0.0
    closed_think = "</think>" in text and has_substantive_think(text)
    if closed_think:
        bonus += 0.4
    if closed_think and has_answer_body(text) and "</answer>" in text:
        bonus += 0.3
    if "<think>" in text and "</think>" not in text:
        bonus -= 0.3
    return bonus


def format_reward(text: str, *, answer_suffix: bool, anchor_weight: float, tools_offered: bool = True) -> float:
    """R_fmt (reference `compute_format_reward`), clipped above at 1.0; it can be negative.

    Terms are added in the reference's order (so the float results match bit for bit):
      answer_suffix on:  +0.2 substantive think; with an answer body: +0.3 if `<answer>`
                         occurs, +0.2 if `</answer>` occurs.
      answer_suffix off: +0.3 / +0.2 / +0.1 instead.
      if anchor_weight > 0: + anchor_weight * anchor_reward(text).
      +0.3 if substantive think, a parseable tool call and think-before-tool (only where the
                 prompt offered tools: `tools_offered`; the reference's prompts always do).
      +0.1 if the score so far is > 0 and all tag pairs are balanced.
    """
    think = has_substantive_think(text)
    answer = has_answer_body(text)
    think_w, open_w, close_w = (0.2, 0.3, 0.2) if answer_suffix else (0.3, 0.2, 0.1)

    score = 0.0
    if think:
        score += think_w
    if answer:
        if "<answer>" in text:
            score += open_w
        if "</answer>" in text:
            score += close_w
    if anchor_weight > 0:
        score += anchor_weight * anchor_reward(text)
    if tools_offered and think and has_parseable_tool_call(text) and think_before_tool(text):
        score += 0.3
    if score > 0 and tags_balanced(text):
        score += 0.1
    return min(score, 1.0)


def tool_reward(text: str, acc_reward: float) -> float:
    """R_tool (reference `compute_tool_reward`): 0 without a parseable tool call; else 0.1,
    raised to 0.3 when `<tool_response>` occurs in the text, +0.5 when acc_reward > 0,
    clipped at 1.0. (In the released workflow the scored text is the policy-generated
    tokens only, which never include the tool responses.)"""
    if not has_parseable_tool_call(text):
        return 0.0
    reward = 0.3 if "<tool_response>" in text else 0.1
    if acc_reward > 0:
        reward += 0.5
    return min(reward, 1.0)


# ---------------------------------------------------------------------------------------
# Accuracy and composition (reference `compose.py`)
# ---------------------------------------------------------------------------------------


def question_from_prompt(prompt: str) -> str:
    """The question the reference shows the LLM judge: the decoded prompt after the last
    `<|vision_end|>`, up to the next `<|im_end|>`, stripped; "" without any vision item."""
    if "<|vision_end|>" not in prompt:
        return ""
    return prompt.rsplit("<|vision_end|>", 1)[1].split(IM_END, 1)[0].strip()


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def _judge_score(judge: Any, question: str, prediction: str, answer: str) -> float:
    score_fn = getattr(judge, "score", judge)
    value = float(score_fn(question, prediction, answer))
    if not math.isfinite(value):
        raise ValueError(f"judge returned a non-finite score {value!r}")
    return min(max(value, 0.0), 1.0)


def accuracy_reward(
    prediction: str,
    answer: Any,
    question_type: str | None,
    *,
    mode: str = "f1",
    judge: Any = None,
    question: str = "",
) -> float:
    """R_acc (reference `_compute_acc_reward`), in this order:

    0 if the prediction or the answer is empty; 1 if their normalised forms are equal;
    `mcq` -> `mcq_accuracy`; `tvg` -> `temporal_iou`; otherwise by `mode`:
    "exact" -> 0, "llm" -> `judge.score(question, prediction, answer)` (clamped to [0, 1]),
    anything else -> `f1_score`. With mode "llm", a missing judge or ANY judge failure
    (exception, non-numeric or non-finite score) falls back to `f1_score`.
    `question_type` None means "oe" (the reference's default).
    """
    prediction = _as_text(prediction)
    answer = _as_text(answer)
    if not prediction or not answer:
        return 0.0
    if normalize_text(prediction) == normalize_text(answer):
        return 1.0
    if question_type == "mcq":
        return mcq_accuracy(prediction, answer)
    if question_type == "tvg":
        return temporal_iou(prediction, answer)
    if mode == "exact":
        return 0.0
    if mode == "llm":
        if judge is None:
            log.warning("reward mode 'llm' without a judge; using token F1")
            return f1_score(prediction, answer)
        try:
            return _judge_score(judge, question, prediction, answer)
        except Exception as exc:  # noqa: BLE001 - a flaky judge must never stop training
            log.warning("LLM judge failed (%s: %s); falling back to token F1",
                        type(exc).__name__, exc)
            return f1_score(prediction, answer)
    return f1_score(prediction, answer)


def is_degenerate(text: str) -> bool:
    """The reference's guard: >= 5 `<|im_start|>` in fewer than 300 characters."""
    return text.count(IM_START) >= 5 and len(text) < 300


def compose_reward(
    completion: str,
    answer: Any,
    question_type: str | None,
    *,
    answer_suffix: bool,
    anchor_weight: float,
    format_weight: float,
    mode: str = "f1",
    judge: Any = None,
    question: str = "",
    format_text: str | None = None,
    tools_offered: bool = True,
) -> tuple[float, dict[str, float]]:
    """Total reward and its parts (reference `compose_reward`, released sequence semantics).

    Degenerate completions (`is_degenerate`) score 0 on everything. Otherwise:
    acc = accuracy_reward(extract_answer(completion), answer, ...) -- the EXTRACTED answer;
    fmt = format_reward(format_text, ...) and tool = tool_reward(completion, acc);
    total = acc + format_weight * fmt + tool. `format_text` defaults to the completion (the
    released code); the trainer passes the assistant turns with their forced prefixes, so that
    a `<think>` forced by the prompt counts as the model's context shows it. Where the prompt
    offered no tools (`tools_offered` False, rl.tool_free_share's prompts) a call earns nothing:
    tool = 0 and the format reward's tool term is left out.
    Returns (total, {"acc_reward": acc, "format_reward": fmt, "tool_reward": tool}).
    """
    completion = _as_text(completion)
    if is_degenerate(completion):
        return 0.0, dict.fromkeys(REWARD_KEYS, 0.0)
    acc = accuracy_reward(extract_answer(completion), answer, question_type,
                          mode=mode, judge=judge, question=question)
    format_text = completion if format_text is None else _as_text(format_text)
    fmt = format_reward(format_text, answer_suffix=answer_suffix, anchor_weight=anchor_weight,
                        tools_offered=tools_offered)
    tool = tool_reward(completion, acc) if tools_offered else 0.0
    total = acc + format_weight * fmt + tool
    return total, {"acc_reward": acc, "format_reward": fmt, "tool_reward": tool}


# ---------------------------------------------------------------------------- the run's scoring
REWARD_TEXTS = ("turns", "released", "completion")


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """The sequence reward; its anchor weight is the advantage's (`AdvantageConfig.anchor_weight`).

    text: what the rewards read.
      turns      accuracy and tool rewards read the generated tokens; the format and anchor
                 rewards read every assistant turn as the model's context shows it (its forced
                 prefix, e.g. `<think>\n`, then its generated tokens; tool responses excluded);
      released   every reward reads the generated tokens only, as the released workflow does
                 (under think_prefix the forced `<think>` is then invisible and the format and
                 anchor rewards of a well-formed turn are 0);
      completion every reward reads everything after the prompt, tool responses included."""
    answer_suffix: bool = True
    format_weight: float = checked(1.0, non_negative())
    # f1 | exact | llm (the judge from the environment, F1 when a call fails)
    mode: str = checked("f1", one_of(REWARD_MODES))
    text: str = checked("turns", one_of(REWARD_TEXTS))
    # mode "llm": the NAME of the environment variable holding the judge's API key (never
    # the key); the endpoint and model come from PARAVT_JUDGE_BASE_URL / PARAVT_JUDGE_MODEL.
    judge_api_key_env: str = J.ENV_API_KEY

    def __post_init__(self):
        validate(self)


def make_judge(config: RewardConfig, environ=None) -> J.LLMJudge | None:
    """The LLM judge of reward mode "llm" (None for the other modes), built from the
    environment. Raises ValueError naming the missing or bad variable: a run that asked for a
    judge must not silently score F1."""
    if config.mode != "llm":
        return None
    env = os.environ if environ is None else environ
    base_url = env.get(J.ENV_BASE_URL) or J.DEFAULT_BASE_URL
    key = env.get(config.judge_api_key_env) or None
    if key is None and not J.is_loopback_url(base_url):
        raise ValueError(f"reward mode 'llm': the judge at {base_url} needs an API key, and the environment "
                         f"variable {config.judge_api_key_env} (rl.reward.judge_api_key_env) is not set; "
                         f"set it, or {J.ENV_BASE_URL} to a local server")
    try:
        return J.LLMJudge.from_env(env, api_key=key)
    except ValueError as e:
        raise ValueError(f"reward mode 'llm': cannot build the judge from the environment "
                         f"({J.ENV_BASE_URL}, {J.ENV_MODEL}, {J.ENV_TIMEOUT}): {e}") from None


def reward_texts(rollout, text: str) -> tuple[str, str]:
    """(the text the accuracy and tool rewards read, the text the format and anchor rewards
    read) of one rollout under `RewardConfig.text`."""
    if text == "completion":
        return rollout.completion, rollout.completion
    if text == "released":
        return rollout.generated_text, rollout.generated_text
    return rollout.generated_text, rollout.assistant_text


def score(rollouts, config: RewardConfig, anchor_weight: float, token_anchor: bool,
          judge=None) -> tuple[list[dict], np.ndarray, np.ndarray]:
    """(reward dicts, sequence rewards [N], anchor rewards [N]). With the token anchor, the
    anchor reward goes to its own array instead of the sequence reward."""
    out, seq, anchor = [], [], []
    for r in rollouts:
        text, format_text = reward_texts(r, config.text)
        total, parts = compose_reward(text, r.episode.answer, r.episode.question_type,
                                        answer_suffix=config.answer_suffix,
                                        anchor_weight=0.0 if token_anchor else anchor_weight,
                                        format_weight=config.format_weight, mode=config.mode, judge=judge,
                                        format_text=format_text, tools_offered=r.episode.tools)
        a = anchor_reward(format_text) if token_anchor and not is_degenerate(text) else 0.0
        out.append({"total": total, **parts, "anchor_reward": a})
        seq.append(total)
        anchor.append(a)
    return out, np.asarray(seq, np.float32), np.asarray(anchor, np.float32)
