"""Shared prompts in packed rows (train/batch.py SharedPrompts, rl.share_prompts): the samples of
a prompt stored with the prompt once, each sample's rest attending to it. The layout, its
round trips, and a step over it equal to the same sequences packed whole (loss, token counts,
gradients, per-token log-probs), frames and 3-D MRoPE positions included."""
import numpy as np
import pytest

from paravt_jax.models.qwen3_vl import init_model, preset
from paravt_jax.models.qwen3_vl.attention_mask import visible
from paravt_jax.models.qwen3_vl.rope import get_rope_index
from paravt_jax.rl.trainer import RLConfig
from paravt_jax.sft.objective import HEAD, sft_loss
from paravt_jax.text.inputs import ModelInputs
from paravt_jax.train.batch import micro_batch_plan, pack, planned_micro_batches, share_prompts
from paravt_jax.train.step import OptimizerConfig, TrainStep
from support.hf_tiny import IMAGE, image_tokens
from support.steps import assert_same_step, summed_gradients


def sample(prompt_ids, grid, pixels, response) -> ModelInputs:
    """The prompt (text around one image of `grid` patches, or text alone) then a trained response."""
    ids = np.asarray(list(prompt_ids[:2]) + (image_tokens(grid) if grid else []) + list(prompt_ids[2:])
                     + list(response))
    types = np.where(ids == IMAGE, 1, 0)
    grids = np.asarray([grid] if grid else np.zeros((0, 3)), np.int64)
    positions, _ = get_rope_index(types[None], np.ones((1, len(ids))), grids if grid else None, None)
    loss = np.zeros(len(ids), np.int32)
    loss[-len(response):] = 1
    empty = np.zeros((0, 1536), np.float32)
    return ModelInputs(ids.astype(np.int32), types.astype(np.int32), loss, positions[:, 0],
                       pixels if grid else empty, grids, empty, np.zeros((0, 3), np.int64), int(positions.max()) + 1)


def prompt_samples(rng, prompt: int, responses, grid=None) -> list[ModelInputs]:
    ids = rng.integers(10, 890, prompt)
    pixels = rng.standard_normal((int(np.prod(grid)), 1536)).astype(np.float32) if grid else None
    return [sample(ids, grid, pixels, rng.integers(10, 890, n)) for n in responses]


def sequences(rng):
    """Three samples of a prompt with an image, two of a text prompt, one lone sample."""
    return (prompt_samples(rng, 12, (9, 20, 5), grid=(1, 4, 8)) + prompt_samples(rng, 10, (14, 3))
            + prompt_samples(rng, 7, (11,), grid=(1, 4, 4)))


def test_slice_keeps_frames_and_positions():
    """A sequence's slices carry their tokens' positions and the images inside them; joined they
    are the sequence; a cut through an image is refused."""
    seq = prompt_samples(np.random.default_rng(0), 12, (9,), grid=(1, 4, 8))[0]
    image = np.nonzero(seq.mm_token_type_ids)[0]
    head, tail = seq.slice(0, 20), seq.slice(20, seq.length)
    assert len(head.image_grid_thw) == 1 and len(tail.image_grid_thw) == 0
    np.testing.assert_array_equal(head.pixel_values, seq.pixel_values)
    joined = head.extend(tail)
    for field in ("input_ids", "mm_token_type_ids", "loss_mask", "position_ids", "pixel_values", "image_grid_thw"):
        np.testing.assert_array_equal(getattr(joined, field), getattr(seq, field))
    assert joined.next_position == seq.next_position
    before = seq.slice(0, int(image[0]))
    assert len(before.image_grid_thw) == 0 and before.pixel_values.shape == (0, 1536)
    with pytest.raises(ValueError, match="cuts an image"):
        seq.slice(0, int(image[3]))
    with pytest.raises(ValueError, match="start < stop"):
        seq.slice(5, 5)


