"""ModelInputs: one token sequence with everything the model needs, built from segments and
extensible chunk by chunk with positions that continue exactly as a full re-encode."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from paravt_jax.models.qwen3_vl.rope import IMAGE, TEXT, VIDEO, sequence_positions, split_video_grids
from paravt_jax.text.chat import Image, Segment, Text, Video
from paravt_jax.text.tokenizer import Tokenizer
from paravt_jax.video.frames import group_times, llm_tokens, patchify_image, patchify_video

PATCH_DIM = 1536
# How `encode` lays out a video item (its docstring): time groups, each `<t seconds>` and a
# vision start/end pair around its pads, without the template's outer pair (transformers 4.57
# and 5.25; 5.10-5.24 kept it). Evaluation records of video items are keyed on it.
VIDEO_ITEM_LAYOUT = "time groups, no outer vision pair"


def _joined(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """first then second (rows); an empty side returns the other as it is (the arrays of a
    ModelInputs are never written in place), so appending a text chunk to a sequence with frames
    does not copy its pixels."""
    if second.shape[1:] == first.shape[1:] and second.dtype == first.dtype and not (len(first) and len(second)):
        return second if len(second) else first
    return np.concatenate([first, second])


@dataclasses.dataclass(frozen=True)
class ModelInputs:
    """One unpadded sequence (host numpy). L tokens, N image patches, M video patches.

    input_ids, mm_token_type_ids, loss_mask: [L] int32; position_ids: [3, L] int64;
    pixel_values [N, 1536] float32 + image_grid_thw [n, 3]; pixel_values_videos [M, 1536] +
    video_grid_thw [v, 3]. `next_position` is where the next token goes (all three axes),
    `rope_delta` = next_position - L (HF's rope_deltas).
    """
    input_ids: np.ndarray
    mm_token_type_ids: np.ndarray
    loss_mask: np.ndarray
    position_ids: np.ndarray
    pixel_values: np.ndarray
    image_grid_thw: np.ndarray
    pixel_values_videos: np.ndarray
    video_grid_thw: np.ndarray
    next_position: int

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def rope_delta(self) -> int:
        return self.next_position - self.length

    @property
    def attention_mask(self) -> np.ndarray:
        return np.ones_like(self.input_ids)

    def extend(self, chunk: ModelInputs) -> ModelInputs:
        """self followed by `chunk`; the chunk must have been encoded with
        start_position=self.next_position (checked)."""
        if chunk.length and int(chunk.position_ids.min()) < self.next_position:
            raise ValueError(f"chunk starts at position {int(chunk.position_ids.min())}, before "
                             f"this sequence's next position {self.next_position}; encode it with "
                             f"start_position={self.next_position}")
        return ModelInputs(
            input_ids=np.concatenate([self.input_ids, chunk.input_ids]),
            mm_token_type_ids=np.concatenate([self.mm_token_type_ids, chunk.mm_token_type_ids]),
            loss_mask=np.concatenate([self.loss_mask, chunk.loss_mask]),
            position_ids=np.concatenate([self.position_ids, chunk.position_ids], axis=1),
            pixel_values=_joined(self.pixel_values, chunk.pixel_values),
            image_grid_thw=_joined(self.image_grid_thw, chunk.image_grid_thw),
            pixel_values_videos=_joined(self.pixel_values_videos, chunk.pixel_values_videos),
            video_grid_thw=_joined(self.video_grid_thw, chunk.video_grid_thw),
            next_position=chunk.next_position if chunk.length else self.next_position,
        )

    def slice(self, start: int, stop: int) -> ModelInputs:
        """Tokens [start, stop) with their own positions and the images and videos whose tokens
        lie there; an image or video with tokens on both sides of a cut is an error."""
        if not 0 <= start < stop <= self.length:
            raise ValueError(f"slice [{start}, {stop}) of a {self.length}-token sequence: expected "
                             "0 <= start < stop <= length")
        kept = {}
        for kind, pixels, grids in ((IMAGE, self.pixel_values, self.image_grid_thw),
                                    (VIDEO, self.pixel_values_videos, self.video_grid_thw)):
            where = np.nonzero(self.mm_token_type_ids == kind)[0]
            grids = np.asarray(grids).reshape(-1, 3)
            before = inside = rows_before = rows_inside = token = 0
            for grid in grids:  # items in token order, each llm_tokens(grid) tokens and prod(grid) patches
                span = where[token:token + llm_tokens(grid)]
                token += len(span)
                within = (span >= start) & (span < stop)
                if within.any() and not within.all():
                    raise ValueError(f"slice [{start}, {stop}) cuts an image or video (its tokens "
                                     f"{int(span[0])}-{int(span[-1])})")
                if within.all() and len(span):
                    inside, rows_inside = inside + 1, rows_inside + int(np.prod(grid))
                elif len(span) and span[0] < start:
                    before, rows_before = before + 1, rows_before + int(np.prod(grid))
            kept[kind] = (pixels[rows_before:rows_before + rows_inside], grids[before:before + inside])
        positions = self.position_ids[:, start:stop]
        return ModelInputs(
            input_ids=self.input_ids[start:stop], mm_token_type_ids=self.mm_token_type_ids[start:stop],
            loss_mask=self.loss_mask[start:stop], position_ids=positions,
            pixel_values=kept[IMAGE][0], image_grid_thw=kept[IMAGE][1].astype(self.image_grid_thw.dtype),
            pixel_values_videos=kept[VIDEO][0], video_grid_thw=kept[VIDEO][1].astype(self.video_grid_thw.dtype),
            next_position=self.next_position if stop == self.length else int(positions.max()) + 1)

    def model_kwargs(self) -> dict:
        """Batch-of-one keyword arguments for `Qwen3VL.__call__`."""
        kwargs = dict(input_ids=self.input_ids[None], attention_mask=self.attention_mask[None],
                      mm_token_type_ids=self.mm_token_type_ids[None])
        if len(self.image_grid_thw):
            kwargs.update(pixel_values=self.pixel_values, image_grid_thw=self.image_grid_thw)
        if len(self.video_grid_thw):
            kwargs.update(pixel_values_videos=self.pixel_values_videos,
                          video_grid_thw=self.video_grid_thw)
        return kwargs


@dataclasses.dataclass(frozen=True)
class _VideoGroup:
    """One temporal group of a video item: `tokens` video pads between a start/end pair."""
    tokens: int


def _merge_text(segments: Sequence[Segment | _VideoGroup]) -> list[Segment | _VideoGroup]:
    """Joins adjacent Text segments with the same trainable flag."""
    out: list[Segment | _VideoGroup] = []
    for seg in segments:
        if isinstance(seg, Text) and out and isinstance(out[-1], Text) and out[-1].trainable == seg.trainable:
            out[-1] = Text(out[-1].text + seg.text, seg.trainable)
        else:
            out.append(seg)
    return out


def encode(segments: Sequence[Segment], tokenizer: Tokenizer, start_position: int = 0,
           spatial_merge_size: int = 2) -> ModelInputs:
    """Segments -> ModelInputs. Images become `<|vision_start|>` + pads + `<|vision_end|>`
    (the template's placeholder expanded to (h/32)*(w/32) pads) and merge-block patches.
    A video becomes, per temporal group of two frames, `<t seconds>` (one decimal) +
    `<|vision_start|>` + (h/32)*(w/32) video pads + `<|vision_end|>`, each group one row of
    rope grid: the Qwen3-VL processor's layout, which replaces the template's whole
    `<|vision_start|><|video_pad|><|vision_end|>` (transformers 4.57 and 5.25; 5.10-5.24
    kept that outer pair). The first group's time is tokenised together with the text before
    it, as a processor tokenises the whole expanded prompt."""
    sp = tokenizer.special
    ids, types, loss = [], [], []
    pixels, grids = [], []
    video_pixels, video_grids = [], []
    expanded: list[Segment | _VideoGroup] = []  # each video as its groups' times (text) and pads
    for seg in segments:
        if isinstance(seg, Video):
            pv, grid = patchify_video(seg.frames)
            video_pixels.append(pv)
            video_grids.append(grid)
            n = llm_tokens((1, *grid[1:]), spatial_merge_size)
            for seconds in group_times(seg.timestamps):
                expanded += [Text(f"<{seconds:.1f} seconds>"), _VideoGroup(n)]
        else:
            expanded.append(seg)
    for seg in _merge_text(expanded):
        if isinstance(seg, Text):
            piece = tokenizer.encode(seg.text)
            ids += piece
            types += [TEXT] * len(piece)
            loss += [int(seg.trainable)] * len(piece)
        elif isinstance(seg, Image):
            pv, grid = patchify_image(seg.frame)
            n = llm_tokens(grid, spatial_merge_size)
            ids += [sp.vision_start] + [sp.image_pad] * n + [sp.vision_end]
            types += [TEXT] + [IMAGE] * n + [TEXT]
            loss += [0] * (n + 2)
            pixels.append(pv)
            grids.append(grid)
        elif isinstance(seg, _VideoGroup):
            ids += [sp.vision_start] + [sp.video_pad] * seg.tokens + [sp.vision_end]
            types += [TEXT] + [VIDEO] * seg.tokens + [TEXT]
            loss += [0] * (seg.tokens + 2)
        else:
            raise TypeError(f"segment of type {type(seg).__name__}")
    types_arr = np.asarray(types, np.int32)
    image_grid = np.asarray(grids, np.int64).reshape(-1, 3)
    video_grid = np.asarray(video_grids, np.int64).reshape(-1, 3)
    positions = sequence_positions(types_arr, {IMAGE: list(image_grid), VIDEO: list(split_video_grids(video_grid))},
                                   {IMAGE: 0, VIDEO: 0}, start_position, spatial_merge_size)
    return ModelInputs(
        input_ids=np.asarray(ids, np.int32), mm_token_type_ids=types_arr,
        loss_mask=np.asarray(loss, np.int32), position_ids=positions,
        pixel_values=np.concatenate(pixels) if pixels else np.zeros((0, PATCH_DIM), np.float32),
        image_grid_thw=image_grid,
        pixel_values_videos=np.concatenate(video_pixels) if video_pixels else np.zeros((0, PATCH_DIM), np.float32),
        video_grid_thw=video_grid,
        next_position=int(positions.max()) + 1 if positions.size else start_position,
    )


def encode_ids(ids: Sequence[int], start_position: int, trainable: bool = True) -> ModelInputs:
    """A text-only chunk from token ids (e.g. what the sampler generated)."""
    ids_arr = np.asarray(ids, np.int32)
    n = len(ids_arr)
    positions = np.broadcast_to(np.arange(start_position, start_position + n), (3, n)).astype(np.int64)
    return ModelInputs(ids_arr, np.zeros(n, np.int32), np.full(n, int(trainable), np.int32),
                       positions, np.zeros((0, PATCH_DIM), np.float32), np.zeros((0, 3), np.int64),
                       np.zeros((0, PATCH_DIM), np.float32), np.zeros((0, 3), np.int64),
                       start_position + n)


def check_against_model(tokenizer: Tokenizer, config) -> None:
    """The tokenizer's vision ids must be the ones the checkpoint was trained with."""
    sp = tokenizer.special
    pairs = {"image_token_id": sp.image_pad, "video_token_id": sp.video_pad,
             "vision_start_token_id": sp.vision_start, "vision_end_token_id": sp.vision_end}
    wrong = [f"{k}: config {getattr(config, k)} vs tokenizer {v}" for k, v in pairs.items()
             if getattr(config, k) != v]
    if wrong:
        raise ValueError(f"{tokenizer.source}: tokenizer and model config disagree: " + "; ".join(wrong))
    if tokenizer.vocab_size > config.text.vocab_size:
        raise ValueError(f"{tokenizer.source}: tokenizer has {tokenizer.vocab_size} tokens, more "
                         f"than the model's vocab_size {config.text.vocab_size}")


def collate_vision_placed(placements: Sequence[tuple[int, int, ModelInputs | None]], rows: int, width: int):
    """Vision inputs of sequences placed at (row, offset) of a [rows, width] batch (several per
    row when packed): items ordered as the placements (each sequence's images, then its
    videos). Returns (visual_index [rows, width] with -1 for text, pixel values, grids), or
    (None, None, None) when no sequence holds an image or video."""
    visual_index = np.full((rows, width), -1, np.int32)
    pixels, grids, offset = [], [], 0
    for b, start, s in placements:
        if s is None or not s.length:
            continue
        for kind, pv, grid in ((IMAGE, s.pixel_values, s.image_grid_thw),
                               (VIDEO, s.pixel_values_videos, s.video_grid_thw)):
            where = np.nonzero(s.mm_token_type_ids == kind)[0]
            if len(where):
                visual_index[b, start + where] = offset + np.arange(len(where))
                offset += len(where)
                pixels.append(pv)
                grids.append(grid)
    if not pixels:
        return None, None, None
    return visual_index, np.concatenate(pixels), np.concatenate(grids)
