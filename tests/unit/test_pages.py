"""The paged KV cache (paravt_jax/sampling/pages.py): the page layout of the sampler's
contiguous caches (the prompt's full pages shared by its rows), its XLA read against today's
contiguous read, the Pallas paged kernels (TPU and GPU, interpret mode on CPU) against both,
a decode step's write, and the kernel resolution."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paravt_jax.models.qwen3_vl.attention_mask import MASK_VALUE
from paravt_jax.models.qwen3_vl.fused_attention import compile_platform
from paravt_jax.sampling import pages as PG

PROMPTS, SAMPLES, KV, HEADS, HEAD_DIM, PROMPT_SLOTS, SLOTS, PAGE = 2, 3, 2, 4, 64, 32, 40, 8
ROWS = PROMPTS * SAMPLES


def caches(seed=0):
    """Random contiguous caches as the sampler holds them: prompts of 13 and 24 tokens (24: whole
    pages, no tail to copy), right-padded; suffixes with holes (extend padding, turns sat out),
    one row with an empty suffix. Values rounded to bfloat16 (the TPU kernel's interpret mode
    multiplies in bfloat16, as the chip does at default precision)."""
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return jnp.asarray(rng.normal(size=shape), jnp.bfloat16).astype(jnp.float32)

    prefix_valid = np.zeros((PROMPTS, PROMPT_SLOTS), bool)
    prefix_valid[0, :13] = prefix_valid[1, :24] = True
    valid = rng.random((ROWS, SLOTS)) < 0.6
    valid[2] = False
    valid[4, 30:] = False
    return dict(prefix_keys=normal(PROMPTS, KV, HEAD_DIM, PROMPT_SLOTS),
                prefix_values=normal(PROMPTS, KV, PROMPT_SLOTS, HEAD_DIM), prefix_valid=jnp.asarray(prefix_valid),
                keys=normal(ROWS, KV, HEAD_DIM, SLOTS), values=normal(ROWS, KV, SLOTS, HEAD_DIM),
                valid=jnp.asarray(valid)), normal(ROWS, HEADS, HEAD_DIM)


def paged(c, page=PAGE):
    pools, table = PG.paginate(c["prefix_valid"], c["valid"], page,
                               [(c["prefix_keys"], c["prefix_values"], c["keys"], c["values"])])
    return pools[0], table


ACTIVE = jnp.array([True, True, True, False, True, True])  # row 3 finished; row 2 has no suffix


def test_page_table_shares_the_prompt_pages():
    c, _ = caches()
    layer, table = paged(c)
    pages, lengths = np.asarray(table.pages), np.asarray(table.lengths)
    prompt_pages = PROMPT_SLOTS // PAGE
    np.testing.assert_array_equal(lengths, np.repeat([13, 24], SAMPLES) + np.asarray(c["valid"]).sum(1))
    for p, full in enumerate((13 // PAGE, 24 // PAGE)):
        rows = pages[p * SAMPLES:(p + 1) * SAMPLES]
        np.testing.assert_array_equal(rows[:, :full], np.broadcast_to(p * prompt_pages + np.arange(full),
                                                                      (SAMPLES, full)))
    own = [set(pages[b, 13 // PAGE if b < SAMPLES else 24 // PAGE:].tolist()) for b in range(ROWS)]
    assert all(min(o) >= PROMPTS * prompt_pages for o in own)  # no row writes into a prompt page
    assert all(not (own[a] & own[b]) for a in range(ROWS) for b in range(a))
    assert layer.keys.shape == (KV, PROMPTS * prompt_pages + ROWS * PG.row_pages(SLOTS, PAGE), PAGE, HEAD_DIM)


@pytest.mark.parametrize("block_pages, page", [(1, PAGE), (3, PAGE), (8, PAGE), (2, 12)])
def test_xla_read_equals_contiguous_read(block_pages, page):
    """Pages of 12: the 32 prompt slots padded to 3 pages."""
    c, q = caches()
    layer, table = paged(c, page)
    want = PG.contiguous_read(q, **c, active=ACTIVE, block=16)
    out, lse = PG.xla_read(q, layer, PG.attending(table, ACTIVE), block_pages)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=1e-5)
    assert not np.asarray(out)[3].any() and np.all(np.asarray(lse)[3] == MASK_VALUE)


def test_write_then_read_equals_the_contiguous_cache_written():
    """A decode step's write into the pages (`write`, `advance`) holds what the contiguous cache
    holds once the step's key and value are written at the suffix's write slot."""
    c, q = caches()
    rng = np.random.default_rng(3)
    k_new = jnp.asarray(rng.normal(size=(ROWS, KV, HEAD_DIM)), jnp.float32)
    v_new = jnp.asarray(rng.normal(size=(ROWS, KV, HEAD_DIM)), jnp.float32)
    slot = SLOTS - 1  # the contiguous sampler writes every row at one shared, empty slot
    c["valid"] = c["valid"].at[:, slot].set(False)
    layer, table = paged(c)
    layer = PG.write(layer, table, k_new, v_new, ACTIVE)
    table = PG.advance(table, ACTIVE)
    written = dict(c, keys=c["keys"].at[:, :, :, slot].set(k_new), values=c["values"].at[:, :, slot].set(v_new),
                   valid=c["valid"].at[:, slot].set(ACTIVE))
    want = PG.contiguous_read(q, **written, active=ACTIVE, block=16)
    np.testing.assert_allclose(np.asarray(PG.xla_read(q, layer, PG.attending(table, ACTIVE))[0]), np.asarray(want),
                               atol=1e-5)


@pytest.mark.parametrize("kernel", ["paged_tpu", "paged_gpu"])
def test_pallas_kernels_equal_the_xla_read(kernel):
    """The Pallas paged kernels in interpret mode: ragged lengths, a shared prompt, a row with no
    suffix, a finished row (length 0: zeros)."""
    c, q = caches()
    layer, table = paged(c)
    table = PG.attending(table, ACTIVE)
    got = np.asarray(PG.kernel_read(q, layer, table, kernel, block_pages=2, interpret=True))
    np.testing.assert_allclose(got, np.asarray(PG.xla_read(q, layer, table)[0]), atol=1e-5)
    np.testing.assert_allclose(got, np.asarray(PG.contiguous_read(q, **c, active=ACTIVE, block=16)), atol=1e-5)
    assert not got[3].any()


def test_decode_kernel_resolution():
    assert jax.default_backend() != "cpu" or PG.decode_kernel("auto") == "xla"
    for platform, kernel in (("tpu", "paged_tpu"), ("gpu", "paged_gpu"), ("cpu", "xla")):
        with compile_platform(platform):
            assert PG.decode_kernel("auto") == kernel
            assert PG.decode_kernel("xla") == "xla"
    with compile_platform("cpu"), pytest.raises(ValueError, match="decode_kernel='paged_tpu' runs on tpu only"):
        PG.decode_kernel("paged_tpu")
    with compile_platform("tpu"), pytest.raises(ValueError, match="decode_kernel='paged_gpu' runs on gpu only"):
        PG.decode_kernel("paged_gpu")
    with pytest.raises(ValueError, match="decode_kernel='pallas'"):
        PG.decode_kernel("pallas")
    c, q = caches()
    layer, table = paged(c)
    with compile_platform("cpu"):  # auto on CPU: the XLA read
        np.testing.assert_array_equal(np.asarray(PG.paged_read(q, layer, table)),
                                      np.asarray(PG.xla_read(q, layer, table)[0]))


def test_unsharded_only_settings_are_refused_on_a_mesh_naming_their_fields():
    """One rule, used by the Sampler and by `run`/`train` before SFT (cli/assembly.py)."""
    from paravt_jax.config import ConfigValueError
    from paravt_jax.sampling.sampler import SamplerConfig

    both = SamplerConfig(prompt_packing=True, decode_cache="paged")
    assert both.unsharded_only() == ("prompt_packing=True", "decode_cache='paged'")
    assert SamplerConfig().unsharded_only() == ()
    both.check_devices(1)
    SamplerConfig().check_devices(8)
    expected = r"rl\.sampler\.prompt_packing=True and rl\.sampler\.decode_cache='paged' run unsharded only .* 4 devices"
    with pytest.raises(ConfigValueError, match=expected):
        both.check_devices(4, prefix="rl.sampler.")
    with pytest.raises(ConfigValueError, match=r"^SamplerConfig\.decode_cache='paged' run unsharded only"):
        SamplerConfig(decode_cache="paged").check_devices(2)
