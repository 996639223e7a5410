"""sft.cache_vision_features: a frozen vision tower's features computed once per example and fed
to the train step in place of pixels (paravt_jax/sft/vision_cache.py, train/batch.py
shard_features): the same loss and gradients as the pixels' pass, the shapes the pixels' pass
gives, each example encoded once, a bounded cache, and refusals for a tower that trains."""
import dataclasses

import jax
import numpy as np
import pytest

from paravt_jax.config import ConfigValueError
from paravt_jax.data import synthetic as syn
from paravt_jax.data.paravt_parquet import load_sft_rows
from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl import init_model, preset
from paravt_jax.sft.objective import HEAD, sft_loss
from paravt_jax.sft.trainer import SFTConfig, train_sft
from paravt_jax.sft.vision_cache import VisionFeatureCache, plan_calls, vision_items, without_pixels
from paravt_jax.text import chat
from paravt_jax.text.inputs import encode, encode_ids
from paravt_jax.text.tokenizer import train_tokenizer
from paravt_jax.train.batch import micro_batch_plan, pack, planned_micro_batches
from paravt_jax.train.step import OptimizerConfig, TrainStep, tower_frozen

FROZEN = OptimizerConfig(learning_rate=1e-3, weight_decay=0.0, frozen=("visual",))


@pytest.fixture(scope="module")
def sequences():
    """Eight sequences: odd ones with 2 or 3 frames (two sizes among them), even ones text only."""
    tok = train_tokenizer(["the red circle appears at twelve seconds"] * 20)
    rng = np.random.default_rng(0)
    out = []
    for i in range(8):
        if i % 2:
            size = (32, 64) if i % 4 == 1 else (64, 32)
            frames = (rng.random((2 + i % 3, *size, 3)) * 255).astype(np.uint8)
            prompt = encode(chat.render(chat.paravt_messages("q?", frames, list(range(len(frames))), tools=()),
                                        add_generation_prompt=True), tok)
        else:
            prompt = encode_ids(rng.integers(0, 900, 6 + i).tolist(), 0, trainable=False)
        out.append(prompt.extend(encode_ids(rng.integers(0, 900, 5).tolist(), prompt.next_position, True)))
    return out


def cached(model, sequences, frames=4, max_bytes=0):
    cache = VisionFeatureCache(model.visual, frames, max_bytes=max_bytes)
    found, encoded = cache.features(list(enumerate(sequences)), lambda: model.visual)
    return cache, [found.get(i) for i in range(len(sequences))], encoded


def test_plan_calls_fills_each_call_up_to_its_frames_per_size():
    grids = [np.array([[1, 2, 4]] * 3), np.array([[1, 4, 2]] * 2), np.array([[1, 2, 4]] * 2),
             np.array([[1, 2, 4]] * 6), np.array([[1, 4, 2]])]
    assert plan_calls(grids, 4) == [[0, 1], [2], [3], [4]]
    assert plan_calls(grids, 16) == [[0, 1, 2, 3, 4]]
    assert plan_calls([], 4) == []


def test_features_feed_the_step_as_the_pixels_do(sequences):
    """Log-probs, loss and gradients from the cached features equal the pixels' pass (the tower
    is the same function of each frame: its attention stays within a frame), with the arrays in
    the shapes the pixels' pass gives the decoder: one flat pass and the fixed-frames floor."""
    model = init_model(preset("tiny"), seed=3)
    step = TrainStep(model, FROZEN, sft_loss, HEAD)
    state = step.init_state()
    cache, features, encoded = cached(model, sequences)
    assert [f is None for f in features] == [i % 2 == 0 for i in range(8)]
    # frames (size A, size B): (3, 0), (0, 2), (4, 0), (0, 3): two calls, [(3, 0), (0, 2)] and
    # [(4, 0), (0, 3)], each padded to 4 frames of both sizes
    assert encoded == 16
    packed = pack(sequences)
    plan = micro_batch_plan(packed, 2)
    pixels = planned_micro_batches(packed, plan, model.config.vision, min_frames=16)
    fed = planned_micro_batches(packed, plan, model.config.vision, min_frames=16, features=features)
    for a, b in zip(pixels, fed):
        assert b.pixel_values is None and b.vision_meta is None
        np.testing.assert_array_equal(a.visual_index, b.visual_index)
        embeds, deepstack = model.encode_vision(a.pixel_values, *a.vision_meta)
        assert b.visual_embeds.shape == embeds.shape and b.visual_deepstack.shape == deepstack.shape
        np.testing.assert_allclose(np.asarray(step.logprobs(state.params, a)),
                                   np.asarray(step.logprobs(state.params, b)), atol=1e-5)
    (g1, t1, n1), _ = step._gradients(state.params, pixels)
    (g2, t2, n2), _ = step._gradients(state.params, fed)
    assert int(n1) == int(n2)
    np.testing.assert_allclose(float(t1), float(t2), rtol=1e-6)
    # float32 sums in another order: on an AVX2 host one element of 64,000 differed by 1.05e-6
    # (2026-12-07), just past 1e-6
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=2e-6)


