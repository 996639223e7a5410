"""Orbax checkpoints: train state (params, optimizer state, counters) plus JSON metadata
(data cursor, RNG seed, config) saved together, atomically (orbax writes to a temporary
directory and renames), asynchronously, keeping the last N; every process takes part (multi-
host safe). `restore_latest` returns None when the directory holds no checkpoint. The directory
may be gs:// (orbax writes there itself; a step is complete once its commit marker is)."""
from __future__ import annotations

from typing import Any

import jax
import orbax.checkpoint as ocp

from paravt_jax.infra import storage


class Checkpointer:
    def __init__(self, directory: str, keep: int = 3, async_save: bool = True):
        self.directory = storage.prepare(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=async_save)
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_names=("state", "meta"))

    def save(self, step: int, state: Any, meta: dict, force: bool = False) -> bool:
        return self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=force)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def restore_latest(self, abstract_state: Any) -> tuple[Any, dict] | None:
        step = self.manager.latest_step()
        if step is None:
            return None
        target = jax.tree.map(lambda x: ocp.utils.to_shape_dtype_struct(x) if hasattr(x, "shape") else x,
                              abstract_state)
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
        return restored["state"], dict(restored["meta"])

    def wait(self):
        self.manager.wait_until_finished()

    def close(self):
        self.manager.wait_until_finished()
        self.manager.close()
