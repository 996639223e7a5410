"""The sampler's vision pass per shard of rows on the suite's 8 fake devices: the same greedy
tokens and log-probs as the replicated pass and as an unsharded sampler (both with the prefills
split by rows, SamplerConfig.prefill_row_split's default), each device holding only its own
rows' frames, and the pass's per-device memory below the replicated one's; a row-split
prefill's hidden states hold each device's own rows."""
import jax
import numpy as np
import pytest
from flax import nnx

from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl import init_model, preset
from paravt_jax.models.qwen3_vl.rope import get_rope_index
from paravt_jax.planner.memory import PrefillCall, SamplerPrograms
from paravt_jax.sampling import Sampler, SamplerConfig, SamplingParams, programs
from paravt_jax.text.inputs import ModelInputs
from support.hf_tiny import IM_START, image_tokens, patches, text_ids

GRID = [1, 4, 6]  # one 4 x 6 patch frame: 6 merged vision tokens


def image_row(rng, frames: int, start: int = 0) -> ModelInputs:
    """Text around `frames` image items, its positions from `start`."""
    grids = [GRID] * frames
    ids = [IM_START] + text_ids(rng, int(rng.integers(2, 6)))
    for _ in range(frames):
        ids += image_tokens(GRID)
    ids = np.asarray(ids + text_ids(rng, 3))
    types = (ids == 912).astype(np.int64)
    positions, _ = get_rope_index(types[None], np.ones((1, len(ids))), grids, None)
    positions = positions[:, 0] + start
    empty = np.zeros((0, 1536), np.float32)
    return ModelInputs(ids.astype(np.int32), types.astype(np.int32), np.zeros(len(ids), np.int32), positions,
                       patches(rng, grids), np.asarray(grids, np.int64), empty, np.zeros((0, 3), np.int64),
                       int(positions.max()) + 1)


@pytest.fixture(scope="module")
def models():
    """(the tiny model on one device, the same weights split over an fsdp=8 mesh, the mesh)."""
    plain = init_model(preset("tiny"), seed=3)
    mesh = sh.make_mesh({"data": 1, "fsdp": 8, "tensor": 1})
    sharded = init_model(preset("tiny"), seed=0, mesh=mesh)
    nnx.update(sharded, jax.device_put(nnx.state(plain), sh.state_shardings(plain, mesh)))
    return plain, sharded, mesh


def rollout(sampler: Sampler, seed: int = 0, prompts: int = 8, samples: int = 2):
    """A greedy prompt of 1-3 frames per prompt (`prompts` x `samples`), then a tool response of
    1-2 frames on every row: the tokens and log-probs of both turns."""
    rng = np.random.default_rng(seed)
    greedy = SamplingParams(max_new_tokens=6)
    first, state = sampler.generate([image_row(rng, int(rng.integers(1, 4))) for _ in range(prompts)],
                                    num_samples=samples, sampling=greedy, seed=1)
    chunks = [image_row(rng, int(rng.integers(1, 3)), int(s)) for s in state.chunk_start[:state.num_rows]]
    second, _ = sampler.extend(state, chunks, sampling=greedy, seed=2)
    return first.tokens + second.tokens, first.logprobs + second.logprobs


def turn_rollout(sampler: Sampler, seed: int = 0, prompts: int = 8, samples: int = 2):
    """`rollout`'s episodes with each row's turns refilled on its own (Sampler.start_turns): the
    tool response of a row written at its own slot as soon as its first turn ends."""
    rng = np.random.default_rng(seed)
    greedy = SamplingParams(max_new_tokens=6)
    state = sampler.start_turns([image_row(rng, int(rng.integers(1, 4))) for _ in range(prompts)],
                                num_samples=samples, sampling=greedy, seed=1, refill_at=3)
    frames = [int(rng.integers(1, 3)) for _ in range(prompts * samples)]  # rollout's draws, in row order
    turns = {}
    while ends := sampler.decode_turns(state):
        chunks = {}
        for end in ends:
            turns.setdefault(end.row, []).append((end.tokens, end.logprobs))
            if len(turns[end.row]) == 1:
                chunks[end.row] = image_row(np.random.default_rng(100 + end.row), frames[end.row],
                                            int(state.chunk_start()[end.row]))
        sampler.extend_turns(state, chunks, budget={b: 6 for b in chunks}, seed={b: 2 for b in chunks})
    rows = range(prompts * samples)
    return [turns[b][k][0] for k in (0, 1) for b in rows], [turns[b][k][1] for k in (0, 1) for b in rows]


