"""Token-budget micro-batches with packing (train/batch.py): the plan, and a packed step equal
to the unpacked one (loss sums, counts and gradients), vision and 3-D MRoPE positions included."""
import numpy as np
import pytest

from paravt_jax.models.qwen3_vl import init_model, preset
from paravt_jax.models.qwen3_vl.rope import get_rope_index
from paravt_jax.sft.objective import HEAD, sft_loss
from paravt_jax.text.inputs import ModelInputs
from paravt_jax.train.batch import micro_batches, pack, plan_rows, plan_token_budget, planned_micro_batches
from paravt_jax.train.step import OptimizerConfig, TrainStep
from support.hf_tiny import IMAGE, image_tokens
from support.steps import assert_same_step, summed_gradients


def sequence(rng, prompt: int, response: int, grid=None) -> ModelInputs:
    """A prompt (optionally with one image of `grid` patches) and a trained response."""
    ids = list(rng.integers(10, 890, prompt))
    if grid is not None:
        ids = ids[:2] + image_tokens(grid) + ids[2:]
    ids += list(rng.integers(10, 890, response))
    ids = np.asarray(ids)
    types = np.where(ids == IMAGE, 1, 0)
    grids = None if grid is None else np.asarray([grid])
    positions, _ = get_rope_index(types[None], np.ones((1, len(ids))), grids, None)
    loss = np.zeros(len(ids), np.int32)
    loss[-response:] = 1
    pixels = (rng.standard_normal((int(np.prod(grid)), 1536)).astype(np.float32) if grid is not None
              else np.zeros((0, 1536), np.float32))
    empty = np.zeros((0, 1536), np.float32)
    return ModelInputs(ids.astype(np.int32), types.astype(np.int32), loss, positions[:, 0], pixels,
                       np.asarray(grids if grids is not None else np.zeros((0, 3)), np.int64), empty,
                       np.zeros((0, 3), np.int64), int(positions.max()) + 1)


def test_plan_token_budget():
    """Longest first, first fit: short sequences share rows, the rows of a micro-batch stay
    within the budget, a sequence wider than the others sits alone; split and merge are inverse;
    the padding fraction drops against one sequence per row."""
    lengths = [60, 10, 30, 25, 20, 5, 64]
    plan = plan_token_budget(lengths, max_tokens=128, min_length=16, multiple=64)
    assert plan.width == 64 and plan.packed
    assert all(rows * plan.width <= 128 for rows in plan.rows)
    placed = sorted(index for micro in plan.placements for _, _, index in micro)
    assert placed == list(range(len(lengths)))
    rows_of = {index: (m, row) for m, micro in enumerate(plan.placements) for row, _, index in micro}
    assert sum(1 for index in rows_of if rows_of[index] == rows_of[6]) == 1  # 64 tokens: alone
    for micro in plan.placements:  # no overlap within a row
        for row in {r for r, _, _ in micro}:
            spans = sorted((start, start + lengths[i]) for r, start, i in micro if r == row)
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])) and spans[-1][1] <= plan.width
    array = np.zeros((len(lengths), 64), np.float32)
    for i, n in enumerate(lengths):
        array[i, :n] = np.arange(1, n + 1) + 100 * i
    np.testing.assert_array_equal(plan.merge(plan.split(array), 64), array)
    unpacked = plan_rows(lengths, 64, 1)
    assert plan.padding_fraction() < unpacked.padding_fraction()
    assert abs(unpacked.padding_fraction() - (1 - sum(lengths) / (7 * 64))) < 1e-12
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch=0"):
        plan_token_budget(lengths, 0)


def test_token_budget_keeps_the_packed_width():
    """micro_batch_plan packs at the width `pack` chose, also when it is no power of two."""
    from paravt_jax.train.batch import plan_micro_batches

    plan = plan_micro_batches([20_244] * 56, 20_480, 1, max_tokens=8 * 20_480)
    assert plan.width == 20_480 and plan.rows == (8,) * 7
    # narrower rows fit 9 under that budget; a row multiple of 8 (the batch's devices) keeps 8,
    # and fills the last micro-batch up with empty rows
    assert plan_micro_batches([18_000] * 56, 18_176, 1, max_tokens=8 * 20_480).rows == (9,) * 6 + (2,)
    plan = plan_micro_batches([18_000] * 58, 18_176, 1, max_tokens=8 * 20_480, row_multiple=8)
    assert plan.rows == (8,) * 8 and len(plan.placements[-1]) == 2
    assert plan_micro_batches([200] * 6, 256, 1, max_tokens=256, row_multiple=4).rows == (4,) * 2
    with pytest.raises(ValueError, match="shorter than the longest"):
        plan_token_budget([300], 1000, width=256)


# dense in tests/slow/test_packing.py: the op is shared, blockwise adds the masked-block skipping
@pytest.mark.parametrize("attention", ["blockwise"])
def test_packed_step_equals_unpacked(attention):
    """The step's loss (sum / token count) and gradients (summed over micro-batches / count)
    over token-budget micro-batches (several sequences per row, two with an image) equal those
    of one sequence per row within 1e-6; the token counts are identical."""
    rng = np.random.default_rng(0)
    seqs = [sequence(rng, 6, 20, grid=(1, 4, 4)), sequence(rng, 5, 9), sequence(rng, 7, 30),
            sequence(rng, 4, 5), sequence(rng, 9, 12, grid=(1, 4, 8))]
    model = init_model(preset("tiny", attention=attention, attention_block=16), seed=0)
    step = TrainStep(model, OptimizerConfig(learning_rate=1e-3), sft_loss, HEAD)
    params = step.init_state().params
    packed = pack(seqs, min_length=16, multiple=16)
    unpacked_batches = micro_batches(packed, 1, model.config.vision)
    plan = plan_token_budget([s.length for s in seqs], max_tokens=2 * 48, min_length=16, multiple=16)
    assert plan.width == 48 and len(plan.placements) == 2 and any(
        len({r for r, _, _ in micro}) < len(micro) for micro in plan.placements)  # rows shared
    packed_batches = planned_micro_batches(packed, plan, model.config.vision)

    # rows filled up to a multiple of 4 with empty rows (all padding) change nothing
    filled = plan_token_budget([s.length for s in seqs], max_tokens=2 * 48, min_length=16, multiple=16,
                               row_multiple=4)
    assert filled.rows == (4,) and sum(filled.rows) > len({r for r, _, _ in filled.placements[0]})
    reference = summed_gradients(step, params, unpacked_batches)
    for batches in (packed_batches, planned_micro_batches(packed, filled, model.config.vision)):
        assert_same_step(step, params, batches, reference, sum(int(s.loss_mask.sum()) for s in seqs))


def test_token_budget_full_rows():
    """full_rows: every micro-batch, the last too, has the same row count (one shape); the
    placements do not change."""
    lengths = [60, 10, 30, 25, 20, 5, 64, 50, 40]
    loose = plan_token_budget(lengths, max_tokens=3 * 64, width=64)
    full = plan_token_budget(lengths, max_tokens=3 * 64, width=64, full_rows=True)
    assert loose.placements == full.placements
    assert loose.rows[-1] < 3 and set(full.rows) == {3}
