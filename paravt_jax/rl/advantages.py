"""PARA-GRPO advantages as pure JAX functions (AReaL semantics of the reference trainer).

Pipeline (`compute_advantages`), matching the reference `PPOActor.compute_advantages` with the
recipe values (`_base.yaml` + `paragrpo_8b.yaml`):

1. shaping       r' = clip((r + reward_bias) * reward_scaling, -reward_clip, reward_clip)
2. group norm    r'' = (r' - mean_group) / (std_group + std_eps), std unbiased (ddof 1);
                 a group of one sample has std 1 (so r'' = 0), as in the reference.
3. token rewards on every loss token: -kl_ctl * clamp(old_logp - ref_logp, -10, 10) (the k1
                 estimator, clamped as the reference's `KLEstimator` does); plus r'' at the
                 row's LAST loss token.
4. reward-to-go  A_t = sum of the token rewards of the loss tokens s >= t of the same row
                 (gamma = lambda = 1, no critic). Tokens outside the loss mask neither earn
                 nor get a reward: the sum skips them and their advantage is 0.
5. batch norm    over all loss tokens of the batch: (A - mean) / (std + std_eps), std
                 unbiased; positions outside the loss mask are 0 afterwards.
6. anchor        (`anchor_mode="token"`, this project's default; see below).

Array layout: N rows (completions) x T positions; rows are prompt-major (row = p * G + g) when
groups are given by `group_size`, or arbitrary with explicit `group_ids`. All [N, T] inputs
are aligned with one another: position t of `old_logp`, `ref_logp`, `structural_mask` and
`loss_mask` all describe the same generated token (the caller does the next-token shift;
the reference stores everything rolled by one position, which is the same thing).

Which log-probs are `old_logp`: the reference runs the decoupled loss
(`use_decoupled_loss: true`), in which case the KL reward uses the ROLLOUT (behaviour)
log-probs against the reference model's; without the decoupled loss it would use the
recomputed proximal log-probs. Pass whichever the trainer uses; the function does not care.

Where the sequence reward lands: the reference adds it at the position of the sequence's
last token (`seqlens - 2` after its roll), which is the last loss token whenever the
sequence ends in a generated token (the final `<|im_end|>`). We place it at the last loss
token explicitly, so trailing template/padding tokens can never swallow it.

Targeted anchor (`anchor_mode="token"`). The per-row R_anchor (unweighted, see
`paravt_jax.episodes.rewards.anchor_reward`) must NOT be inside `rewards` in this mode. It is
group-normalised on its own (same groups, same unbiased std + eps), multiplied by
`anchor_weight`, and added to the advantage at the structural-tag positions of the generated
text (`structural_mask & loss_mask`); a row with no such position gets it at its last loss
token. The anchor is an ADVANTAGE, not a reward: it does not flow backwards through the
reward-to-go, so only the tag tokens themselves are pushed.

ORDER DECISION: the anchor term is added AFTER the batch normalisation. Reasons:
  * the signal stays targeted and undiluted: its size is exactly anchor_weight x a
    group-normalised value, in the same units as the (unit-variance) task advantages,
    whatever the spread of the task rewards in this batch;
  * it does not leak into the batch statistics, so every non-anchor position has exactly the
    advantage it would have without the anchor ("token" and "sequence" mode given the same
    task rewards differ only at the anchor positions, with or without batch norm);
  * with the anchor folded in before the normalisation, a batch whose task rewards barely vary
    would have its std dominated by the anchor positions, shrinking the task signal
    everywhere.
`anchor_mode="sequence"` is the released-code behaviour: R_anchor is already inside the
sequence reward (through the format reward) and nothing extra happens here.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from paravt_jax.config import checked, non_negative, one_of, positive, share, validate

ANCHOR_MODES = ("sequence", "token")

__all__ = [
    "ANCHOR_MODES",
    "AdvantageConfig",
    "shape_rewards",
    "group_normalize",
    "group_normalize_by_ids",
    "masked_normalize",
    "kl_rewards",
    "token_rewards",
    "reward_to_go",
    "last_loss_index",
    "anchor_positions",
    "anchor_advantages",
    "compute_advantages",
]


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    """Static knobs (hashable; safe as a `jax.jit` static argument). Defaults = PARA-GRPO recipe."""

    reward_bias: float = -0.2                               # actor.reward_bias
    reward_scaling: float = 10.0                            # actor.reward_scaling
    reward_clip: float = checked(20.0, positive())          # AReaL default reward_clip
    group_norm: bool = True                                 # actor.reward_norm: mean/std at group level
    std_eps: float = checked(1e-5, non_negative())          # NormConfig.eps (both normalisations)
    kl_ctl: float = checked(0.01, non_negative())           # actor.kl_ctl (k1 estimator)
    kl_clamp: float | None = 10.0                           # KLEstimator clamps the log-ratio to [-10, 10]
    batch_norm: bool = True                                 # actor.adv_norm: mean/std at batch level
    # "token" (this project's default) | "sequence" (released)
    anchor_mode: str = checked("token", one_of(ANCHOR_MODES))
    anchor_weight: float = checked(0.5, non_negative())     # paravt.anchoring.weight
    gamma: float = checked(1.0, share())                    # discount x GAE lambda (both 1.0 in the recipe)

    def __post_init__(self):
        validate(self)

    @property
    def token_anchor(self) -> bool:
        return self.anchor_mode == "token" and self.anchor_weight != 0.0


def _float(x) -> jax.Array:
    """As a floating array: float32, or wider when the input already is (x64 tests)."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x.astype(jnp.float32)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _mask(mask) -> jax.Array:
    return jnp.asarray(mask) > 0


