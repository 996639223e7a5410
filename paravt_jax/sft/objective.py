"""The cold-start SFT objective for the training engine: the plain next-token head and the
masked cross-entropy on the assistant tokens (`loss_mask`), as sft/trainer.py's TrainStep and
the planner's compiled SFT gradient program use them."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from paravt_jax.train.stats import WeightedMean
from paravt_jax.train.step import HeadConfig, TokenScores

HEAD = HeadConfig(temperature=1.0)  # plain next-token cross-entropy


def sft_loss(scores: TokenScores, batch) -> tuple[jax.Array, jax.Array, dict]:
    """Masked negative log-likelihood: (sum over loss tokens, their count, {"nll": mean})."""
    m = batch["loss_mask"] > 0
    total = -jnp.sum(jnp.where(m, scores.logp, 0.0))
    count = jnp.sum(m).astype(jnp.int32)
    return total, count, {"nll": WeightedMean(total, count.astype(jnp.float32))}
