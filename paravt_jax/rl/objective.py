"""The PARA-GRPO objective for the training engine: the token head it reads (log-probs at the
sampler's temperature, with entropies) and the decoupled PPO loss on the per-token extras
`advantages`, `behaviour_logp` (the sampler's) and `prox_logp` (recomputed before the update)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from paravt_jax.rl import loss as L
from paravt_jax.train.step import HeadConfig, LossFn, TokenScores

# The per-token extras a policy micro-batch carries.
EXTRAS = ("advantages", "behaviour_logp", "prox_logp")


@dataclasses.dataclass(frozen=True)
class StepConfig:
    temperature: float = 0.7  # log-prob temperature; must equal the sampler's
    # Temperature of the frozen reference policy's log-probs (the KL term); None = `temperature`.
    # The reference recipe computes them at 1.0 (AReaL's default) while sampling at 0.7.
    reference_temperature: float | None = None
    eps_clip: float = 0.2
    eps_clip_high: float | None = None  # upper clip (None: eps_clip)
    behaviour_cap: float | None = 5.0
    logprob_chunk: int = 512  # sequence chunk for the lm head + log-softmax


def policy_head(config: StepConfig) -> HeadConfig:
    return HeadConfig(temperature=config.temperature, chunk=config.logprob_chunk, entropy=True)


def policy_loss(config: StepConfig) -> LossFn:
    """loss_fn(scores, batch) of `paravt_jax.train.step.TrainStep`: `rl.loss.ppo_loss` on the
    extras, and the mean entropy of the loss tokens as a metric (no gradient)."""

    def loss_fn(scores: TokenScores, batch) -> tuple[jax.Array, jax.Array, dict]:
        total, count, metrics = L.ppo_loss(scores.logp, batch["prox_logp"], batch["behaviour_logp"],
                                           batch["advantages"], batch["loss_mask"], eps_clip=config.eps_clip,
                                           eps_clip_high=config.eps_clip_high,
                                           behaviour_cap=config.behaviour_cap)
        m = batch["loss_mask"] > 0
        entropy = jnp.sum(jnp.where(m, jax.lax.stop_gradient(scores.entropy), 0.0))
        return total, count, dict(metrics, entropy=L.WeightedMean(entropy, jnp.sum(m).astype(jnp.int32)))

    return loss_fn