def test_features_in_vision_shards_on_a_mesh(sequences):
    """With a mesh splitting the rows over 4 batch devices, the features go in shards as the
    pixels do (each device its own rows' features) and give the same log-probs."""
    mesh = sh.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    model = init_model(preset("tiny"), seed=3, mesh=mesh)
    step = TrainStep(model, FROZEN, sft_loss, HEAD, mesh=mesh)
    state = step.init_state()
    cache = VisionFeatureCache(model.visual, 4, mesh=mesh)
    found, _ = cache.features(list(enumerate(sequences)), lambda: model.visual)
    packed = pack(sequences)
    plan = micro_batch_plan(packed, 1)
    pixels = planned_micro_batches(packed, plan, model.config.vision, vision_shards=4)[0]
    fed = planned_micro_batches(packed, plan, model.config.vision, vision_shards=4,
                                features=[found.get(i) for i in range(8)])[0]
    assert pixels.pixel_values.shape[0] == fed.visual_embeds.shape[0] == fed.visual_deepstack.shape[1] == 4
    placed = step._place(fed)["visual_embeds"]
    assert placed.sharding.shard_shape(placed.shape)[0] == 1  # one shard of features per batch device
    np.testing.assert_allclose(np.asarray(step.logprobs(state.params, pixels)),
                               np.asarray(step.logprobs(state.params, fed)), atol=1e-5)


def test_a_bounded_cache_encodes_again_what_it_did_not_keep(sequences):
    """Past `max_bytes` an example's features are returned but not kept: its next use encodes
    it again, in the same call as before (alone), to the same bits."""
    model = init_model(preset("tiny"), seed=3)
    first = VisionFeatureCache(model.visual, 4).features([(1, sequences[1])], lambda: model.visual)[0][1]
    cache = VisionFeatureCache(model.visual, 4, max_bytes=first.nbytes)
    assert cache.features([(1, sequences[1])], lambda: model.visual)[1] == 4  # sequence 1: 3 frames of one size
    found, encoded = cache.features([(1, sequences[1]), (3, sequences[3])], lambda: model.visual)
    assert 1 in cache and 3 not in cache and cache.bytes == first.nbytes and encoded == 4  # only 3's frames
    again, encoded = cache.features([(3, sequences[3])], lambda: model.visual)
    assert encoded == 4 and 3 not in cache
    np.testing.assert_array_equal(found[3].embeds, again[3].embeds)
    np.testing.assert_array_equal(found[3].deepstack, again[3].deepstack)
    np.testing.assert_array_equal(found[1].embeds, first.embeds)  # kept from its own call
    assert len(vision_items(without_pixels(sequences[1]))[0]) == 0


def test_features_are_refused_for_a_tower_that_trains(sequences):
    model = init_model(preset("tiny"), seed=3)
    _, features, _ = cached(model, sequences)
    packed = pack(sequences)
    batch = planned_micro_batches(packed, micro_batch_plan(packed, 1), model.config.vision, features=features)
    trained = TrainStep(model, OptimizerConfig(frozen=("visual.blocks",)), sft_loss, HEAD)
    assert not trained.vision_frozen and tower_frozen(trained.params, ("visual",))
    with pytest.raises(ValueError, match="vision tower is trained"):
        trained.step(trained.init_state(), batch)
    with pytest.raises(ConfigValueError, match="cache_vision_features"):
        SFTConfig(cache_vision_features=True)
    config = SFTConfig(cache_vision_features=True, optimizer=OptimizerConfig(frozen=("visual.blocks",)))
    with pytest.raises(ValueError, match="leaves some trained"):
        train_sft(model, None, [], "", "", config)
    cache = VisionFeatureCache(model.visual, 4)
    other = init_model(preset("tiny"), seed=4)
    cache.check(model.visual)
    with pytest.raises(ValueError, match="weights changed"):
        cache.check(other.visual)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("data"))
    ds = syn.write_dataset(root, num_train=2, num_eval=1, durations=(30.0,), seed=2, height=96, width=160)
    rows, _ = load_sft_rows(ds.sft, root)
    return root, rows, train_tokenizer(syn.corpus(list(ds.questions) + list(ds.eval_questions)))


def test_cached_sft_trains_as_the_pixels_do_and_encodes_each_example_once(dataset, tmp_path):
    """The same SFT run with and without the cache: the same losses (to float noise: the
    features are computed in other calls), every example encoded on its first use only, its
    features kept in host memory, and one step program either way."""
    root, rows, tok = dataset
    config = SFTConfig(steps=2 * len(rows) // 2, batch_size=2, nframes=2, max_pixels=64 * 96, seed=1,
                       max_tokens_per_micro_batch=1024, train_width=512, train_frames=16, optimizer=FROZEN)
    runs = {}
    for on in (False, True):
        _, result = train_sft(init_model(preset("tiny"), seed=1), tok, rows, root, str(tmp_path / str(on)),
                              dataclasses.replace(config, cache_vision_features=on))
        runs[on] = result.history
    plain, fed = runs[False], runs[True]
    np.testing.assert_allclose([h["loss"] for h in plain], [h["loss"] for h in fed], rtol=2e-5)
    assert [h["loss_tokens"] for h in plain] == [h["loss_tokens"] for h in fed]
    encoded = [h["vision_frames_encoded"] for h in fed]
    epoch = len(rows) // 2  # the steps that draw every row once
    assert all(n > 0 for n in encoded[:1]) and encoded[epoch:] == [0] * (len(fed) - epoch), encoded
    assert fed[-1]["vision_cache_mib"] > 0 and "vision_cache_mib" not in plain[-1]
    assert [h["compiles"] for h in fed[epoch:]] == [0] * (len(fed) - epoch)
