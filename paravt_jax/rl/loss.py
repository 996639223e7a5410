"""The decoupled token-level PPO loss.

Everything returns SUMS and COUNTS, never means, so that accumulating micro-batches is exact:
the loss of a step is (sum over micro-batches of loss_sum) / (sum of token_count), which is
what the reference gets by weighting each micro-batch mean with its token count
(`loss_weight_fn = loss_mask.count_nonzero()`). To train: differentiate `loss_sum`, add the
gradients of the micro-batches, divide by the total count once (or scale every micro-batch by
1 / total_count when it is known in advance).

Metrics follow the same rule (`paravt_jax.train.stats`: `WeightedMean`, `RunningMax`).

Log-probs come from the training engine's token head (`paravt_jax.train.step.token_scores`):
logp[:, t] is log p(token t | tokens < t), aligned with the tokens and the loss mask.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from paravt_jax.train.stats import RunningMax, WeightedMean

__all__ = ["ppo_loss"]


def _wmean(x, mask) -> WeightedMean:
    return WeightedMean(jnp.sum(jnp.where(mask, x, 0.0)), jnp.sum(mask).astype(jnp.int32))


def _float(x) -> jax.Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x.astype(jnp.float32)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


# ---------------------------------------------------------------------------------------------
# PPO
# ---------------------------------------------------------------------------------------------

def ppo_loss(
    logp,
    prox_logp,
    behaviour_logp,
    advantages,
    loss_mask,
    *,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    behaviour_cap: float | None = 5.0,
    c_clip: float | None = None,
) -> tuple[jax.Array, jax.Array, dict]:
    """Decoupled token-level PPO-clip loss (reference `ppo_actor_loss_fn`, token level).

    logp: current policy log-probs [N, T] (the only input with a gradient);
    prox_logp: the policy's own log-probs recomputed before the update (PPO's "old");
    behaviour_logp: the rollout engine's log-probs (None = same as prox_logp, i.e. weight 1);
    advantages, loss_mask: [N, T].

    ratio = exp(logp - prox_logp), clipped to [1 - eps_clip, 1 + (eps_clip_high or eps_clip)];
    w = exp(prox_logp - behaviour_logp) (no gradient), and a token with w > behaviour_cap gets
    w = 0; per-token loss = -w * min(ratio * A, clip(ratio) * A) (optionally also capped at
    c_clip * |A|: dual clip, off by default as in the recipe).

    Returns (loss_sum, token_count, metrics). token_count counts every loss token, INCLUDING
    those removed by the behaviour cap (the reference divides by the full loss-mask count; a
    capped token contributes 0 to the sum but still to the denominator).

    Metrics (WeightedMean over loss tokens unless said otherwise):
      clip_frac          tokens where the clipped branch was taken (strictly);
      dual_clip_frac     tokens where the dual clip was active (always 0 without c_clip);
      approx_kl          k1 estimate of KL(prox || current): mean of (prox_logp - logp)
                         (the reference logs the opposite sign, logp - prox_logp);
      approx_kl_k3       k3 estimate of the same KL: mean of (ratio - 1 - log ratio) (>= 0);
      importance_ratio   mean ratio;
      behaviour_weight   mean w over the tokens kept by the cap (the reference's denominator);
      behaviour_weight_max  RunningMax of w over all loss tokens, before the cap;
      behaviour_capped_frac fraction of loss tokens removed by the cap;
      loss               mean per-token loss (same as loss_sum / token_count).
    """
    m = jnp.asarray(loss_mask) > 0
    logp = _float(logp)
    prox = jax.lax.stop_gradient(_float(prox_logp))
    adv = jax.lax.stop_gradient(_float(advantages))

    # Masked positions get log-ratio 0 so that garbage there can never produce inf / NaN grads.
    log_ratio = jnp.where(m, logp - prox, 0.0)
    ratio = jnp.exp(log_ratio)
    high = eps_clip if eps_clip_high is None else eps_clip_high
    # torch.clamp semantics: the gradient passes at a ratio exactly on a bound (jnp.clip's does
    # not), so a tie between the two branches gets the full gradient, as in the reference.
    low_bound, high_bound = 1.0 - eps_clip, 1.0 + high
    clipped = jnp.where(ratio < low_bound, low_bound, jnp.where(ratio > high_bound, high_bound, ratio))
    loss1 = -adv * ratio
    loss2 = -adv * clipped
    per_token = jnp.maximum(loss1, loss2)
    clip_mask = m & (jax.lax.stop_gradient(loss1) < jax.lax.stop_gradient(loss2))
    if c_clip is not None:
        if c_clip <= 1.0:
            raise ValueError(f"c_clip must be > 1, got {c_clip}")
        loss3 = c_clip * jnp.abs(adv)
        dual_mask = m & (loss3 < jax.lax.stop_gradient(per_token))
        per_token = jnp.minimum(per_token, loss3)
    else:
        dual_mask = jnp.zeros_like(m)

    if behaviour_logp is None:
        weight_raw = jnp.ones_like(ratio)
    else:
        behav = jax.lax.stop_gradient(_float(behaviour_logp))
        weight_raw = jnp.exp(jnp.where(m, prox - behav, 0.0))
    keep = m if behaviour_cap is None else m & (weight_raw <= behaviour_cap)
    weight = jnp.where(keep, weight_raw, 0.0)

    per_token = jnp.where(m, per_token * weight, 0.0)
    loss_sum = jnp.sum(per_token)
    count = jnp.sum(m).astype(jnp.int32)

    sg = jax.lax.stop_gradient
    r = sg(ratio)
    metrics = {
        "loss": WeightedMean(sg(loss_sum), count),
        "clip_frac": _wmean(clip_mask.astype(r.dtype), m),
        "dual_clip_frac": _wmean(dual_mask.astype(r.dtype), m),
        "approx_kl": _wmean(-sg(log_ratio), m),
        "approx_kl_k3": _wmean(r - 1.0 - sg(log_ratio), m),
        "importance_ratio": _wmean(r, m),
        "behaviour_weight": _wmean(weight, keep),
        "behaviour_weight_max": RunningMax(jnp.max(jnp.where(m, weight_raw, -jnp.inf)), count),
        "behaviour_capped_frac": _wmean((m & ~keep).astype(r.dtype), m),
    }
    return loss_sum, count, metrics
