"""The planner's vision towers are the passes the sampler runs (issue 48): per shard of rows on a
mesh that splits the row group's cache rows (SamplerConfig.vision_shards, the default), one
replicated pass when the rows do not divide the devices or vision_shards=False. Checked on the
suite's 8 fake devices against a real Sampler: the same rule, the same inputs (shapes, dtypes,
placements) and the same per-device arguments of the compiled program."""
import jax
import numpy as np
import pytest

from integration.test_sampler_shards import image_row
from paravt_jax.planner import memory as M
from paravt_jax.planner.time_plan import _kernel_share
from paravt_jax.sampling import Sampler, SamplerConfig, programs
from paravt_jax.sampling.vision_pass import vision_split
from unit import test_plan as unit_tests

sharded_tiny = unit_tests.sharded_tiny  # the fixture: (fsdp=8 mesh, the tiny model on it)
FRAMES = 4  # frames per row, each one 4 x 6 patch image (test_sampler_shards.GRID)


def sampler_vision(sampler: Sampler, rows: int):
    """(the sampler's vision inputs of a row group of `rows` rows, its row shards)."""
    shards = sampler.row_shards(rows, rows)
    part = [image_row(np.random.default_rng(row), FRAMES) for row in range(rows)]
    return sampler.vision_inputs(part, rows, 64, FRAMES, shards), shards


@pytest.mark.parametrize("vision_shards,rows,split", [(True, 8, 8), (False, 8, 1), (True, 4, 1)])
def test_planner_vision_inputs_are_the_samplers(sharded_tiny, vision_shards, rows, split):
    """8 rows on fsdp=8: one pass per row's device (4 rows: the cache is not split, so one
    replicated pass, as with vision_shards=False); the planner's abstract inputs have the
    sampler's shapes, dtypes and placements."""
    mesh, model = sharded_tiny
    sampler = Sampler(model, SamplerConfig(vision_shards=vision_shards), mesh=mesh)
    real, shards = sampler_vision(sampler, rows)
    assert vision_split(sampler.config, mesh, shards) == split
    pixels, meta = M.vision_inputs(model.config, {(4, 6): rows * FRAMES}, mesh, split)
    ours, theirs = jax.tree.leaves((pixels, meta)), jax.tree.leaves((real.pixel_values, real.meta))
    assert len(ours) == len(theirs)
    for planned, array in zip(ours, theirs):
        assert (planned.shape, planned.dtype) == (array.shape, array.dtype)
        if split > 1:  # placed on the shard's devices: 1/8 of each array per device
            assert planned.sharding.is_equivalent_to(array.sharding, array.ndim)
            assert planned.sharding.shard_shape(planned.shape)[0] == 1
        else:  # host arrays, replicated by the jitted pass
            assert planned.sharding.is_fully_replicated and isinstance(array, np.ndarray)


def test_planner_compiles_the_vision_pass_the_sampler_runs(sharded_tiny):
    """SamplerPrograms.prefill_vision compiles per shard of rows where the sampler shards the
    group (fails if it compiles the replicated pass there), and its per-device arguments are
    those of the sampler's own compiled pass; the replicated baseline holds more."""
    mesh, model = sharded_tiny
    call = M.PrefillCall("first prompt prefill", rows=8, capacity=64, width=64, visual_tokens_per_row=24)
    planned = {}
    for vision_shards in (True, False):
        config = SamplerConfig(vision_shards=vision_shards)
        sampler = Sampler(model, config, mesh=mesh)
        real, shards = sampler_vision(sampler, 8)
        program = M.SamplerPrograms(model.config, config, mesh, "cpu").prefill_vision(
            "vision tower (first prompt prefill)", call, (4, 6), FRAMES)
        assert program.vision_shards == vision_split(config, mesh, shards) == (8 if vision_shards else 1)
        compiled = programs.vision.lower(sampler.graphdef, sampler.params, real.pixel_values, real.meta,
                                         real.mesh).compile()
        assert program.argument_bytes == compiled.memory_analysis().argument_size_in_bytes
        planned[vision_shards] = program
    assert planned[True].argument_bytes < planned[False].argument_bytes


def test_time_plan_divides_a_sharded_vision_pass_over_its_shards():
    """The analytic attention of a vision tower (recorded over all its shards' frames) counts
    per device as the pass runs: a shard's share when split, all of it when replicated."""
    from paravt_jax.models.qwen3_vl import preset

    config = preset("tiny")
    mesh = {"data": 1, "fsdp": 8, "tensor": 1}
    for shards, share in ((8, 1e9), (1, 8e9)):
        program = M.ProgramMemory("vision tower (first prompt prefill)", 0, 0, 32, 0.0, kernel_vision_flops=8e9,
                                  kernel_vision_bytes=8e6, vision_shards=shards)
        assert _kernel_share(program, None, mesh, 1, config) == (share, share / 1e3)
