"""Sequences -> padded training arrays, and micro-batches with their own vision inputs.

Task-agnostic: a sequence is a `ModelInputs` (tokens, positions, loss mask, vision). What a
loss needs beyond that (RL: advantages, behaviour and proximal log-probs) travels as named
per-token EXTRAS, [N, T] arrays aligned with the tokens: extra[b, t] belongs to token t. Log-
probs follow the sampler's convention: logprob[b, t] is log p(token t | tokens < t), 0 at t = 0.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from paravt_jax.infra.buckets import bucket
from paravt_jax.models.qwen3_vl.rope import IMAGE, VIDEO
from paravt_jax.models.qwen3_vl.vision import frame_buckets, frame_counts, pad_frames_to, vision_layout
from paravt_jax.text.inputs import ModelInputs, collate_vision_placed

# Fields of every batch; an extra may not reuse one of these names.
TOKEN_FIELDS = ("input_ids", "attention_mask", "position_ids", "loss_mask", "visual_index",
                "pixel_values", "vision_meta", "segment_ids", "visual_embeds", "visual_deepstack", "parent_ids")


@dataclasses.dataclass(frozen=True)
class VisionFeatures:
    """What a frozen vision tower makes of one sequence's frames, kept on the host: embeds
    [n, D] and DeepStack features [n_ds, n, D], one row per vision token of the sequence, its
    image tokens first and then its video tokens (the order `collate_vision_placed` numbers
    them in)."""
    embeds: np.ndarray
    deepstack: np.ndarray

    @property
    def tokens(self) -> int:
        return int(self.embeds.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.embeds.nbytes + self.deepstack.nbytes)


@dataclasses.dataclass(frozen=True)
class Packed:
    """Right-padded [N, T] numpy arrays for a list of sequences; extras: name -> [N, T]."""
    sequences: tuple[ModelInputs, ...]
    input_ids: np.ndarray
    attention_mask: np.ndarray
    position_ids: np.ndarray  # [3, N, T]
    loss_mask: np.ndarray
    extras: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class SharedPrompts:
    """Sequences laid out with each prompt stored once for the consecutive sequences that begin
    with it (the samples of one prompt in RL): per group of G, the prompt but its last token
    (the head) and then each member's rest from that token on (its tail), whose tokens attend to
    the head as to their own earlier tokens (`parents`, segment ids in the packed rows:
    AttentionMask.query_parents). Each member keeps its own copy of the prompt's last token, so
    that its first generated token is scored within its own tail; every token keeps its
    positions. The same attention, positions and loss as the sequences packed whole, over
    P + sum(L_i - P) tokens instead of sum(L_i) and the prompt's frames encoded once.

    sequences: the layout's sequences (a group's head, then its tails; an unshared sequence
    whole); sources[j]: the original sequences layout sequence j holds tokens [starts[j],
    stops[j]) of (every member for a head); units: the layout sequences that go into one row,
    in order; parents[j]: the head a tail attends to, or -1."""
    sequences: tuple[ModelInputs, ...]
    sources: tuple[tuple[int, ...], ...]
    starts: tuple[int, ...]
    stops: tuple[int, ...]
    units: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...]
    count: int  # original sequences

    @property
    def shared_tokens(self) -> int:
        """Tokens the layout saves: each head's length once per member beyond the first."""
        return sum((len(src) - 1) * (stop - start) for src, start, stop in zip(self.sources, self.starts, self.stops))

    def pieces(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One [L_i] array per original sequence -> one array per layout sequence."""
        if len(arrays) != self.count:
            raise ValueError(f"{len(arrays)} arrays for {self.count} sequences")
        return [np.asarray(arrays[src[0]])[start:stop]
                for src, start, stop in zip(self.sources, self.starts, self.stops)]

    def derive(self, array: np.ndarray, width: int) -> np.ndarray:
        """A per-token [N, T] array of the original sequences -> [N', width] of the layout's."""
        out = np.zeros((len(self.sequences), width), array.dtype)
        for j, piece in enumerate(self.pieces(list(array))):
            out[j, :len(piece)] = piece
        return out

    def restore(self, array: np.ndarray, width: int) -> np.ndarray:
        """The inverse of `derive`: [N', T'] -> [N, width], a head's values in every member."""
        out = np.zeros((self.count, width), np.asarray(array).dtype)
        for j, (src, start, stop) in enumerate(zip(self.sources, self.starts, self.stops)):
            for i in src:
                out[i, start:stop] = array[j, :stop - start]
        return out


def _same_prompt(a: ModelInputs, b: ModelInputs, length: int) -> bool:
    return (b.length > length and np.array_equal(a.input_ids[:length], b.input_ids[:length])
            and np.array_equal(a.position_ids[:, :length], b.position_ids[:, :length])
            and np.array_equal(a.mm_token_type_ids[:length], b.mm_token_type_ids[:length])
            and not b.loss_mask[:length].any())


def share_prompts(sequences: Sequence[ModelInputs], max_length: int = 0) -> SharedPrompts:
    """The `SharedPrompts` layout of `sequences`: each run of consecutive sequences whose tokens
    before the first one's first loss token (its prompt) are the same, with the same positions
    and frames, and none of them trained, shares that prompt but its last token. A run of one,
    a sequence without loss tokens, or a group longer than `max_length` tokens laid out (0: no
    bound) stays whole."""
    out = dict(sequences=[], sources=[], starts=[], stops=[], units=[], parents=[])

    def add(seq, src, start, stop, parent):
        out["sequences"].append(seq)
        out["sources"].append(tuple(src))
        out["starts"].append(start)
        out["stops"].append(stop)
        out["parents"].append(parent)
        return len(out["sequences"]) - 1

    i, n = 0, len(sequences)
    while i < n:
        first = sequences[i]
        trained = np.nonzero(first.loss_mask)[0]
        prompt = int(trained[0]) if len(trained) else 0
        j = i + 1
        while prompt > 1 and j < n and _same_prompt(first, sequences[j], prompt):
            j += 1
        group = list(range(i, j))
        head_length = prompt - 1
        laid = head_length + sum(sequences[g].length - head_length for g in group)
        heads = tails = None
        if len(group) > 1 and (not max_length or laid <= max_length):
            try:
                heads = [sequences[g].slice(0, head_length) for g in group]
                tails = [sequences[g].slice(head_length, sequences[g].length) for g in group]
            except ValueError:  # the cut falls inside an image or video: packed whole
                heads = None
            if heads is not None and not all(
                    np.array_equal(h.pixel_values, heads[0].pixel_values)
                    and np.array_equal(h.pixel_values_videos, heads[0].pixel_values_videos) for h in heads[1:]):
                heads = None
        if heads is None:
            for g in group:
                out["units"].append((add(sequences[g], (g,), 0, sequences[g].length, -1),))
        else:
            head = add(heads[0], group, 0, head_length, -1)
            out["units"].append((head, *(add(tail, (g,), head_length, sequences[g].length, head)
                                         for g, tail in zip(group, tails))))
        i = j
    return SharedPrompts(tuple(out["sequences"]), tuple(out["sources"]), tuple(out["starts"]), tuple(out["stops"]),
                         tuple(out["units"]), tuple(out["parents"]), n)


def _check_extra_names(names) -> None:
    clash = sorted(set(names) & set(TOKEN_FIELDS))
    if clash:
        raise ValueError(f"per-token extras {clash} reuse batch field names {TOKEN_FIELDS}")


def pack(sequences: Sequence[ModelInputs], extras: Mapping[str, Sequence[np.ndarray]] | None = None,
         min_length: int = 16, multiple: int = 256, width: int = 0) -> Packed:
    """Right-pads to a bucketed length so the train step compiles once per bucket; to `width`
    when it is set and the longest sequence fits (one shape for every batch).

    extras: name -> one [L_b] array per sequence (its own length), padded with zeros into an
    [N, T] array of the arrays' common dtype."""
    extras = dict(extras or {})
    _check_extra_names(extras)
    n = len(sequences)
    longest = max(s.length for s in sequences)
    width = width if longest <= width else bucket(longest, min_length, multiple)
    ids = np.zeros((n, width), np.int32)
    mask = np.zeros((n, width), np.int32)
    positions = np.zeros((3, n, width), np.int32)
    loss = np.zeros((n, width), np.int32)
    padded = {}
    for name, arrays in extras.items():
        if len(arrays) != n:
            raise ValueError(f"extra {name!r}: {len(arrays)} arrays for {n} sequences")
        padded[name] = np.zeros((n, width), np.result_type(*[np.asarray(a).dtype for a in arrays]))
    for b, s in enumerate(sequences):
        length = s.length
        ids[b, :length], mask[b, :length], positions[:, b, :length], loss[b, :length] = (
            s.input_ids, 1, s.position_ids, s.loss_mask)
        loss[b, 0] = 0  # the first token has no prediction
        for name, arrays in extras.items():
            padded[name][b, :length] = arrays[b]
    return Packed(tuple(sequences), ids, mask, positions, loss, padded)


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """One micro-batch on the host. Token arrays [B, T] (position_ids [3, B, T]); vision
    inputs for its own rows; extras: name -> [B, T] per-token arrays the loss reads."""
    input_ids: np.ndarray
    attention_mask: np.ndarray
    position_ids: np.ndarray
    loss_mask: np.ndarray
    visual_index: np.ndarray | None
    pixel_values: np.ndarray | None
    vision_meta: tuple | None
    extras: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    # packed rows: [B, T] int32, the sequence each token belongs to (1, 2, ... per row, 0 =
    # padding); None when each row holds one sequence (attention_mask then says which tokens
    # are real)
    segment_ids: np.ndarray | None = None
    # a frozen tower's features in place of pixel_values and vision_meta (shapes as the tower
    # would give them: [Nv, D] and [n_ds, Nv, D], or with the vision shards' leading S axis:
    # [S, Nv, D] and [n_ds, S, Nv, D]); None when the step encodes the pixels itself
    visual_embeds: np.ndarray | None = None
    visual_deepstack: np.ndarray | None = None
    # packed rows with shared prompts: [B, T] int32, the segment whose earlier tokens each token
    # also sees (its prompt, stored once; 0 = none); None when no sequence shares a prompt
    parent_ids: np.ndarray | None = None

    def with_extras(self, **extras) -> TrainBatch:
        """A copy with these extras added or replaced."""
        _check_extra_names(extras)
        return dataclasses.replace(self, extras={**self.extras, **extras})

    def device_tree(self) -> dict:
        """The flat dict the jitted step receives: the batch fields and the extras side by side."""
        # Not dataclasses.asdict: it deep-copies every array (pixels included) on each call.
        tree = {name: getattr(self, name) for name in TOKEN_FIELDS}
        tree.update(self.extras)
        return tree


def micro_batches(packed: Packed, num_micro: int, vision_config,
                  extras: Mapping[str, np.ndarray] | None = None, vision_shards: int = 1) -> list[TrainBatch]:
    """Splits rows into `num_micro` equal micro-batches (rows must divide evenly). extras:
    name -> [N, T] per-token arrays for the loss (not `packed.extras` implicitly: the caller
    chooses what goes to the device), split by rows like the tokens. vision_shards: see
    `planned_micro_batches`."""
    plan = plan_rows([s.length for s in packed.sequences], packed.input_ids.shape[1], num_micro)
    return planned_micro_batches(packed, plan, vision_config, extras, vision_shards=vision_shards)


@dataclasses.dataclass(frozen=True)
class MicroBatchPlan:
    """Where every sequence of a `Packed` goes: micro-batch, row and offset.

    placements[m]: one (row, offset, sequence index) per sequence of micro-batch m; rows[m]
    and width: the micro-batch's [rows, width] shape; lengths: tokens per sequence.
    `packed`: rows may hold several sequences (segment ids); otherwise one sequence per row at
    offset 0. parents[i] (packed rows): the sequence whose tokens sequence i also attends to,
    placed before it in its row (a shared prompt, `SharedPrompts`), or -1; empty: none."""
    placements: tuple[tuple[tuple[int, int, int], ...], ...]
    rows: tuple[int, ...]
    width: int
    lengths: tuple[int, ...]
    packed: bool
    parents: tuple[int, ...] = ()

    def split(self, array: np.ndarray) -> list[np.ndarray]:
        """A per-token [N, T] array (the Packed layout) -> one [rows, width] array per micro-batch."""
        out = []
        for placements, rows in zip(self.placements, self.rows):
            part = np.zeros((rows, self.width), array.dtype)
            for row, start, index in placements:
                part[row, start:start + self.lengths[index]] = array[index, :self.lengths[index]]
            out.append(part)
        return out

    def merge(self, parts: Sequence[np.ndarray], width: int) -> np.ndarray:
        """The inverse of `split`: per-micro-batch [rows, width] arrays -> [N, width] (zeros
        after each sequence's tokens)."""
        out = np.zeros((len(self.lengths), width), np.asarray(parts[0]).dtype)
        for placements, part in zip(self.placements, parts):
            part = np.asarray(part)
            for row, start, index in placements:
                out[index, :self.lengths[index]] = part[row, start:start + self.lengths[index]]
        return out

    def padding_fraction(self) -> float:
        """Padding tokens / all tokens of the micro-batches."""
        return 1.0 - sum(self.lengths) / max(sum(self.rows) * self.width, 1)


def plan_rows(lengths: Sequence[int], width: int, num_micro: int) -> MicroBatchPlan:
    """One sequence per row, rows split into `num_micro` equal micro-batches."""
    n = len(lengths)
    if n % num_micro:
        raise ValueError(f"{n} rows do not split into {num_micro} micro-batches")
    size = n // num_micro
    return MicroBatchPlan(tuple(tuple((i - m * size, 0, i) for i in range(m * size, (m + 1) * size))
                                for m in range(num_micro)), (size,) * num_micro, width, tuple(lengths),
                          packed=False)


def plan_token_budget(lengths: Sequence[int], max_tokens: int, min_length: int = 16,
                      multiple: int = 256, width: int | None = None, row_multiple: int = 1,
                      full_rows: bool = False, units: Sequence[Sequence[int]] | None = None,
                      parents: Sequence[int] = ()) -> MicroBatchPlan:
    """Sequences packed into rows (first fit, longest first) of one bucketed width (or the
    given `width`, at least the longest sequence), the rows grouped into micro-batches of at
    most `max_tokens` tokens (rows x width; a row longer than the budget is a micro-batch of
    its own). A sequence longer than every other row's free space sits alone in its row.

    row_multiple: every micro-batch gets a multiple of this many rows (the devices its batch
    axis is split over, data x fsdp: a row count they do not divide is replicated on all of
    them): the rows per micro-batch are rounded down to a multiple of it (at least one
    multiple, whatever the budget: one row per device costs no more memory than a replicated
    single row) and the last micro-batch is filled up with empty rows (all padding, no loss):
    to the multiple, or with `full_rows` to as many rows as the others (one shape for every
    micro-batch).

    units: sequences that go into one row, one after another in this order (a shared prompt and
    the sequences that attend to it: `SharedPrompts.units`); default: each sequence alone.
    parents: recorded in the plan (`MicroBatchPlan.parents`)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens_per_micro_batch={max_tokens} must be >= 1")
    units = [(i,) for i in range(len(lengths))] if units is None else [tuple(u) for u in units]
    if sorted(i for unit in units for i in unit) != list(range(len(lengths))):
        raise ValueError(f"units {units} do not hold each of the {len(lengths)} sequences once")
    size = [sum(lengths[i] for i in unit) for unit in units]
    if width is None:
        width = bucket(max(size), min_length, multiple)
    elif width < max(size):
        raise ValueError(f"width {width} is shorter than the longest sequence ({max(size)} tokens)")
    free: list[int] = []  # tokens left per row
    rows: list[list[tuple[int, int]]] = []  # (offset, sequence index)
    for u in sorted(range(len(units)), key=lambda u: -size[u]):
        row = next((r for r, left in enumerate(free) if left >= size[u]), None)
        if row is None:
            free.append(width)
            rows.append([])
            row = len(rows) - 1
        for index in units[u]:
            rows[row].append((width - free[row], index))
            free[row] -= lengths[index]
    if row_multiple < 1:
        raise ValueError(f"row_multiple={row_multiple} must be >= 1")
    per_micro = max(1, max_tokens // width)
    per_micro = max(row_multiple, per_micro - per_micro % row_multiple)
    placements, counts = [], []
    for start in range(0, len(rows), per_micro):
        group = rows[start:start + per_micro]
        placements.append(tuple((r, offset, index) for r, row in enumerate(group) for offset, index in row))
        counts.append(per_micro if full_rows else -(-len(group) // row_multiple) * row_multiple)
    return MicroBatchPlan(tuple(placements), tuple(counts), width, tuple(lengths), packed=True,
                          parents=tuple(parents))


def micro_batch_plan(packed: Packed, num_micro: int, max_tokens: int = 0, row_multiple: int = 1,
                     full_rows: bool = False, shared: SharedPrompts | None = None) -> MicroBatchPlan:
    """`max_tokens` > 0: token-budget micro-batches of packed rows (`plan_token_budget`, at the
    width `pack` chose); 0: `num_micro` equal groups of one sequence per row. `shared`: the
    layout `packed` was made from (`SharedPrompts.sequences`), whose units stay in one row
    (token budgets only)."""
    if shared is not None and not max_tokens:
        raise ValueError("shared prompts need token-budget micro-batches (max_tokens_per_micro_batch > 0)")
    return plan_micro_batches([s.length for s in packed.sequences], packed.input_ids.shape[1], num_micro,
                              max_tokens, row_multiple, full_rows, shared)


def plan_micro_batches(lengths: Sequence[int], width: int, num_micro: int, max_tokens: int = 0,
                       row_multiple: int = 1, full_rows: bool = False,
                       shared: SharedPrompts | None = None) -> MicroBatchPlan:
    """`micro_batch_plan` for sequences of these lengths padded to `width` (what `pack` gives):
    the memory planner calls it with the workload's episode lengths. row_multiple: see
    `plan_token_budget` (token budgets only), and full_rows."""
    if max_tokens:  # pack's width as is: bucket(width, width, width) rounds 20,480 up to 32,768
        return plan_token_budget(lengths, max_tokens, width=width, row_multiple=row_multiple, full_rows=full_rows,
                                 units=None if shared is None else shared.units,
                                 parents=() if shared is None else shared.parents)
    return plan_rows(lengths, width, num_micro)


def planned_micro_batches(packed: Packed, plan: MicroBatchPlan, vision_config,
                          extras: Mapping[str, np.ndarray] | None = None, min_frames: int = 0,
                          vision_shards: int = 1,
                          features: Sequence[VisionFeatures | None] | None = None) -> list[TrainBatch]:
    """The micro-batches of `plan`: token arrays, extras ([N, T] in the Packed layout) and
    vision inputs moved to each sequence's (row, offset); with plan.packed, segment ids number
    the sequences of each row and every sequence keeps its own positions (its 3-D MRoPE
    positions start again at its first token) and its own loss mask (its first token, which
    has no prediction within the sequence, excluded). Each micro-batch's vision pass is padded
    to a power of two of frames, and to at least `min_frames` (`pad_frames_to_buckets`).

    vision_shards S > 1 (the batch devices a mesh splits the rows over, `sharding.vision_shards`):
    a micro-batch whose rows S divides gets its vision inputs per shard of rows (`shard_vision`),
    so that each device encodes only its own rows' frames.

    features: one `VisionFeatures` per sequence of `packed` (None for a sequence without
    frames), a frozen tower's output: the micro-batches then carry them in place of pixels
    (`shard_features`), padded to the rows the pixels' padded frames would give, so the
    decoder sees the same shapes either way."""
    extras = dict(extras or {})
    if features is not None and len(features) != len(packed.sequences):
        raise ValueError(f"{len(features)} vision features for {len(packed.sequences)} sequences")
    _check_extra_names(extras)
    for name, array in extras.items():
        if np.shape(array) != packed.input_ids.shape:
            raise ValueError(f"extra {name!r} has shape {np.shape(array)}, the tokens {packed.input_ids.shape}")
    if plan.lengths != tuple(s.length for s in packed.sequences):
        raise ValueError("the micro-batch plan was made for other sequences")
    lengths = plan.lengths
    split = {name: plan.split(np.asarray(packed_array)) for name, packed_array in
             (("input_ids", packed.input_ids), ("attention_mask", packed.attention_mask),
              ("loss_mask", packed.loss_mask), *extras.items())}
    positions = [np.stack(parts, 0) for parts in zip(*(plan.split(p) for p in packed.position_ids))]
    out = []
    for m, placements in enumerate(plan.placements):
        segment_ids = parent_ids = None
        if plan.packed:
            segment_ids = np.zeros((plan.rows[m], plan.width), np.int32)
            seen: dict[int, int] = {}
            numbered: dict[int, tuple[int, int]] = {}  # sequence -> (row, segment)
            for row, start, index in placements:
                seen[row] = seen.get(row, 0) + 1
                segment_ids[row, start:start + lengths[index]] = seen[row]
                numbered[index] = (row, seen[row])
            if plan.parents:  # a shared layout: every micro-batch carries them (one program), zeros or not
                parent_ids = np.zeros((plan.rows[m], plan.width), np.int32)
                for row, start, index in placements:
                    parent = plan.parents[index]
                    if parent >= 0:
                        if numbered.get(parent, (None,))[0] != row:
                            raise ValueError(f"sequence {index}'s shared prompt (sequence {parent}) is not in its row")
                        parent_ids[row, start:start + lengths[index]] = numbered[parent][1]
        shards = vision_shard_count(vision_shards, plan.rows[m])
        pixels = meta = embeds = deepstack = None
        if features is None:
            visual_index, pixels, meta = shard_vision(
                [(row, start, packed.sequences[index]) for row, start, index in placements], plan.rows[m],
                plan.width, vision_config, min_frames, shards)
        else:
            visual_index, embeds, deepstack = shard_features(
                [(row, start, packed.sequences[index], features[index]) for row, start, index in placements],
                plan.rows[m], plan.width, vision_config, min_frames, shards)
        out.append(TrainBatch(
            input_ids=split["input_ids"][m], attention_mask=split["attention_mask"][m],
            position_ids=positions[m], loss_mask=split["loss_mask"][m], visual_index=visual_index,
            pixel_values=pixels, vision_meta=meta,
            extras={name: split[name][m] for name in extras}, segment_ids=segment_ids,
            visual_embeds=embeds, visual_deepstack=deepstack, parent_ids=parent_ids))
    return out


def frame_targets(grids, min_frames: int = 0) -> dict[tuple[int, int], int]:
    """The frames per size (h, w) that every block's vision pass is padded to: each block's
    count rounded up to a power of two and to at least `min_frames`, the largest over the
    blocks (grids: one [n, 3] grid per block, None for a block without frames)."""
    targets: dict[tuple[int, int], int] = {}
    for grid in grids:
        if grid is not None:
            for size, n in frame_buckets(frame_counts(grid), min_frames).items():
                targets[size] = max(targets.get(size, 0), n)
    return targets


def shard_frame_targets(grids, min_frames: int, shards: int) -> dict[tuple[int, int], int]:
    """`frame_targets` of `shards` blocks' grids with `min_frames` (the whole pass's) split
    evenly over the blocks: the frames per size each block's pass is padded to."""
    return frame_targets(grids, -(-int(min_frames) // shards))


def shard_vision(placements, rows: int, width: int, vision_config, min_frames: int = 0,
                 shards: int = 1) -> tuple[np.ndarray | None, np.ndarray | None, tuple | None]:
    """(visual_index [rows, width], pixel_values, vision meta) of sequences placed at (row,
    offset). shards = 1: one vision pass over every frame (pixel_values [N, patch_dim], meta of
    `vision_layout`), each size's frames padded to a power of two and at least `min_frames`.
    shards = S > 1: rows split into S blocks of rows / S (as a mesh splits the batch axis); each
    block's frames padded to the same counts (the largest block's, per size; at least
    min_frames / S), pixel_values [S, N, patch_dim] and every meta array with the leading S axis;
    a token's visual_index counts within its own block's frames."""
    if rows % shards:
        raise ValueError(f"{rows} rows do not split into {shards} vision shards")
    per = rows // shards
    blocks = [collate_vision_placed([(row - s * per, start, seq) for row, start, seq in placements
                                     if s * per <= row < (s + 1) * per], per, width) for s in range(shards)]
    if all(pixels is None for _, pixels, _ in blocks):
        return None, None, None
    targets = shard_frame_targets([grid for _, _, grid in blocks], min_frames, shards)
    visual_index = np.concatenate([np.full((per, width), -1, np.int32) if index is None else index
                                   for index, _, _ in blocks])
    padded = [pad_frames_to(pixels, grid, targets, vision_config.patch_dim) for _, pixels, grid in blocks]
    metas = [vision_layout(grid, vision_config).device_arrays() for _, grid in padded]
    if shards == 1:
        return visual_index, padded[0][0], metas[0]
    stacked = jax.tree.map(lambda *arrays: np.stack(arrays), *metas)
    return visual_index, np.stack([pixels for pixels, _ in padded]), stacked


def vision_shard_count(batch_devices: int, rows: int) -> int:
    """The vision shards of a micro-batch of `rows` rows over `batch_devices` batch devices: one
    per device when they divide the rows (as the token arrays split), else 1 (replicated)."""
    return batch_devices if batch_devices > 1 and rows % batch_devices == 0 else 1


def collate_features_placed(placements, rows: int, width: int):
    """`collate_vision_placed` with a frozen tower's features in place of pixels: placements
    (row, offset, sequence, its VisionFeatures or None). Returns (visual_index [rows, width],
    embeds [n, D], deepstack [n_ds, n, D], grids [items, 3]), or Nones without vision tokens."""
    visual_index = np.full((rows, width), -1, np.int32)
    embeds, deepstack, grids, offset = [], [], [], 0
    for b, start, s, f in placements:
        if s is None or not s.length:
            continue
        where = np.concatenate([np.nonzero(s.mm_token_type_ids == kind)[0] for kind in (IMAGE, VIDEO)])
        if not len(where):
            continue
        if f is None or f.tokens != len(where):
            raise ValueError(f"a sequence with {len(where)} vision tokens came with "
                             f"{'no' if f is None else f.tokens} rows of vision features")
        visual_index[b, start + where] = offset + np.arange(len(where))
        offset += len(where)
        embeds.append(f.embeds)
        deepstack.append(f.deepstack)
        grids += [s.image_grid_thw, s.video_grid_thw]
    if not embeds:
        return None, None, None, None
    return (visual_index, np.concatenate(embeds), np.concatenate(deepstack, axis=1),
            np.concatenate(grids).reshape(-1, 3))


def feature_rows(targets: dict[tuple[int, int], int], vision_config) -> int:
    """The tower's output rows for frames padded to `targets` (frames per size (h, w) in patches)."""
    return sum(k * h * w // vision_config.merge_unit for (h, w), k in targets.items())


def shard_features(placements, rows: int, width: int, vision_config, min_frames: int = 0,
                   shards: int = 1) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """`shard_vision` with a frozen tower's features: (visual_index, visual_embeds,
    visual_deepstack) of sequences placed at (row, offset, sequence, features). Each block's
    features are padded with zero rows to as many rows as its frames padded as `shard_vision`
    pads them would give the tower, so the arrays have the shapes the pixels' pass would make
    (rows no token points at; the padded frames' features are never read either)."""
    if rows % shards:
        raise ValueError(f"{rows} rows do not split into {shards} vision shards")
    per = rows // shards
    blocks = [collate_features_placed([(row - s * per, start, seq, f) for row, start, seq, f in placements
                                       if s * per <= row < (s + 1) * per], per, width) for s in range(shards)]
    present = [b for b in blocks if b[1] is not None]
    if not present:
        return None, None, None
    total = feature_rows(frame_targets([grid for *_, grid in blocks], -(-int(min_frames) // shards)), vision_config)
    d, n_ds = present[0][1].shape[-1], present[0][2].shape[0]
    dtype = present[0][1].dtype
    visual_index = np.concatenate([np.full((per, width), -1, np.int32) if index is None else index
                                   for index, *_ in blocks])
    embeds = np.zeros((shards, total, d), dtype)
    deepstack = np.zeros((n_ds, shards, total, d), dtype)
    for s, (_, e, ds, _) in enumerate(blocks):
        if e is not None:
            embeds[s, :len(e)], deepstack[:, s, :len(e)] = e, ds
    if shards == 1:
        return visual_index, embeds[0], deepstack[:, 0]
    return visual_index, embeds, deepstack
