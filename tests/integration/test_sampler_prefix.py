"""The rollout cache layout: a shared prompt prefix per prompt + a suffix per row, row-grouped
prefills, and a suffix that grows without copying the whole cache."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paravt_jax.models.qwen3_vl import init_model, preset
from paravt_jax.models.qwen3_vl.rope import get_rope_index
from paravt_jax.sampling import Sampler, SamplerConfig, SamplingParams
from paravt_jax.sampling.calls import PromptShape
from paravt_jax.sampling.chunks import group_rows
from paravt_jax.sampling.programs import grow_layer
from paravt_jax.text.inputs import ModelInputs, encode_ids
from paravt_jax.train import compiles
from support.hf_tiny import image_tokens, patches, text_ids

G = 3


@pytest.fixture(scope="module")
def model():
    return init_model(preset("tiny"), seed=3)


def image_prompt(rng, text_before, text_after, start=0) -> ModelInputs:
    grid = [1, 4, 6]
    ids = np.asarray(text_ids(rng, text_before) + image_tokens(grid) + text_ids(rng, text_after))
    types = (ids == 912).astype(np.int64)
    pos, _ = get_rope_index(types[None], np.ones((1, len(ids))), [grid], None)
    empty = np.zeros((0, 1536), np.float32)
    return ModelInputs(ids.astype(np.int32), types.astype(np.int32), np.zeros(len(ids), np.int32),
                       pos[:, 0] + start, patches(rng, [grid]), np.asarray([grid], np.int64), empty,
                       np.zeros((0, 3), np.int64), int(pos.max()) + 1 + start)


def prompts(seed=0):
    """Three prompts of different lengths, one with an image."""
    rng = np.random.default_rng(seed)
    return [encode_ids(rng.integers(0, 900, 5).tolist(), 0), image_prompt(rng, 3, 9),
            encode_ids(rng.integers(0, 900, 30).tolist(), 0)]


def episode(sampler: Sampler, temperature: float, reserve=(), prompt_list=None, shape=None):
    """generate (over `prompt_list`, default prompts()) + 2 extends (row 4 sits the first extend
    out; the second extend's chunks carry an image). Returns the three SampleOutputs and the
    states."""
    rng = np.random.default_rng(9)
    sampling = SamplingParams(max_new_tokens=6, temperature=temperature)
    out, state = sampler.generate(prompts() if prompt_list is None else prompt_list, num_samples=G, seed=2,
                                  reserve=reserve, shape=shape or PromptShape(), sampling=sampling)
    outs, states = [out], [state]
    for turn in range(2):
        chunks = []
        for b in range(state.num_rows):
            start = int(state.chunk_start[b])
            if turn == 0 and b == 4:
                chunks.append(None)
            elif turn == 1:
                chunks.append(image_prompt(rng, 2, int(rng.integers(1, 6)), start))
            else:
                chunks.append(encode_ids(rng.integers(0, 900, int(rng.integers(1, 12))).tolist(), start))
        out, state = sampler.extend(state, chunks, seed=3 + turn, sampling=sampling)
        outs.append(out)
        states.append(state)
    return outs, states


def assert_same(a, b, atol=1e-5):
    for x, y in zip(a, b):
        assert x.tokens == y.tokens
        for p, q in zip(x.logprobs, y.logprobs):
            np.testing.assert_allclose(p, q, atol=atol)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_prefix_equals_copied_rows(model, temperature):
    shared, shared_states = episode(Sampler(model), temperature)
    copied, copied_states = episode(Sampler(model, SamplerConfig(shared_prefix=False)), temperature)
    assert_same(shared, copied)
    assert shared[1].lengths[4] == 0 and shared[2].lengths[4] > 0  # sat out, then came back
    # one prompt copy per prompt (4 = bucket of 3) vs one per row (12)
    assert shared_states[0].prefix.valid.shape[0] == 4 and copied_states[0].prefix.valid.shape[0] == 12
    assert shared_states[0].suffix.keys[0].shape[0] == copied_states[0].suffix.keys[0].shape[0] == 12
    if temperature:
        assert len({tuple(t) for t in shared[0].tokens[:G]}) > 1  # the samples of a prompt differ


def test_suffix_growth_copies_one_layer_and_keeps_outputs(model):
    """An episode whose extends grow the suffix equals one whose suffix was reserved up front;
    the prefix is never copied (the same buffers after every turn) and the grow program reads
    one layer."""
    grown, grown_states = episode(Sampler(model), 1.0)
    reserved, reserved_states = episode(Sampler(model), 1.0, reserve=[(40, 6)] * 2)
    assert_same(grown, reserved)
    assert grown_states[0].suffix.capacity < grown_states[-1].suffix.capacity  # it grew
    assert reserved_states[0].suffix.capacity == reserved_states[-1].suffix.capacity  # never grew
    for state in grown_states[1:]:
        assert state.prefix.keys[0] is grown_states[0].prefix.keys[0]
    layer = jax.ShapeDtypeStruct((12, 2, 16, 64), jnp.float32)
    analysis = grow_layer.lower(layer, 3, 64, None).compile().memory_analysis()
    assert analysis.argument_size_in_bytes == 12 * 2 * 16 * 64 * 4  # one layer, not the cache
    assert analysis.output_size_in_bytes == 12 * 2 * 16 * 128 * 4


def test_row_grouped_prefill_equals_one_group(model):
    """Prefill logits and caches with row groups of 1-3 rows equal one group over all rows
    (the prompt prefill and an extend over the shared prefix); whole episodes agree too."""
    sampler = Sampler(model)
    rows, width = 4, 32
    for budget, want in ((32, 1), (64, 2), (96, 2)):
        grouped = Sampler(model, SamplerConfig(prefill_tokens=budget))
        assert grouped.prefill_group(rows, 1, width) == want
        results = []
        for s in (sampler, grouped):
            logits, cache = s.prefill(s.empty_cache(rows, width), None, 0, prompts(), width)
            results.append([x[:3] for x in [logits, *jax.tree.leaves(cache)]])  # the padding row differs
        for a, b in zip(*results):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    # extends over the shared prefix: groups of 1 row (a divisor of G) and of G rows
    for budget in (16, 48):
        grouped, _ = episode(Sampler(model, SamplerConfig(prefill_tokens=budget)), 0.0)
        one, _ = episode(sampler, 0.0)
        assert_same(grouped, one)


def test_row_groups_on_a_mesh_stay_on_each_device(model):
    """Rows split over 4 devices (data x fsdp): every row group takes the same rows of each
    device's block, and the episode equals the unsharded one-group episode."""
    from flax import nnx

    from paravt_jax.infra import sharding as sh
    from paravt_jax.sampling.kv_cache import RowGroup

    mesh = sh.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharded_model = init_model(preset("tiny"), seed=0, mesh=mesh)
    nnx.update(sharded_model, jax.device_put(nnx.state(model), sh.state_shardings(model, mesh)))
    sampler = Sampler(sharded_model, SamplerConfig(prefill_tokens=16), mesh=mesh)
    assert sampler.row_shards(12, 4) == 4 and sampler.prefill_group(12, 3, 16, 4) == 4
    assert RowGroup(2, 1, 4).order(12).tolist() == [2, 5, 8, 11]
    sharded, states = episode(sampler, 1.0)
    plain, _ = episode(Sampler(model), 1.0)
    assert_same(sharded, plain, atol=1e-4)
    assert states[-1].suffix.keys[0].sharding.spec[0] is not None


def test_group_rows():
    assert group_rows(64, 8, 1024, 16384) == 16  # two prompts of 8 samples
    assert group_rows(64, 8, 4096, 16384) == 4  # a divisor of the 8 samples of one prompt
    assert group_rows(64, 8, 64, 1 << 20) == 64
    assert group_rows(12, 3, 100, 50) == 1  # one row over the budget still runs
    assert group_rows(8, 1, 10, 35) == 2  # powers of two of whole prompts only


def test_fixed_prompt_shape_and_window_keep_outputs_and_compile_nothing_new(model):
    """Fixed prompt-prefill sizes (rows, width, frames per row), a prefill that attends the
    whole cache and text extends written in fixed-width pieces give the same tokens and
    log-probs as each call's own buckets, and a second episode over other prompts (another
    length, another image count) compiles no program."""
    shape = PromptShape(rows=4, width=64, frames_per_row=2)
    reserve = [(40, 6)] * 2
    plain, _ = episode(Sampler(model), 1.0, reserve=reserve)
    # turn 0's text chunks (up to 13 tokens) go in pieces of 8; turn 1's carry images: one call
    fixed_sampler = Sampler(model, SamplerConfig(prefill_window="capacity", extend_width=8))

    assert_same(plain, episode(fixed_sampler, 1.0, reserve, shape=shape)[0], atol=1e-4)
    rng = np.random.default_rng(5)
    other = [image_prompt(rng, 20, 14), image_prompt(rng, 2, 3), encode_ids(rng.integers(0, 900, 11).tolist(), 0)]
    before = compiles.snapshot()
    episode(fixed_sampler, 1.0, reserve, prompt_list=other, shape=shape)
    assert before.since().count == 0, before.since().summary()


def test_a_first_two_piece_extend_compiles_nothing_new(model):
    """Tool responses written in pieces: an extend whose chunks need two pieces, after extends
    that needed one, compiles no program (the rows' logits are picked from the first piece on)."""
    sampler = Sampler(model, SamplerConfig(prefill_window="capacity", extend_width=8, min_chunk_bucket=64))
    rng = np.random.default_rng(0)
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0)
    _, state = sampler.generate(prompts()[:2], num_samples=2, seed=1, reserve=[(40, 6)] * 2, sampling=sampling,
                                shape=PromptShape(rows=2, width=64, frames_per_row=2))
    for turn, lengths in enumerate(([3, 5, 7, 2], [12, 4, 4, 4])):
        chunks = [encode_ids(rng.integers(0, 900, n).tolist(), int(state.chunk_start[b]))
                  for b, n in enumerate(lengths)]
        before = compiles.snapshot()
        _, state = sampler.extend(state, chunks, seed=3 + turn, sampling=sampling)
        if turn == 1:
            assert before.since().count == 0, before.since().summary()
