"""Per-rollout statistics for logging and evaluation; the one definition of a well-formed turn
(`turn_problems`, which the episode log shows per turn) and of format compliance built on it,
the tool-call rate kappa and calls per tool turn."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from paravt_jax.agent.tools import parse_tool_calls
from paravt_jax.episodes import rewards as R


def turn_problems(text: str) -> list[str]:
    """Why one assistant turn (its text as the model saw it, forced prefix included) is not well
    formed; empty: it is. An unclosed think, unbalanced tag pairs (think, tool_call, tool_code,
    answer: a second `</think>` too), malformed call blocks, or neither a call nor an answer."""
    problems = []
    if "<think>" in text and "</think>" not in text:
        problems.append("<think> is never closed")
    if not R.tags_balanced(text):
        problems.append("unbalanced tags")
    parsed = parse_tool_calls(text)
    problems += parsed.errors
    if not parsed.calls and not R.has_answer_body(text):
        problems.append("neither a tool call nor an answer")
    return problems


def format_compliant(turns: str | Sequence[str]) -> bool:
    """An episode's turns (or one text) are format compliant when every turn is well formed
    (`turn_problems`), a think is closed and an answer has a body."""
    turns = [turns] if isinstance(turns, str) else list(turns)
    text = "".join(turns)
    return ("</think>" in text and R.has_answer_body(text)
            and not any(turn_problems(turn) for turn in turns))


def calls_per_tool_turn(calls_per_turn: Sequence[Sequence[int]]) -> float:
    """Mean number of calls over the turns that made at least one (0 when none did), given each
    episode's calls per turn."""
    tool_turns = [c for turns in calls_per_turn for c in turns if c > 0]
    return float(np.mean(tool_turns)) if tool_turns else 0.0


def tool_use(episodes: Sequence[str | Sequence[str]], calls_per_turn: Sequence[Sequence[int]]) -> dict[str, float]:
    """format_compliance (share of format-compliant episodes), kappa (share with a parseable
    tool call) and calls_per_tool_turn over a set of episodes, each its turn texts (or one
    text); 0 for an empty set."""
    n = max(len(episodes), 1)
    texts = [e if isinstance(e, str) else "".join(e) for e in episodes]
    return {
        "format_compliance": sum(format_compliant(e) for e in episodes) / n,
        "kappa": sum(R.has_parseable_tool_call(t) for t in texts) / n,
        "calls_per_tool_turn": calls_per_tool_turn(calls_per_turn),
    }


def summarize(rollouts, rewards: list[dict], prefix: str = "") -> dict:
    """Scalar metrics over a list of rollouts and their reward dicts."""
    n = max(len(rollouts), 1)
    out = {
        "reward": float(np.mean([x["total"] for x in rewards])) if rewards else 0.0,
        "acc_reward": float(np.mean([x["acc_reward"] for x in rewards])) if rewards else 0.0,
        "format_reward": float(np.mean([x["format_reward"] for x in rewards])) if rewards else 0.0,
        "tool_reward": float(np.mean([x["tool_reward"] for x in rewards])) if rewards else 0.0,
        "anchor_reward": float(np.mean([x.get("anchor_reward", 0.0) for x in rewards])) if rewards else 0.0,
        **tool_use([r.turn_texts for r in rollouts], [r.calls_per_turn for r in rollouts]),
        "turns": float(np.mean([r.turns for r in rollouts])) if rollouts else 0.0,
        "response_length": float(np.mean([int(r.inputs.loss_mask.sum()) for r in rollouts])) if rollouts else 0.0,
        "tool_errors": float(sum(len(r.errors) for r in rollouts)),
    }
    free = [i for i, r in enumerate(rollouts) if not r.tools]
    if free:  # rl.tool_free_share's prompts: their share and how often they call anyway
        out["tool_free"] = len(free) / n
        out["kappa_tool_free"] = sum(R.has_parseable_tool_call("".join(rollouts[i].turn_texts))
                                     for i in free) / len(free)
    for k in sorted({r.nframes for r in rollouts}):  # K = 0: the overview sampled by fps
        at = [i for i, r in enumerate(rollouts) if r.nframes == k]
        name = k or "fps"
        out[f"nframes_{name}"] = len(at) / n
        # per overview budget: the tool-call rate and the accuracy reward (gating's effect by K)
        out[f"kappa_at_{name}"] = tool_use([rollouts[i].turn_texts for i in at],
                                           [rollouts[i].calls_per_turn for i in at])["kappa"]
        if rewards:
            out[f"acc_reward_at_{name}"] = float(np.mean([rewards[i]["acc_reward"] for i in at]))
    return {prefix + k: v for k, v in out.items()}


