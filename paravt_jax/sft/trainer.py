"""Cold-start SFT: masked cross-entropy on assistant tokens (prompts, tool responses and
template tokens masked out), rows length-bucketed by padding to bucketed widths."""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from paravt_jax import distributed as dist
from paravt_jax.data.sft_examples import sft_inputs
from paravt_jax.rl.batch import micro_batches, pack
from paravt_jax.rl.train_step import OptimizerConfig, StepConfig, TrainStep
from paravt_jax.training import LoopConfig, data_indices, run_loop


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    steps: int = 20
    batch_size: int = 4
    micro_batches: int = 1
    seed: int = 0
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

    step = TrainStep(model, config.optimizer, StepConfig(objective="sft"), mesh=dist.model_mesh(model))

    def step_fn(state, index):
        chosen = data_indices(index * config.batch_size, config.batch_size, len(rows), config.seed)
        mine = [example(i) for i in chosen[share]]
        packed = pack(dist.concatenate_lists(dist.allgather_objects(mine)))
        batches = micro_batches(packed, np.zeros(packed.input_ids.shape, np.float32), config.micro_batches,
                                model.config.vision)
        return step.step(state, batches)

    result = run_loop("sft", workdir, step.init_state(), step_fn,
                      LoopConfig(config.steps, config.checkpoint_every),
                      meta_fn=lambda i: {"cursor": i * config.batch_size, "seed": config.seed})
    return step.model(result.state), result
