"""A paged KV cache for the decode's read (issue 48): fixed-size pages in one pool per layer,
a page table per row, the prompt's pages shared by its G rows.

Layout (the one the Pallas paged-attention kernels shipped with jax read, on TPU and GPU):
  pool      keys and values [KV heads, pages, page, head_dim] per layer (`PagedLayer`);
  table     pages [B, W] int32 (row b's tokens in token order, page by page) and lengths [B]
            (row b's tokens; a row that attends to nothing has length 0) (`PageTable`).
The pool holds the P prompts' pages first (`prompt_pages` each), then `row_pages` pages per row.
A row's table starts with its prompt's full pages, shared by the prompt's rows (stored once);
the prompt's last, partly filled page is copied into the row's own pages, followed by the
row's suffix tokens, so that every row's tokens are contiguous and its length bounds its read.
Attention does not depend on the order of the keys (positions are in the rotated keys), so a
row's tokens are stored compacted: the empty slots of the contiguous caches are dropped.

The reads (`paged_read`): `xla`, blockwise over blocks of pages with an online softmax, the
loop bounded by the longest row (every backend); `paged_tpu` / `paged_gpu`, the Pallas paged
attention kernels of `jax.experimental.pallas.ops.{tpu,gpu}.paged_attention`. `decode_kernel`
resolves `auto` for the target platform as `model.attention` resolves splash / cuDNN
(models/qwen3_vl/attention.py), and refuses a kernel off its platform.

The sampler's decode runs on it with SamplerConfig.decode_cache="paged" (decode.py): each
decode call builds the pages from the contiguous caches (`paginate`), and every step writes
(`PagedView.attend`: `write`, then the read; `advance`) and reads them; the prefills and the
cache growth stay contiguous (docs/sampler.md, "The paged read"). `bench/decode.py` measures
it beside the contiguous decode, and one layer's paged read beside `contiguous_read`.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from paravt_jax.models.qwen3_vl.attention import attend_partial, merge_partials, shared_prefix_partial
from paravt_jax.models.qwen3_vl.attention_mask import MASK_VALUE, AttentionMask
from paravt_jax.models.qwen3_vl.fused_attention import target_platform

DECODE_KERNELS = ("auto", "xla", "paged_tpu", "paged_gpu")
# The platform each Pallas paged kernel runs on.
PAGED_KERNEL_PLATFORMS = {"paged_tpu": "tpu", "paged_gpu": "gpu"}


@dataclasses.dataclass(frozen=True)
class PagedLayer:
    """One layer's page pool: keys, values [KV heads, pages, page, head_dim]."""
    keys: jax.Array
    values: jax.Array

    @property
    def page(self) -> int:
        return self.keys.shape[2]


@dataclasses.dataclass(frozen=True)
class PageTable:
    """pages [B, W] int32: row b's pages in token order (entries past its length are never
    read); lengths [B] int32: row b's tokens."""
    pages: jax.Array
    lengths: jax.Array


for _cls in (PagedLayer, PageTable):
    jax.tree_util.register_dataclass(_cls, data_fields=[f.name for f in dataclasses.fields(_cls)], meta_fields=[])


