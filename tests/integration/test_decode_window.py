"""The decode's bounded read (SamplerConfig.decode_window="used": rows attend only while they
sample, each part read up to its last filled block) against the full read of the cache
("capacity"), and the decode on pages (decode_cache="paged": sampling/pages.py) against the
contiguous one: the same greedy tokens and log-probs over rows of very different lengths, rows
that finish early and rows that sit a turn out; one compiled decode for every fill."""
import dataclasses

import numpy as np
import pytest

from paravt_jax.models.qwen3_vl import init_model, preset
from paravt_jax.sampling import Sampler, SamplerConfig, SamplingParams
from paravt_jax.sampling import decode as decode_program
from paravt_jax.sampling.pages import PagedPlan
from paravt_jax.text.inputs import encode_ids

NEW = 24


@pytest.fixture(scope="module", params=["tiny", "toy"])
def model(request):
    # 16-slot attention blocks: the prefills' blockwise reads span several blocks too
    return init_model(preset(request.param, attention_block=16), seed=5)


def prompts(rng):
    """Prompts of 3, 41 and 150 tokens: each its own prefix length."""
    return [encode_ids(rng.integers(0, 900, n).tolist(), 0) for n in (3, 41, 150)]


def episode(model, window: str, stop_ids=(), samples=2, **config):
    """generate over prompts() (2 samples each, the suffix reserved for a long second turn) and
    one extend with chunks of 2 to 70 tokens, row 1 sitting it out. Returns both outputs."""
    rng = np.random.default_rng(7)
    sampler = Sampler(model, SamplerConfig(decode_window=window, **config))
    # 16-slot decode blocks: the suffix spans several, so the bounded read stops at different
    # blocks for different fills
    sampler.backend = dataclasses.replace(sampler.backend, decode_block=16)
    sampling = SamplingParams(max_new_tokens=NEW, stop_ids=stop_ids)
    first, state = sampler.generate(prompts(rng), num_samples=samples, reserve=[(80, 2 * NEW)], sampling=sampling)
    lengths = [2, 0, 70, 9, 33, 5][:state.num_rows]
    chunks = [None if n == 0 else encode_ids(rng.integers(0, 900, n).tolist(), int(state.chunk_start[b]))
              for b, n in enumerate(lengths)]
    second, _ = sampler.extend(state, chunks, sampling=sampling.with_budget(2 * NEW))
    return (first, second), sampler


def assert_same(got, want):
    for a, b in zip(got, want):
        assert a.tokens == b.tokens
        np.testing.assert_array_equal(a.finished, b.finished)
        for x, y in zip(a.logprobs, b.logprobs):
            np.testing.assert_allclose(x, y, atol=2e-5, rtol=0)


def test_bounded_decode_equals_full_read(model):
    counts = [Sampler(model).compile_counts()["decode"]]
    full, _ = episode(model, "capacity")
    counts.append(Sampler(model).compile_counts()["decode"])
    used, _ = episode(model, "used")
    counts.append(Sampler(model).compile_counts()["decode"])
    assert_same(used, full)
    # as many decode programs as the full read (one per cache shape), whatever the fill
    assert counts[2] - counts[1] == counts[1] - counts[0]


def test_bounded_decode_equals_full_read_with_rows_finishing_early(model):
    """Stop ids taken from the unstopped run so that rows finish at very different steps (and
    the rows that finish stop extending the read)."""
    (first, _), _ = episode(model, "capacity")
    stops = tuple({first.tokens[0][2], first.tokens[3][11]})
    full, _ = episode(model, "capacity", stop_ids=stops)
    used, _ = episode(model, "used", stop_ids=stops)
    assert min(full[0].lengths) < NEW and any(full[0].finished)
    assert_same(used, full)


def test_unknown_decode_window_is_an_error(model):
    with pytest.raises(ValueError, match="decode_window"):
        Sampler(model, SamplerConfig(decode_window="all"))


