"""nFrames gating: per prompt, K ~ Uniform(NFRAMES_CHOICES) overview frames.

All G rollouts of a prompt see the same K, and the assignment is reproducible in any
process: K is picked from a SHA-256 digest of (seed, prompt key). The reference
(`workflow._resolve_nframes`) seeds `random.Random(hash(cache_key))`, where the key is the
tuple of the prompt's video paths; Python's string `hash()` is salted per process, so its
assignment is not reproducible across runs or workers. We keep its contract (uniform over
the choices, constant per prompt, gating off -> the default K) with a stable hash. The
reference also draws an unseeded K when a prompt has no key; here a key is required (the RL
trainer passes the row's video path as its table names it, the reference's key for a one-video
prompt, so the draw does not depend on where the data is checked out).

(As released, the reference's fps-based overview sampling discards the gated K; this
project follows the paper: with gating on the overview is exactly K frames.)
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["NFRAMES_CHOICES", "DEFAULT_NFRAMES", "nframes_for_prompt", "tool_free_prompt", "drawn_share"]

NFRAMES_CHOICES = (4, 8, 16, 32, 64)
DEFAULT_NFRAMES = 64

_SEP = "\x1f"  # unit separator: cannot be confused with characters of a seed or a path


def _digest64(salt: str, seed: int, key: str) -> int:
    """64 bits of the SHA-256 digest of (salt, seed, key): the same in any process."""
    digest = hashlib.sha256(f"{salt}{_SEP}{int(seed)}{_SEP}{key}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big")


def _draw_index(prompt_key: str, seed: int, n: int) -> int:
    # 64 bits mod n: the bias is below n / 2**64, i.e. nil for five choices.
    return _digest64("paravt-nframes", seed, prompt_key) % n


def drawn_share(salt: str, seed: int, key, share: float) -> bool:
    """True for a `share` of the keys, drawn from (salt, seed, key) alone; each `salt` is a
    draw of its own (the tool-free prompts here, the SFT's direct answers)."""
    return _digest64(salt, seed, str(key)) / 2**64 < share


def nframes_for_prompt(prompt_key: str, seed: int, enabled: bool,
                       default: int = DEFAULT_NFRAMES,
                       choices: Sequence[int] = NFRAMES_CHOICES) -> int:
    """K for one prompt: `default` when gating is off, else a uniform pick from `choices`
    determined by (seed, prompt_key) alone."""
    if not enabled:
        return int(default)
    if len(choices) == 0:
        raise ValueError("nframes choices must not be empty")
    return int(choices[_draw_index(str(prompt_key), seed, len(choices))])


def tool_free_prompt(prompt_key: str, seed: int, share: float) -> bool:
    """Whether one RL prompt is posed without the tools (`rl.tool_free_share`; the reference's
    prompts always offer them): true for a `share` of the prompt keys, by a SHA-256 draw of
    (seed, key) with its own salt (independent of the K draw), the same in any process."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"tool_free_share must be in [0, 1], got {share!r}")
    return drawn_share("paravt-tool-free", seed, prompt_key, share)
