"""Cold-start SFT: masked cross-entropy on assistant tokens (prompts, tool responses and
template tokens masked out), rows length-bucketed by padding to bucketed widths."""
from __future__ import annotations

import dataclasses
import functools

from paravt_jax import distributed as dist
import jax
import jax.numpy as jnp

from paravt_jax.config import set_by
from paravt_jax.data.sft_examples import sft_inputs
from paravt_jax.rl.loss import WeightedMean
from paravt_jax.train.batch import micro_batches, pack
from paravt_jax.train.loop import LoopConfig, data_indices, run_loop
from paravt_jax.train.step import HeadConfig, OptimizerConfig, TokenScores, TrainStep

HEAD = HeadConfig(temperature=1.0)  # plain next-token cross-entropy


def sft_loss(scores: TokenScores, batch) -> tuple[jax.Array, jax.Array, dict]:
    """Masked negative log-likelihood: (sum over loss tokens, their count, {"nll": mean})."""
    m = batch["loss_mask"] > 0
    total = -jnp.sum(jnp.where(m, scores.logp, 0.0))
    count = jnp.sum(m).astype(jnp.int32)
    return total, count, {"nll": WeightedMean(total, count.astype(jnp.float32))}


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    steps: int = 20
    batch_size: int = 4
    micro_batches: int = 1
    seed: int = set_by(0, "seed (the top of the config)")
    nframes: int = 8
    max_pixels: int = 50176
    optimizer: OptimizerConfig = OptimizerConfig(learning_rate=1e-3, weight_decay=0.0)
    checkpoint_every: int = 0


def train_sft(model, tokenizer, rows: list, video_root: str, workdir: str, config: SFTConfig):
    """Returns (model with trained weights, LoopResult). Each process reads the videos of its
    contiguous share of every batch (once per row, on first use); the shares are gathered into
    the global batch, in process order (see paravt_jax.distributed)."""
    share = dist.process_slice(config.batch_size, "batch_size")

    @functools.cache
    def example(i: int):
        return sft_inputs(rows[i], tokenizer, video_root, config.nframes, config.max_pixels)

    step = TrainStep(model, config.optimizer, sft_loss, HEAD, mesh=dist.model_mesh(model))

    def step_fn(state, index):
        chosen = data_indices(index * config.batch_size, config.batch_size, len(rows), config.seed)
        mine = [example(i) for i in chosen[share]]
        packed = pack(dist.concatenate_lists(dist.allgather_objects(mine)))
        return step.step(state, micro_batches(packed, config.micro_batches, model.config.vision))

    result = run_loop("sft", workdir, step.init_state(), step_fn,
                      LoopConfig(config.steps, config.checkpoint_every),
                      meta_fn=lambda i: {"cursor": i * config.batch_size, "seed": config.seed})
    return step.model(result.state), result
