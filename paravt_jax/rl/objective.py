"""The PARA-GRPO objective for the training engine: the token head it reads (log-probs at the
sampler's temperature, with entropies) and the decoupled PPO loss on the per-token extras
`advantages`, `behaviour_logp` (the sampler's) and the proximal log-probs.

The proximal ("old") policy is the trainer's weights before the update. The RL step makes one
optimizer update per step (one PPO minibatch, as the reference recipe), so the weights the
gradient pass runs with ARE the proximal policy: `prox_logprobs="same_pass"` (default) takes
its log-probs from that pass under a stop-gradient instead of a separate forward pass before
it (the reference's recomputation), one forward pass fewer per micro-batch with the same
values up to float reduction order. `"recompute"` runs the separate pass and carries the
result as the extra `prox_logp`."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from paravt_jax.config import checked, integer, one_of, optional, positive, validate
from paravt_jax.rl import loss as L
from paravt_jax.train.stats import WeightedMean
from paravt_jax.train.step import HeadConfig, LossFn, TokenScores

# The per-token extras a policy micro-batch carries (prox_logp only with "recompute").
EXTRAS = ("advantages", "behaviour_logp", "prox_logp")
PROX_LOGPROBS = ("same_pass", "recompute")


@dataclasses.dataclass(frozen=True)
class StepConfig:
    temperature: float = checked(0.7, positive())  # log-prob temperature; must equal the sampler's
    # Temperature of the frozen reference policy's log-probs (the KL term); None = `temperature`.
    # The reference recipe computes them at 1.0 (AReaL's default) while sampling at 0.7.
    reference_temperature: float | None = checked(None, optional(positive()))
    eps_clip: float = checked(0.2, positive())
    eps_clip_high: float | None = checked(None, optional(positive()))  # upper clip (None: eps_clip)
    behaviour_cap: float | None = checked(5.0, optional(positive()))  # None: no cap
    logprob_chunk: int = checked(512, integer(1))  # sequence chunk for the lm head + log-softmax
    prox_logprobs: str = checked("same_pass", one_of(PROX_LOGPROBS))  # see the module docstring

    def __post_init__(self):
        validate(self)


def policy_head(config: StepConfig) -> HeadConfig:
    return HeadConfig(temperature=config.temperature, chunk=config.logprob_chunk, entropy=True)


def policy_loss(config: StepConfig) -> LossFn:
    """loss_fn(scores, batch) of `paravt_jax.train.step.TrainStep`: `rl.loss.ppo_loss` on the
    extras, and the mean entropy of the loss tokens as a metric (no gradient)."""
    same_pass = config.prox_logprobs == "same_pass"

    def loss_fn(scores: TokenScores, batch) -> tuple[jax.Array, jax.Array, dict]:
        prox = jax.lax.stop_gradient(scores.logp) if same_pass else batch["prox_logp"]
        total, count, metrics = L.ppo_loss(scores.logp, prox, batch["behaviour_logp"],
                                           batch["advantages"], batch["loss_mask"], eps_clip=config.eps_clip,
                                           eps_clip_high=config.eps_clip_high,
                                           behaviour_cap=config.behaviour_cap)
        m = batch["loss_mask"] > 0
        entropy = jnp.sum(jnp.where(m, jax.lax.stop_gradient(scores.entropy), 0.0))
        return total, count, dict(metrics, entropy=WeightedMean(entropy, jnp.sum(m).astype(jnp.int32)))

    return loss_fn