def test_layout_groups_and_round_trips():
    """Consecutive samples of one prompt share it but its last token; a lone sample, and one whose
    group would not fit `max_length`, stay whole; derive and restore are inverse on every token."""
    seqs = sequences(np.random.default_rng(1))
    shared = share_prompts(seqs)
    prompt_a = int(np.nonzero(seqs[0].loss_mask)[0][0])
    prompt_b = int(np.nonzero(seqs[3].loss_mask)[0][0])
    assert [len(u) for u in shared.units] == [4, 3, 1]
    assert shared.sources[0] == (0, 1, 2) and shared.stops[0] == prompt_a - 1
    assert shared.parents == (-1, 0, 0, 0, -1, 4, 4, -1)
    assert shared.sequences[0].pixel_values.shape[0] == 32 and all(
        s.pixel_values.shape[0] == 0 for s in shared.sequences[1:4])
    assert all(s.loss_mask[0] == 0 for s in shared.sequences)  # a tail starts on the prompt's last token
    assert shared.shared_tokens == 2 * (prompt_a - 1) + (prompt_b - 1)
    laid = sum(s.length for s in shared.sequences)
    assert laid == sum(s.length for s in seqs) - shared.shared_tokens
    width = max(s.length for s in seqs)
    array = np.zeros((len(seqs), width), np.float32)
    for i, s in enumerate(seqs):
        array[i, :s.length] = 1000 * (i + 1) + np.arange(s.length)
        array[i, :prompt_a - 1 if i < 3 else prompt_b - 1 if i < 5 else 0] = 7  # the prompts' values agree
    np.testing.assert_array_equal(shared.restore(shared.derive(array, width), width), array)
    alone = share_prompts(seqs, max_length=laid // 2)  # the first group does not fit: whole
    assert [len(u) for u in alone.units] == [1, 1, 1, 3, 1]


def test_visible_with_parents():
    """A token sees its own earlier tokens and its parent segment's earlier ones, not a sibling's."""
    seg = np.asarray([[1, 1, 2, 2, 3, 3, 0]])
    par = np.asarray([[0, 0, 1, 1, 1, 1, 0]])
    pos = np.arange(7)[None]
    seen = np.asarray(visible(seg, pos, seg, pos, True, par))[0]
    assert seen[5].tolist() == [True, True, False, False, True, True, False]
    assert seen[3].tolist() == [True, True, True, True, False, False, False]
    assert seen[1].tolist() == [True, True, False, False, False, False, False]


@pytest.mark.parametrize("attention", ["blockwise", "dense"])
def test_shared_step_equals_whole(attention):
    """The step's loss (sum / count) and gradients over the shared layout equal those of the same
    sequences packed whole within 1e-6, the token counts are identical, and the per-token
    log-probs restored to the sequences equal on every trained token within 1e-5."""
    seqs = sequences(np.random.default_rng(2))
    model = init_model(preset("tiny", attention=attention, attention_block=16), seed=0)
    step = TrainStep(model, OptimizerConfig(learning_rate=1e-3), sft_loss, HEAD)
    params = step.init_state().params
    whole = pack(seqs, width=96)
    whole_plan = micro_batch_plan(whole, 1, max_tokens=2 * 96)
    shared = share_prompts(seqs, max_length=whole.input_ids.shape[1])
    laid = pack(shared.sequences, width=whole.input_ids.shape[1])  # as the RL trainer packs it
    plan = micro_batch_plan(laid, 1, max_tokens=2 * 96, shared=shared)
    batches = planned_micro_batches(laid, plan, model.config.vision)
    assert any(b.parent_ids is not None and b.parent_ids.any() for b in batches)
    assert sum(plan.lengths) == sum(whole_plan.lengths) - shared.shared_tokens < sum(whole_plan.lengths)

    reference = summed_gradients(step, params, planned_micro_batches(whole, whole_plan, model.config.vision))
    assert_same_step(step, params, batches, reference, sum(int(s.loss_mask.sum()) for s in seqs))

    reference = whole_plan.merge(step.logprobs_many(params, planned_micro_batches(
        whole, whole_plan, model.config.vision)), whole.input_ids.shape[1])
    restored = shared.restore(plan.merge(step.logprobs_many(params, batches), laid.input_ids.shape[1]),
                              whole.input_ids.shape[1])
    trained = whole.loss_mask.astype(bool)
    np.testing.assert_allclose(restored[trained], reference[trained], atol=1e-5, rtol=0)


def test_share_prompts_needs_token_budget_rows():
    with pytest.raises(ValueError, match="share_prompts"):
        RLConfig(share_prompts=True)
    with pytest.raises(ValueError, match="token-budget"):
        seqs = sequences(np.random.default_rng(3))
        shared = share_prompts(seqs)
        micro_batch_plan(pack(shared.sequences), 1, shared=shared)


def test_a_step_of_one_micro_batch_compiles_the_sums_of_two():
    """Shared prompts leave a step 1 or 2 micro-batches: the first step, of one, also compiles
    what sums two (and merges their metrics), so a later step of two compiles nothing."""
    from paravt_jax.train import compiles

    seqs = sequences(np.random.default_rng(4))
    model = init_model(preset("tiny", attention_block=16), seed=0)
    step = TrainStep(model, OptimizerConfig(learning_rate=1e-3), sft_loss, HEAD)
    state = step.init_state()
    packed = pack(seqs, width=96)
    batch = planned_micro_batches(packed, micro_batch_plan(packed, 1, max_tokens=2 * 96), model.config.vision)[0]
    compiles.install()
    state, one = step.step(state, [batch])
    before = compiles.snapshot()
    state, two = step.step(state, [batch, batch])  # the same shapes twice: no new pass program
    assert before.since().count == 0 and two["loss_tokens"] == 2 * one["loss_tokens"] > 0