# ---------------------------------------------------------------------------------------------
# Sequence-level rewards
# ---------------------------------------------------------------------------------------------

def shape_rewards(rewards, cfg: AdvantageConfig = AdvantageConfig()) -> jax.Array:
    """clip((r + bias) * scaling, -clip, clip), elementwise."""
    r = (_float(rewards) + cfg.reward_bias) * cfg.reward_scaling
    return jnp.clip(r, -cfg.reward_clip, cfg.reward_clip)


def group_normalize(x, group_size: int, eps: float = 1e-5) -> jax.Array:
    """(x - group mean) / (unbiased group std + eps) over contiguous groups of `group_size`.

    `x` is [N] with N a multiple of `group_size` (rows prompt-major). A group of one sample uses
    std 1 (the reference's special case), so its value becomes 0.
    """
    x = _float(x)
    n = x.shape[0]
    if group_size < 1 or n % group_size:
        raise ValueError(f"batch of {n} rows is not a whole number of groups of {group_size}")
    g = x.reshape(n // group_size, group_size)
    mean = g.mean(axis=1, keepdims=True)
    if group_size == 1:
        std = jnp.ones_like(mean)
    else:
        std = jnp.sqrt(jnp.sum((g - mean) ** 2, axis=1, keepdims=True) / (group_size - 1))
    return ((g - mean) / (std + eps)).reshape(n)


def group_normalize_by_ids(x, group_ids, eps: float = 1e-5) -> jax.Array:
    """Like `group_normalize`, with groups given by integer ids in [0, N) (any row order)."""
    x = _float(x)
    n = x.shape[0]
    ids = jnp.asarray(group_ids, jnp.int32)
    count = jax.ops.segment_sum(jnp.ones_like(x), ids, num_segments=n)
    total = jax.ops.segment_sum(x, ids, num_segments=n)
    mean = (total / jnp.maximum(count, 1.0))[ids]
    sq = jax.ops.segment_sum((x - mean) ** 2, ids, num_segments=n)
    c = count[ids]
    std = jnp.where(c > 1, jnp.sqrt(sq[ids] / jnp.maximum(c - 1.0, 1.0)), 1.0)
    return (x - mean) / (std + eps)


def _normalize_groups(x, eps: float, group_size: int | None, group_ids) -> jax.Array:
    if group_ids is not None:
        return group_normalize_by_ids(x, group_ids, eps)
    if group_size is None:
        raise ValueError("group normalisation needs `group_size` or `group_ids`")
    return group_normalize(x, group_size, eps)


# ---------------------------------------------------------------------------------------------
# Token-level rewards and returns
# ---------------------------------------------------------------------------------------------

def last_loss_index(loss_mask) -> jax.Array:
    """[N] index of each row's last loss token (T - 1 for a row without any)."""
    m = _mask(loss_mask)
    return m.shape[-1] - 1 - jnp.argmax(m[:, ::-1], axis=-1)


def _at_last_loss_token(loss_mask) -> jax.Array:
    """[N, T] bool, True only at each row's last loss token (all False for an empty row)."""
    m = _mask(loss_mask)
    pos = jnp.arange(m.shape[-1])[None, :]
    return (pos == last_loss_index(m)[:, None]) & m.any(axis=-1, keepdims=True)


def kl_rewards(old_logp, ref_logp, loss_mask, *, kl_ctl: float = 0.01,
               kl_clamp: float | None = 10.0) -> jax.Array:
    """[N, T] per-token KL reward -kl_ctl * clamp(old_logp - ref_logp) on loss tokens, else 0."""
    m = _mask(loss_mask)
    log_ratio = jnp.where(m, _float(old_logp) - _float(ref_logp), 0.0)
    if kl_clamp is not None:
        log_ratio = jnp.clip(log_ratio, -kl_clamp, kl_clamp)
    return -kl_ctl * log_ratio


def token_rewards(seq_rewards, old_logp, ref_logp, loss_mask, *, kl_ctl: float = 0.01,
                  kl_clamp: float | None = 10.0) -> tuple[jax.Array, jax.Array]:
    """Per-token rewards: the k1 KL reward on every loss token plus `seq_rewards` [N] (already
    shaped and normalised) at each row's last loss token.

    Returns (total [N, T], kl_part [N, T]).
    """
    kl = kl_rewards(old_logp, ref_logp, loss_mask, kl_ctl=kl_ctl, kl_clamp=kl_clamp)
    seq = _float(seq_rewards)[:, None]
    total = kl + jnp.where(_at_last_loss_token(loss_mask), seq, 0.0)
    return total, kl


def reward_to_go(rewards, loss_mask, gamma: float = 1.0) -> jax.Array:
    """[N, T] advantage without critic: A_t = r_t + gamma * A_(next loss token of the row),
    counted over loss tokens only (non-loss positions are skipped and get 0).

    gamma is the product discount x GAE lambda of the reference (values are 0, so GAE reduces
    to a discounted return). gamma = 1 uses a reversed cumulative sum.
    """
    m = _mask(loss_mask)
    r = jnp.where(m, _float(rewards), 0.0)
    if gamma == 1.0:
        rtg = jnp.flip(jnp.cumsum(jnp.flip(r, axis=-1), axis=-1), axis=-1)
        return jnp.where(m, rtg, 0.0)

    def step(carry, inputs):
        r_t, m_t = inputs
        new = r_t + gamma * carry
        carry = jnp.where(m_t, new, carry)
        return carry, jnp.where(m_t, carry, 0.0)

    init = jnp.zeros(r.shape[:1], r.dtype)
    _, out = jax.lax.scan(step, init, (r.T, m.T), reverse=True)
    return out.T


def masked_normalize(x, loss_mask, eps: float = 1e-5) -> jax.Array:
    """Batch normalisation over the loss tokens: (x - mean) / (unbiased std + eps), 0 outside
    the mask. Reference edge cases: an empty mask returns x unchanged; a single token uses
    std 1."""
    x = _float(x)
    m = _mask(loss_mask)
    mf = m.astype(x.dtype)
    count = mf.sum()
    mean = jnp.sum(x * mf) / jnp.maximum(count, 1.0)
    sq = jnp.sum(((x - mean) * mf) ** 2)
    std = jnp.where(count > 1, jnp.sqrt(sq / jnp.maximum(count - 1.0, 1.0)), 1.0)
    out = jnp.where(m, (x - mean) / (std + eps), 0.0)
    return jnp.where(count > 0, out, x)


# ---------------------------------------------------------------------------------------------
# Targeted anchor
# ---------------------------------------------------------------------------------------------

def anchor_positions(structural_mask, loss_mask) -> jax.Array:
    """[N, T] bool: structural-tag positions among the loss tokens; for a row with none, its
    last loss token (a row without loss tokens gets nothing)."""
    m = _mask(loss_mask)
    tags = _mask(structural_mask) & m
    has_tag = tags.any(axis=-1, keepdims=True)
    return jnp.where(has_tag, tags, _at_last_loss_token(m))


def anchor_advantages(anchor_rewards, structural_mask, loss_mask, *, weight: float,
                      eps: float = 1e-5, group_size: int | None = None,
                      group_ids=None) -> jax.Array:
    """[N, T] anchor term: weight x group-normalised `anchor_rewards` [N] at `anchor_positions`,
    0 elsewhere. Every marked position of a row gets the full value."""
    a = weight * _normalize_groups(anchor_rewards, eps, group_size, group_ids)
    return jnp.where(anchor_positions(structural_mask, loss_mask), a[:, None], 0.0)


# ---------------------------------------------------------------------------------------------
# Top level
# ---------------------------------------------------------------------------------------------

def _masked_mean_std(x, m):
    mf = m.astype(x.dtype)
    count = jnp.maximum(mf.sum(), 1.0)
    mean = jnp.sum(x * mf) / count
    std = jnp.sqrt(jnp.sum(((x - mean) * mf) ** 2) / jnp.maximum(count - 1.0, 1.0))
    return mean, std


def compute_advantages(
    rewards,
    loss_mask,
    old_logp,
    ref_logp,
    cfg: AdvantageConfig = AdvantageConfig(),
    *,
    group_size: int | None = None,
    group_ids=None,
    anchor_rewards=None,
    structural_mask=None,
) -> tuple[jax.Array, dict[str, Any]]:
    """Advantages [N, T] and scalar metrics.

    rewards [N]: sequence rewards (without R_anchor in token mode); loss_mask [N, T];
    old_logp / ref_logp [N, T]; groups by `group_size` (static int, prompt-major rows) or
    `group_ids` [N]; in token-anchor mode also `anchor_rewards` [N] (unweighted R_anchor) and
    `structural_mask` [N, T]. Jittable with `cfg` and `group_size` static.
    """
    m = _mask(loss_mask)
    raw = _float(rewards)
    shaped = shape_rewards(raw, cfg)
    seq = _normalize_groups(shaped, cfg.std_eps, group_size, group_ids) if cfg.group_norm else shaped
    total, kl = token_rewards(seq, old_logp, ref_logp, m, kl_ctl=cfg.kl_ctl, kl_clamp=cfg.kl_clamp)
    adv = reward_to_go(total, m, cfg.gamma)
    pre_mean, pre_std = _masked_mean_std(adv, m)
    if cfg.batch_norm:
        adv = masked_normalize(adv, m, cfg.std_eps)

    n_tokens = m.sum()
    denom = jnp.maximum(n_tokens, 1).astype(adv.dtype)
    metrics: dict[str, Any] = {
        "reward/raw_mean": raw.mean(),
        "reward/shaped_mean": shaped.mean(),
        "reward/clipped_frac": jnp.mean(
            (jnp.abs((raw + cfg.reward_bias) * cfg.reward_scaling) > cfg.reward_clip).astype(adv.dtype)),
        "reward/kl_token_mean": jnp.sum(kl) / denom,
        "adv/pre_norm_mean": pre_mean,
        "adv/pre_norm_std": pre_std,
        "loss_tokens": n_tokens,
    }

    if cfg.token_anchor:
        if anchor_rewards is None or structural_mask is None:
            raise ValueError("anchor_mode='token' needs `anchor_rewards` and `structural_mask`")
        anchor = anchor_advantages(anchor_rewards, structural_mask, m, weight=cfg.anchor_weight,
                                   eps=cfg.std_eps, group_size=group_size, group_ids=group_ids)
        adv = adv + anchor  # after the batch normalisation: see the module docstring
        pos = anchor_positions(structural_mask, m)
        n_pos = pos.sum()
        metrics["anchor/positions"] = n_pos
        metrics["anchor/fallback_rows"] = jnp.sum(m.any(-1) & ~(_mask(structural_mask) & m).any(-1))
        metrics["anchor/abs_mean"] = jnp.sum(jnp.abs(anchor)) / jnp.maximum(n_pos, 1).astype(adv.dtype)
        metrics["anchor/reward_mean"] = _float(anchor_rewards).mean()

    metrics["adv/mean"], metrics["adv/std"] = _masked_mean_std(adv, m)
    return adv, metrics