def test_turns_refilled_row_by_row_on_a_mesh(models):
    """Each row's turns on its own over the fsdp=8 mesh (its tool-response frames written at its
    own slot, one group of every row) give the unsharded sampler's tokens and log-probs."""
    plain, sharded, mesh = models
    tokens, logps = turn_rollout(Sampler(sharded, mesh=mesh))
    want_tokens, want_logps = turn_rollout(Sampler(plain))
    assert tokens == want_tokens
    for got, want in zip(logps, want_logps):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_vision_per_shard_gives_the_replicated_and_unsharded_tokens(models):
    plain, sharded, mesh = models
    expected, expected_logps = rollout(Sampler(plain))
    for vision_shards in (False, True):
        tokens, logps = rollout(Sampler(sharded, SamplerConfig(vision_shards=vision_shards), mesh=mesh))
        assert tokens == expected, vision_shards
        for a, b in zip(logps, expected_logps):
            np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("prompts,samples", [(4, 4), (2, 8)])
def test_fewer_prompts_than_row_blocks_split_the_extend_by_rows(models, prompts, samples):
    """16 rows of 4 or 2 prompts on 8 devices: each device's block of 2 rows lies within one
    prompt, so the tool-response extend still splits by rows (each block given its prompt's
    prefix) instead of running every token on every device; the same greedy tokens and log-probs
    as the unsharded sampler and as the extend left to XLA (prefill_row_split off)."""
    plain, sharded, mesh = models
    split = Sampler(sharded, mesh=mesh)
    assert split.row_shards(16, prompts) == 8 and split.row_shards(16, 16) == 8
    expected, expected_logps = rollout(Sampler(plain), prompts=prompts, samples=samples)
    for sampler in (split, Sampler(sharded, SamplerConfig(prefill_row_split=False), mesh=mesh)):
        tokens, logps = rollout(sampler, prompts=prompts, samples=samples)
        assert tokens == expected
        for a, b in zip(logps, expected_logps):
            np.testing.assert_allclose(a, b, atol=1e-4)


def vision_bytes(sampler: Sampler, part, group: int, shards: int):
    """(vision inputs, per-device temporaries + arguments of the compiled vision program)."""
    vision = sampler.vision_inputs(part, group, 64, 0, shards)
    compiled = programs.vision.lower(sampler.graphdef, sampler.params, vision.pixel_values, vision.meta,
                                     vision.mesh).compile()
    memory = compiled.memory_analysis()
    return vision, memory.temp_size_in_bytes + memory.argument_size_in_bytes


def test_each_device_encodes_only_its_rows_frames(models):
    _, sharded, mesh = models
    rng = np.random.default_rng(5)
    part = [image_row(rng, 4) for _ in range(8)]  # a row group: one row per device
    replicated, full = vision_bytes(Sampler(sharded, SamplerConfig(vision_shards=False), mesh=mesh), part, 8, 8)
    per_shard, own = vision_bytes(Sampler(sharded, mesh=mesh), part, 8, 8)
    assert replicated.pixel_values.ndim == 2 and replicated.mesh is None
    pixels = per_shard.pixel_values
    assert pixels.shape[0] == 8 and pixels.sharding.shard_shape(pixels.shape)[0] == 1
    # a row's image tokens index its own shard's features: the first row's count from 0, as every row's
    assert per_shard.visual_index.reshape(8, -1).max(axis=1).tolist() == [4 * 6 - 1] * 8
    assert own < full / 2, (own, full)
    # rows that do not split over the devices: one replicated pass
    fallback, _ = vision_bytes(Sampler(sharded, mesh=mesh), part, 8, 1)
    assert fallback.pixel_values.ndim == 2


def prefill_hlo(sampler: Sampler, rows: int, width: int) -> tuple[str, int]:
    """(optimised HLO, per-device temporaries) of the prompt prefill of `rows` text rows of
    `width` tokens, one row group, as Sampler.prefill compiles it."""
    compiler = SamplerPrograms(sampler.model.config, sampler.config, sampler.mesh, platform="gpu", keep_compiled=True)
    stats = compiler.prefill(PrefillCall("prompt", rows, width, width))
    assert stats.group_rows == rows
    return compiler.compiled["prompt"].as_text(), stats.temp_bytes