def test_paged_decode_equals_contiguous(model):
    """The decode on pages of 8 slots (prompts of 3, 41 and 150 tokens: partial last pages, a
    prompt within one page), read in blocks of 2 pages, against the contiguous bounded decode;
    rows finishing early on stop ids; as many compiled decodes as the contiguous one."""
    (first, _), _ = episode(model, "used")
    stops = tuple({first.tokens[0][2], first.tokens[3][11]})
    compiled = []
    for stop_ids in ((), stops):
        decode_program.decode.clear_cache()
        contiguous, _ = episode(model, "used", stop_ids=stop_ids)
        compiled.append(decode_program.decode._cache_size())
        decode_program.decode.clear_cache()
        paged, sampler = episode(model, "used", stop_ids=stop_ids, decode_cache="paged", decode_page=8)
        compiled.append(decode_program.decode._cache_size())
        assert sampler.paged_plan() == PagedPlan(8, "xla", 2)
        assert_same(paged, contiguous)
    assert min(contiguous[0].lengths) < NEW and any(contiguous[0].finished)
    # one compiled decode per cache shape, as the contiguous decode: none per fill or step
    assert compiled[0] == compiled[1] and compiled[2] == compiled[3]


def test_paged_decode_equals_contiguous_in_the_copied_layout(model):
    """shared_prefix=False: one prompt copy per row (G = 1 in the page table)."""
    contiguous, _ = episode(model, "used", shared_prefix=False)
    paged, _ = episode(model, "used", shared_prefix=False, decode_cache="paged", decode_page=8)
    assert_same(paged, contiguous)


def test_paged_decode_config_errors(model):
    with pytest.raises(ValueError, match="decode_cache='pages'"):
        Sampler(model, SamplerConfig(decode_cache="pages"))
    with pytest.raises(ValueError, match="SamplerConfig.decode_kernel='paged_tpu' runs on tpu only"):
        Sampler(model, SamplerConfig(decode_cache="paged", decode_kernel="paged_tpu"))
    with pytest.raises(ValueError, match="decode_window='capacity' must be 'used'"):
        Sampler(model, SamplerConfig(decode_cache="paged", decode_window="capacity"))
    with pytest.raises(ValueError, match="decode_page=0"):
        Sampler(model, SamplerConfig(decode_cache="paged", decode_page=0))


def test_partial_attentions_record_their_cost():
    """The sampler's partial attentions record their analytic cost for the time plan as
    `attend` does: the prefix read once per prompt (the F rows folded into its queries)."""
    import jax.numpy as jnp

    from paravt_jax.models.qwen3_vl import attention as A
    from paravt_jax.models.qwen3_vl.attention_mask import AttentionMask
    from paravt_jax.models.qwen3_vl.fused_attention import compile_platform

    rows, prompts, heads, kv_heads, head_dim, slots = 4, 2, 4, 2, 8, 64
    q = jnp.ones((rows, 1, heads, head_dim))
    keys, values = jnp.ones((prompts, kv_heads, head_dim, slots)), jnp.ones((prompts, kv_heads, slots, head_dim))
    resolved = []
    with compile_platform("cpu", resolved):
        A.shared_prefix_partial(q, keys, values, jnp.ones((prompts, slots), bool), bounded=True)
        A.attend_partial(q, jnp.ones((rows, kv_heads, head_dim, 32)), jnp.ones((rows, kv_heads, 32, head_dim)),
                         AttentionMask.cache(jnp.ones((rows, 32), bool), jnp.array([31])), cache_layout=True)
    shared, own = resolved
    assert (shared.chosen, shared.kind, own.chosen, own.kind) == ("blockwise", "cache", "dense", "cache")
    # 2 prompts x 2 folded queries x 64 slots; keys and values read once per prompt
    assert shared.flops == 4 * prompts * heads * head_dim * 2 * slots
    assert shared.bytes == 4 * head_dim * prompts * (2 * heads * 2 + 2 * kv_heads * slots)
    assert own.flops == 4 * rows * heads * head_dim * 1 * 32


def test_decode_block_sets_the_bounded_reads_block(model):
    assert Sampler(model).backend.decode_block == 512  # the backend's default
    assert Sampler(model, SamplerConfig(decode_block=256)).backend.decode_block == 256
    with pytest.raises(ValueError, match="decode_block=-1"):
        Sampler(model, SamplerConfig(decode_block=-1))