# ----------------------------------------------------------------------------- layout
def pages_for(slots: int, page: int) -> int:
    """Pages that hold `slots` tokens."""
    return -(-slots // page)


def row_pages(suffix_slots: int, page: int) -> int:
    """Own pages of a row: its prompt's partial last page (at most page - 1 tokens) and its suffix."""
    return pages_for(suffix_slots + page - 1, page)


def compact_order(valid: jax.Array) -> jax.Array:
    """[B, S] slot indices, the valid slots first (each row in slot order)."""
    return jnp.argsort(~valid, axis=1, stable=True).astype(jnp.int32)


def page_table(prompt_lengths: jax.Array, suffix_lengths: jax.Array, page: int, prompt_pages: int,
               own_pages: int) -> PageTable:
    """The table of B = P * G rows (row b reads prompt b // G): the prompt's full pages (pool
    pages p * prompt_pages + i), then the row's own pages (P * prompt_pages + b * own_pages + j)."""
    prompts, rows = prompt_lengths.shape[0], suffix_lengths.shape[0]
    prompt = jnp.repeat(prompt_lengths, rows // prompts)  # [B]
    full = prompt // page
    column = jnp.arange(prompt_pages + own_pages, dtype=jnp.int32)[None]
    shared = (jnp.arange(rows) // (rows // prompts))[:, None] * prompt_pages + column
    own = prompts * prompt_pages + jnp.arange(rows)[:, None] * own_pages + jnp.minimum(column - full[:, None],
                                                                                       own_pages - 1)
    pages = jnp.where(column < full[:, None], shared, own).astype(jnp.int32)
    return PageTable(pages, (prompt + suffix_lengths).astype(jnp.int32))


def paginate_layer(prefix_keys, prefix_values, prefix_valid, keys, values, valid, page: int) -> PagedLayer:
    """One layer of the sampler's contiguous caches (prefix keys [P, KV, hd, Sp], values
    [P, KV, Sp, hd], valid [P, Sp]; suffix keys [B, KV, hd, S], values [B, KV, S, hd], valid
    [B, S]) as a page pool (`page_table` gives its table). Sp must be a multiple of `page`."""
    prompts, kv_heads, head_dim, prompt_slots = prefix_keys.shape
    rows, _, _, slots = keys.shape
    if prompt_slots % page:
        raise ValueError(f"paginate: prompt slots {prompt_slots} are not a multiple of the page {page}")
    own = row_pages(slots, page)
    p_order, s_order = compact_order(prefix_valid), compact_order(valid)
    # the prompts compacted: [KV, P, Sp, hd] -> [KV, P * Sp / page, page, hd]
    p_keys = jnp.take_along_axis(prefix_keys, p_order[:, None, None, :], axis=3).transpose(1, 0, 3, 2)
    p_values = jnp.take_along_axis(prefix_values, p_order[:, None, :, None], axis=2).transpose(1, 0, 2, 3)
    # each row's own tokens: its prompt's tail (from its last full page on), then its suffix
    prompt = jnp.repeat(prefix_valid.sum(1), rows // prompts).astype(jnp.int32)
    start = (prompt // page) * page
    token = jnp.arange(own * page, dtype=jnp.int32)[None]
    from_prompt = token < (prompt - start)[:, None]
    p_slot = jnp.clip(start[:, None] + token, 0, prompt_slots - 1)
    s_slot = jnp.take_along_axis(s_order, jnp.clip(token - (prompt - start)[:, None], 0, slots - 1), axis=1)
    row_prompt = jnp.arange(rows) // (rows // prompts)
    # p_keys / p_values are [KV, P, Sp, hd]; suffix keys [B, KV, hd, S], values [B, KV, S, hd]
    tail_k = p_keys[:, row_prompt[:, None], p_slot]  # [KV, B, T, hd]
    tail_v = p_values[:, row_prompt[:, None], p_slot]
    own_k = jnp.take_along_axis(keys, s_slot[:, None, None, :], axis=3).transpose(1, 0, 3, 2)
    own_v = jnp.take_along_axis(values, s_slot[:, None, :, None], axis=2).transpose(1, 0, 2, 3)
    mine_k = jnp.where(from_prompt[None, :, :, None], tail_k, own_k)
    mine_v = jnp.where(from_prompt[None, :, :, None], tail_v, own_v)

    def pool(shared, mine):
        return jnp.concatenate([shared.reshape(kv_heads, -1, page, head_dim),
                                mine.astype(shared.dtype).reshape(kv_heads, -1, page, head_dim)], axis=1)

    return PagedLayer(pool(p_keys, mine_k), pool(p_values, mine_v))


def paginate(prefix_valid, valid, page: int, layers) -> tuple[tuple[PagedLayer, ...], PageTable]:
    """The paged form of the sampler's caches: layers = [(prefix keys, prefix values, suffix
    keys, suffix values)] per layer (shapes as `paginate_layer`; the prompts padded to whole
    pages), the table of their rows."""
    extra = -prefix_valid.shape[1] % page
    if extra:
        prefix_valid = jnp.pad(prefix_valid, ((0, 0), (0, extra)))
        layers = [(jnp.pad(pk, ((0, 0), (0, 0), (0, 0), (0, extra))), jnp.pad(pv, ((0, 0), (0, 0), (0, extra), (0, 0))),
                   k, v) for pk, pv, k, v in layers]
    pools = tuple(paginate_layer(pk, pv, prefix_valid, k, v, valid, page) for pk, pv, k, v in layers)
    table = page_table(prefix_valid.sum(1).astype(jnp.int32), valid.sum(1).astype(jnp.int32), page,
                       prefix_valid.shape[1] // page, row_pages(valid.shape[1], page))
    return pools, table


def write(layer: PagedLayer, table: PageTable, k_new: jax.Array, v_new: jax.Array, active: jax.Array) -> PagedLayer:
    """The pool with row b's new key and value ([B, KV, hd]) at its token lengths[b], for the
    rows in `active` [B] (the others write nothing). A row never writes into a shared page: its
    own pages begin at its prompt's last full page."""
    page = layer.page
    slot = jnp.take_along_axis(table.pages, (table.lengths // page)[:, None], axis=1)[:, 0]
    slot = jnp.where(active, slot, layer.keys.shape[1])  # out of range: dropped
    offset = table.lengths % page
    keys = layer.keys.at[:, slot, offset].set(k_new.transpose(1, 0, 2).astype(layer.keys.dtype), mode="drop")
    values = layer.values.at[:, slot, offset].set(v_new.transpose(1, 0, 2).astype(layer.values.dtype), mode="drop")
    return PagedLayer(keys, values)


def advance(table: PageTable, active: jax.Array) -> PageTable:
    """The table after `write`: one more token for the active rows."""
    return PageTable(table.pages, table.lengths + active.astype(jnp.int32))


def attending(table: PageTable, active: jax.Array) -> PageTable:
    """The table read by a decode step: rows not in `active` [B] (finished, or sitting the turn
    out) at length 0, so they attend to nothing and do not extend the read."""
    return PageTable(table.pages, jnp.where(active, table.lengths, 0))


# ----------------------------------------------------------------------------- reads
def xla_read(q: jax.Array, layer: PagedLayer, table: PageTable, block_pages: int = 8) -> tuple[jax.Array, jax.Array]:
    """q [B, H, hd] against each row's first lengths[b] tokens -> (out [B, H, hd] float32, lse
    [B, H] float32; zeros and MASK_VALUE for a row of length 0). Blockwise over blocks of
    `block_pages` table entries, each gathered from the pool, with an online softmax; the loop
    stops after the block holding the longest row's last token (a traced bound)."""
    rows, heads, head_dim = q.shape
    kv_heads, _, page, _ = layer.keys.shape
    groups = heads // kv_heads
    width = table.pages.shape[1]
    block_pages = min(block_pages, width)
    pages = jnp.pad(table.pages, ((0, 0), (0, -width % block_pages)))
    block = block_pages * page
    qg = q.reshape(rows, kv_heads, groups, head_dim)
    scale = head_dim**-0.5
    count = (jnp.max(table.lengths) + block - 1) // block

    def body(carry):
        j, m, l, acc = carry
        index = jax.lax.dynamic_slice_in_dim(pages, j * block_pages, block_pages, 1)  # [B, bp]
        k = layer.keys[:, index].reshape(kv_heads, rows, block, head_dim)
        v = layer.values[:, index].reshape(kv_heads, rows, block, head_dim)
        s = jnp.einsum("bkgd,kbtd->bkgt", qg, k.astype(q.dtype), preferred_element_type=jnp.float32) * scale
        allowed = (j * block + jnp.arange(block))[None] < table.lengths[:, None]  # [B, block]
        allowed = allowed[:, None, None]
        s = jnp.where(allowed, s, MASK_VALUE)
        m_new = jnp.maximum(m, jnp.max(s, -1))
        p = jnp.where(allowed, jnp.exp(s - m_new[..., None]), 0.0)
        correction = jnp.exp(m - m_new)
        acc = acc * correction[..., None] + jnp.einsum("bkgt,kbtd->bkgd", p.astype(v.dtype), v,
                                                       preferred_element_type=jnp.float32)
        return j + 1, m_new, l * correction + jnp.sum(p, -1), acc

    shape = (rows, kv_heads, groups)
    init = (jnp.int32(0), jnp.full(shape, MASK_VALUE, jnp.float32), jnp.zeros(shape, jnp.float32),
            jnp.zeros(shape + (head_dim,), jnp.float32))
    _, m, l, acc = jax.lax.while_loop(lambda c: c[0] < count, body, init)
    seen = l > 0
    out = jnp.where(seen[..., None], acc / jnp.where(seen, l, 1.0)[..., None], 0.0)
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), MASK_VALUE)
    return out.reshape(rows, heads, head_dim), lse.reshape(rows, heads)


def kernel_read(q: jax.Array, layer: PagedLayer, table: PageTable, kernel: str, block_pages: int = 8,
                interpret: bool = False) -> jax.Array:
    """q [B, H, hd] through a Pallas paged-attention kernel ("paged_tpu" or "paged_gpu") ->
    [B, H, hd] float32, zeros for a row of length 0. `interpret`: the kernel in Pallas
    interpret mode (tests on CPU)."""
    scaled = (q * q.shape[-1] ** -0.5).astype(layer.keys.dtype)
    block_pages = min(block_pages, table.pages.shape[1])
    # both kernels step through whole blocks of table entries: pad the table with page 0
    # (never read past a row's length)
    table = PageTable(jnp.pad(table.pages, ((0, 0), (0, -table.pages.shape[1] % block_pages))), table.lengths)
    if kernel == "paged_tpu":
        from jax.experimental.pallas import tpu as pltpu
        from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

        call = functools.partial(paged_attention, scaled, layer.keys, layer.values, table.lengths, table.pages,
                                 pages_per_compute_block=block_pages)
        if interpret:
            with pltpu.force_tpu_interpret_mode():
                out = call()
        else:
            out = call()
    elif kernel == "paged_gpu":
        from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention

        out = paged_attention(scaled, layer.keys, layer.values, table.pages, table.lengths,
                              pages_per_compute_block=block_pages, k_splits=1, interpret=interpret)
    else:
        raise ValueError(f"kernel_read: kernel={kernel!r}: expected one of {tuple(PAGED_KERNEL_PLATFORMS)}")
    return jnp.where((table.lengths > 0)[:, None, None], out.astype(jnp.float32), 0.0)


def decode_kernel(requested: str, field: str = "decode_kernel") -> str:
    """The read that runs for `requested` on the target platform (fused_attention.target_platform):
    `auto` = the platform's Pallas paged kernel on TPU and GPU, `xla` elsewhere. An explicit
    kernel off its platform is an error naming `field` and the value, never a silent substitute."""
    if requested not in DECODE_KERNELS:
        raise ValueError(f"{field}={requested!r}: expected one of {DECODE_KERNELS}")
    platform = target_platform()
    if requested in PAGED_KERNEL_PLATFORMS and PAGED_KERNEL_PLATFORMS[requested] != platform:
        raise ValueError(f"{field}={requested!r} runs on {PAGED_KERNEL_PLATFORMS[requested]} only; this program "
                         f"is compiled for {platform}: use 'auto' or 'xla'")
    if requested == "auto":
        return next((k for k, p in PAGED_KERNEL_PLATFORMS.items() if p == platform), "xla")
    return requested


def paged_read(q: jax.Array, layer: PagedLayer, table: PageTable, kernel: str = "auto",
               block_pages: int = 8) -> jax.Array:
    """Decode attention of q [B, H, hd] over the paged cache -> [B, H, hd] float32, through the
    read `decode_kernel(kernel)` resolves to."""
    chosen = decode_kernel(kernel)
    if chosen == "xla":
        return xla_read(q, layer, table, block_pages)[0]
    return kernel_read(q, layer, table, chosen, block_pages)


@dataclasses.dataclass(frozen=True)
class PagedPlan:
    """The static choices of a decode on pages (SamplerConfig.decode_cache="paged"): `page` slots
    per page, the read `kernel` (resolved: "xla", "paged_tpu" or "paged_gpu") and the table
    entries per block of the read."""
    page: int
    kernel: str
    block_pages: int


@dataclasses.dataclass(frozen=True)
class PagedView:
    """What one decode step's cached forward reads and writes on pages (CacheView.paged): the
    pools (one per layer), the table before the step, the rows that attend."""
    pools: tuple[PagedLayer, ...]
    table: PageTable
    active: jax.Array
    plan: PagedPlan

    def attend(self, layer: int, q: jax.Array, k_new: jax.Array, v_new: jax.Array) -> tuple[jax.Array, PagedLayer]:
        """Writes the step's key and value (k_new, v_new [B, 1, KV, hd]) into layer `layer`'s
        pool at each attending row's length, then reads q [B, 1, H, hd] against the row's
        tokens, the new one included. -> (out [B, 1, H, hd] float32, the pool)."""
        pool = write(self.pools[layer], self.table, k_new[:, 0], v_new[:, 0], self.active)
        table = attending(advance(self.table, self.active), self.active)
        return paged_read(q[:, 0], pool, table, self.plan.kernel, self.plan.block_pages)[:, None], pool


def contiguous_read(q: jax.Array, prefix_keys, prefix_values, prefix_valid, keys, values, valid, active,
                    block: int) -> jax.Array:
    """The sampler's decode read of one layer on today's contiguous caches (models/qwen3_vl/text.py
    TextDecoder.attention with a prefix and decode_window="used"): q [B, H, hd] against its
    prompt's prefix and its own suffix, two partial attentions merged; the rows not in `active`
    attend to nothing. -> [B, H, hd] float32 (the reference of the paged read)."""
    q = q[:, None]
    mask = AttentionMask.cache(valid, jnp.array([valid.shape[1] - 1]))
    mask = dataclasses.replace(mask, query_segments=active[:, None].astype(jnp.int32))
    own = attend_partial(q, keys, values, mask, "auto", cache_layout=True, block=block, bounded=True)
    shared = shared_prefix_partial(q, prefix_keys, prefix_values, prefix_valid, "auto", block, queries=active)
    out = merge_partials(shared, own)[:, 0]
    return jnp.where(active[:, None, None], out, 0.0)