def test_a_row_split_prefill_computes_each_devices_rows_against_gathered_weights(models):
    _, sharded, mesh = models
    width = sharded.config.text.hidden_size
    # the weight copies in the parameters' layout (decode_weight_split=False): the baseline's
    # matmuls then run against the fsdp-split contraction axis (with the MLP split as tensor
    # parallelism, the default, its MLP activations are an eighth as wide)
    params_layout = dict(decode_weight_split=False)
    split, split_temp = prefill_hlo(Sampler(sharded, SamplerConfig(**params_layout), mesh=mesh), 8, 256)
    whole, whole_temp = prefill_hlo(Sampler(sharded, SamplerConfig(prefill_row_split=False, **params_layout),
                                            mesh=mesh), 8, 256)
    # the hidden states on one device: its own row's 256 tokens, every channel (the baseline: all
    # 8 rows' tokens, an eighth of the channels, the layout of the fsdp-split weights)
    own_rows, all_rows = f"[1,256,{width}]", f"[8,256,{width // 8}]"
    assert own_rows in split and all_rows not in split
    assert all_rows in whole
    assert split_temp < whole_temp, (split_temp, whole_temp)


def decode_hlo(sampler: Sampler, rows: int) -> str:
    """The optimised HLO of the decode loop over `rows` rows (one prompt each), as the sampler compiles it."""
    compiler = SamplerPrograms(sampler.model.config, sampler.config, sampler.mesh, platform="gpu", keep_compiled=True)
    compiler.decode(rows, 512, rows, 256, 8)
    return compiler.compiled["decode"].as_text()


def all_reduce_widths(hlo: str) -> set[int]:
    """The widths W of the [rows, 1, W] all-reduces in `hlo` (a decode step's, per token)."""
    import re

    return {int(m.group(1)) for m in re.finditer(r"= \w+\[\d+,1,(\d+)\]\{[^}]*\} all-reduce(?:-start)?\(", hlo)}


def test_decode_weights_split_the_mlp_as_tensor_parallelism(models):
    """On the fsdp=8 mesh the sampler's copies hold gate and up split by their output, down by its
    input and the head by the vocabulary (SamplerConfig.decode_weight_split), so a decode step
    all-reduces no [rows, intermediate] partial sums nor [rows, vocab] partial logits, where the
    parameters' layout (the contraction axis split) does; both give the unsharded sampler's
    greedy tokens and log-probs."""
    plain, sharded, mesh = models
    text = sharded.config.text
    split, params_layout = Sampler(sharded, mesh=mesh), Sampler(sharded, SamplerConfig(decode_weight_split=False),
                                                                  mesh=mesh)
    layer = split.weights.layers[0]
    assert layer["gate_proj_t"].sharding.spec == jax.sharding.PartitionSpec("fsdp")
    assert layer["up_proj_t"].sharding.spec == jax.sharding.PartitionSpec("fsdp")
    assert layer["down_proj_t"].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp")
    assert "gate_up_t" not in layer and "qkv_t" in layer  # q/k/v's output axis stays whole: still fused
    assert split.weights.head_t.sharding.spec == jax.sharding.PartitionSpec("fsdp")
    assert "gate_up_t" in params_layout.weights.layers[0]
    widths, baseline = all_reduce_widths(decode_hlo(split, 8)), all_reduce_widths(decode_hlo(params_layout, 8))
    # the baseline: q/k/v's and gate/up's partial sums (fused), the logits'; split: q/k/v's, down's
    qkv = (text.num_attention_heads + 2 * text.num_key_value_heads) * text.head_dim
    assert baseline == {qkv, 2 * text.intermediate_size, text.vocab_size}, baseline
    assert widths == {qkv, text.hidden_size}, widths
    expected = rollout(Sampler(plain))
    for sampler in (split, params_layout):
        tokens, logprobs = rollout(sampler)
        assert tokens == expected[0]
        np.testing.assert_allclose(np.concatenate(logprobs), np.concatenate(expected[1]), atol=1e-4)
