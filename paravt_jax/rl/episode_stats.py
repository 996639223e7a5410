"""Per-rollout statistics for logging and evaluation; the one definition of format
compliance, the tool-call rate kappa and calls per tool turn."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from paravt_jax.agent.tools import parse_tool_calls
from paravt_jax.rl import rewards as R


def format_compliant(text: str) -> bool:
    """Closed think, closed answer with a body, and well-formed tool calls if any."""
    if "</think>" not in text or not R.has_answer_body(text):
        return False
    if "<tool_call>" in text or "<tool_code>" in text:
        parsed = parse_tool_calls(text)
        if parsed.errors or not parsed.calls:
            return False
        if text.count("<tool_call>") != text.count("</tool_call>"):
            return False
    return True


def calls_per_tool_turn(calls_per_turn: Sequence[Sequence[int]]) -> float:
    """Mean number of calls over the turns that made at least one (0 when none did), given each
    episode's calls per turn."""
    tool_turns = [c for turns in calls_per_turn for c in turns if c > 0]
    return float(np.mean(tool_turns)) if tool_turns else 0.0


def tool_use(texts: Sequence[str], calls_per_turn: Sequence[Sequence[int]]) -> dict[str, float]:
    """format_compliance (share of format-compliant texts), kappa (share with a parseable tool
    call) and calls_per_tool_turn over a set of episodes; 0 for an empty set."""
    n = max(len(texts), 1)
    return {
        "format_compliance": sum(format_compliant(t) for t in texts) / n,
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
        **tool_use([r.generated_text for r in rollouts], [r.calls_per_turn for r in rollouts]),
        "turns": float(np.mean([r.turns for r in rollouts])) if rollouts else 0.0,
        "response_length": float(np.mean([int(r.inputs.loss_mask.sum()) for r in rollouts])) if rollouts else 0.0,
        "tool_errors": float(sum(len(r.errors) for r in rollouts)),
    }
    for k in sorted({r.nframes for r in rollouts}):  # K = 0: the overview sampled by fps
        at = [i for i, r in enumerate(rollouts) if r.nframes == k]
        name = k or "fps"
        out[f"nframes_{name}"] = len(at) / n
        # per overview budget: the tool-call rate and the accuracy reward (gating's effect by K)
        out[f"kappa_at_{name}"] = tool_use([rollouts[i].generated_text for i in at],
                                           [rollouts[i].calls_per_turn for i in at])["kappa"]
        if rewards:
            out[f"acc_reward_at_{name}"] = float(np.mean([rewards[i]["acc_reward"] for i in at]))
    return {prefix + k: v for k, v in out.items()}


