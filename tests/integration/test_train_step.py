"""The training engine (paravt_jax.train.step) with the PARA-GRPO and SFT losses, on the tiny model."""

import jax
import numpy as np
import pytest

from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl import init_model, preset
from paravt_jax.rl.objective import StepConfig, policy_head, policy_loss
from paravt_jax.sft.objective import HEAD, sft_loss
from paravt_jax.text import chat
from paravt_jax.text.inputs import encode, encode_ids
from paravt_jax.text.tokenizer import train_tokenizer
from paravt_jax.train import compiles
from paravt_jax.train.batch import micro_batches, pack
from paravt_jax.train.step import OptimizerConfig, TrainStep, token_scores


@pytest.fixture(scope="module")
def sequences():
    tok = train_tokenizer(["the red circle appears at twelve seconds"] * 20)
    rng = np.random.default_rng(0)
    frames = (rng.random((2, 32, 64, 3)) * 255).astype(np.uint8)
    out = []
    for i in range(8):
        if i % 2:
            prompt = encode(chat.render(chat.paravt_messages("q?", frames, [0.0, 1.0], tools=()),
                                        add_generation_prompt=True), tok)
        else:
            prompt = encode_ids(rng.integers(0, 900, 6 + i).tolist(), 0, trainable=False)
        out.append(prompt.extend(encode_ids(rng.integers(0, 900, 5).tolist(), prompt.next_position, True)))
    return out


def policy_step(model, optimizer=OptimizerConfig(learning_rate=1e-3), config=StepConfig(), **kwargs):
    return TrainStep(model, optimizer, policy_loss(config), policy_head(config), **kwargs)


def make(model, sequences, advantages, step, num_micro=1, behaviour=None):
    """Policy micro-batches; the proximal log-probs are recomputed by `update`, as the RL trainer does."""
    packed = pack(sequences, {"behaviour_logp": behaviour} if behaviour is not None else None)
    adv = np.zeros(packed.input_ids.shape, np.float32) + np.asarray(advantages, np.float32)[:, None]
    behaviour = packed.extras.get("behaviour_logp", np.zeros(packed.input_ids.shape, np.float32))
    return packed, micro_batches(packed, num_micro, model.config.vision,
                                 {"advantages": adv * packed.loss_mask, "behaviour_logp": behaviour})


def update(step, state, batches):
    return step.step(state, [b.with_extras(prox_logp=step.logprobs(state.params, b)) for b in batches])


def current_logp(step, state, packed, model):
    batch = micro_batches(packed, 1, model.config.vision)[0]
    return np.asarray(step.logprobs(state.params, batch))


def test_logprobs_match_full_forward(sequences):
    model = init_model(preset("tiny"), seed=1)
    step = policy_step(model, config=StepConfig(temperature=0.7, logprob_chunk=8))
    packed = pack(sequences)
    lp = current_logp(step, step.init_state(), packed, model)
    for b, seq in enumerate(sequences):
        logits = np.asarray(model(**seq.model_kwargs()).logits)[0].astype(np.float64) / 0.7
        logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        want = logits[np.arange(seq.length - 1), seq.input_ids[1:]] - logz[:-1]
        np.testing.assert_allclose(lp[b, 1:seq.length], want, atol=2e-5)


def test_head_entropy_and_sft_loss_match_full_forward(sequences):
    """The one token head: its entropies under the policy head and the SFT loss on its
    log-probs equal what the full [B, T, vocab] logits give."""
    model = init_model(preset("tiny"), seed=1)
    batch = micro_batches(pack(sequences), 1, model.config.vision)[0]
    policy = policy_step(model, config=StepConfig(temperature=0.7, logprob_chunk=8))
    scores = token_scores(model, batch.device_tree(), policy.head)
    sft = TrainStep(model, OptimizerConfig(), sft_loss, HEAD)
    total, count, metrics = sft_loss(token_scores(model, batch.device_tree(), sft.head), batch.device_tree())
    want_nll = 0.0
    for b, seq in enumerate(sequences):
        logits = np.asarray(model(**seq.model_kwargs()).logits)[0].astype(np.float64)
        for temperature in (0.7, 1.0):
            z = logits / temperature
            logp = z - z.max(-1, keepdims=True)
            logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
            if temperature == 0.7:
                entropy = -(np.exp(logp) * logp).sum(-1)
                np.testing.assert_allclose(np.asarray(scores.entropy)[b, 1:seq.length], entropy[:-1], atol=5e-5)
            else:
                picked = logp[np.arange(seq.length - 1), seq.input_ids[1:]]
                want_nll -= (picked * batch.loss_mask[b, 1:seq.length]).sum()
    assert int(count) == int(batch.loss_mask.sum())
    np.testing.assert_allclose(float(total), want_nll, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["nll"].value), want_nll / int(count), rtol=1e-5)


def test_reference_logprobs_use_the_reference_temperature(sequences):
    """The KL term's reference log-probs at StepConfig.reference_temperature (the recipe: 1.0,
    passed by the RL trainer) while the behaviour policy samples at 0.7; the default keeps the
    head's temperature."""
    model = init_model(preset("tiny"), seed=1)
    packed = pack(sequences[:2])
    batch = micro_batches(packed, 1, model.config.vision)[0]
    step = policy_step(model, config=StepConfig(temperature=0.7, reference_temperature=1.0), keep_reference=True)
    params = step.init_state().params
    at_one, at_sampling = np.asarray(step.logprobs(params, batch, 1.0)), np.asarray(step.logprobs(params, batch))
    np.testing.assert_array_equal(np.asarray(step.reference_logprobs(batch, 1.0)), at_one)
    np.testing.assert_array_equal(np.asarray(step.reference_logprobs(batch)), at_sampling)
    m = packed.loss_mask > 0
    assert np.abs(at_one[m] - at_sampling[m]).min() > 1e-4


def test_concurrent_micro_batch_passes_give_the_same_bits(sequences):
    """Three micro-batch passes at once on host threads (TrainStep's `concurrent`, the toy
    preset's sft.concurrent_micro_batches): the same log-probs, gradients, update and metrics as one
    at a time, bit for bit, over micro-batches of two shapes (with and without frames); as many
    programs compiled as serially."""
    model = init_model(preset("tiny"), seed=2)
    parts = [make(model, sequences[k::2], [1.0, -0.5, 0.25, -1.0], None, num_micro=2)[1] for k in (0, 1)]
    batches = [parts[0][0], parts[1][0], parts[0][1], parts[1][1], parts[1][0]]
    assert len({b.input_ids.shape for b in batches}) == 2
    results = {}
    for concurrent in (1, 1, 3):  # the first run compiles the eager operations both share
        step = policy_step(model, keep_reference=True, concurrent=concurrent)
        state = step.init_state()
        before = compiles.snapshot()
        prox = jax.block_until_ready(step.logprobs_many(state.params, batches))
        reference = jax.block_until_ready(step.logprobs_many(step.reference_params, batches, 1.0))
        state, metrics = step.step(state, [b.with_extras(prox_logp=p) for b, p in zip(batches, prox)])
        leaves = [np.asarray(x) for x in jax.tree.leaves((prox, reference, state))]
        results[concurrent] = (leaves, metrics, before.since().count)
    (serial, serial_metrics, serial_compiles), (threaded, threaded_metrics, threaded_compiles) = results[1], results[3]
    assert len(serial) == len(threaded)
    for a, b in zip(serial, threaded):
        np.testing.assert_array_equal(a, b)
    timings = ("grads_s", "update_s")
    assert {k: v for k, v in serial_metrics.items() if k not in timings} == \
        {k: v for k, v in threaded_metrics.items() if k not in timings}
    assert serial_compiles == threaded_compiles > 0


def test_concurrent_passes_compile_a_new_program_once():
    """Four passes at once of one new program: compiled once (JAX's compile waits for the
    first thread's), each result that of a pass alone."""
    step = policy_step(init_model(preset("tiny"), seed=2), concurrent=4)

    @jax.jit
    def chain(x):
        for _ in range(100):
            x = jax.numpy.sin(x) @ x
        return x

    before = compiles.snapshot()
    out = step.passes(chain, [np.full((32, 32), i / 100, np.float32) for i in range(4)])
    assert before.since().count == 1
    np.testing.assert_array_equal(np.asarray(out[2]), np.asarray(chain(np.full((32, 32), 0.02, np.float32))))


def test_concurrent_passes_are_refused_on_a_multi_device_mesh():
    """Sharded programs must start in one order on every process and device: refused, named."""
    model = init_model(preset("tiny"), seed=2)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("fsdp",))
    with pytest.raises(ValueError, match="concurrent=2 micro-batch passes need the step on one device"):
        policy_step(model, mesh=mesh, concurrent=2)
    with pytest.raises(ValueError, match="concurrent=0"):
        policy_step(model, concurrent=0)


def test_one_step_moves_logprobs_by_advantage_sign(sequences):
    model = init_model(preset("tiny"), seed=2)
    step = policy_step(model, OptimizerConfig(learning_rate=3e-3, weight_decay=0.0), keep_reference=True)
    state = step.init_state()
    packed0 = pack(sequences)
    before = current_logp(step, state, packed0, model)
    behaviour = [before[b, :s.length] for b, s in enumerate(sequences)]
    advantages = [1.0, -1.0] * 4
    packed, batches = make(model, sequences, advantages, step, behaviour=behaviour)
    state, metrics = update(step, state, batches)
    assert not metrics["skipped"] and metrics["loss_tokens"] == 40 and metrics["grad_norm"] > 0
    assert 0 < metrics["entropy"] < np.log(1000) + 1e-3
    after = current_logp(step, state, packed, model)
    reference = np.asarray(step.reference_logprobs(batches[0]))
    np.testing.assert_allclose(reference, before, atol=1e-6)  # frozen at the initial policy
    assert np.abs(after - reference).max() > 1e-4
    m = packed.loss_mask.astype(bool)
    delta = np.array([(after[b] - before[b])[m[b]].mean() for b in range(8)])
    assert np.all(delta[0::2] > 0) and np.all(delta[1::2] < 0), delta


def test_micro_batch_accumulation_equals_one_batch(sequences):
    def run(num_micro):
        model = init_model(preset("tiny"), seed=3)
        step = policy_step(model)
        state = step.init_state()
        rng = np.random.default_rng(1)
        _, batches = make(model, sequences, rng.standard_normal(8), step, num_micro)
        state, metrics = update(step, state, batches)
        return jax.tree.map(np.asarray, state.params), metrics

    one, m1 = run(1)
    four, m4 = run(4)
    assert m1["loss_tokens"] == m4["loss_tokens"]
    np.testing.assert_allclose(m1["loss"], m4["loss"], atol=1e-6)
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(four)):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_sharded_step_equals_single_device(sequences):
    def run(mesh):
        model = init_model(preset("tiny"), seed=4, mesh=mesh)
        step = policy_step(model, mesh=mesh)
        state = step.init_state()
        _, batches = make(model, sequences, np.linspace(-1, 1, 8), step, 2)
        state, metrics = update(step, state, batches)
        return state, metrics

    single, m1 = run(None)
    mesh = sh.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    sharded, m8 = run(mesh)
    q = sharded.params["language"]["layers"]["q_proj"][...]
    assert len(q.sharding.device_set) == 8
    np.testing.assert_allclose(m1["loss"], m8["loss"], atol=1e-5)
    for a, b in zip(jax.tree.leaves(single.params), jax.tree.leaves(sharded.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_vision_in_shards_equals_one_replicated_pass(sequences):
    """A micro-batch's frames encoded per shard of rows (each batch device its own rows' frames,
    shards without frames padded with blank ones) give the log-probs, loss and gradients of one
    replicated vision pass over every frame."""
    mesh = sh.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    model = init_model(preset("tiny"), seed=5, mesh=mesh)
    step = policy_step(model, mesh=mesh)
    state = step.init_state()
    packed = pack(sequences)
    adv = (np.linspace(-1, 1, 8)[:, None] * packed.loss_mask).astype(np.float32)
    extras = {"advantages": adv, "behaviour_logp": np.zeros(packed.input_ids.shape, np.float32)}
    flat = micro_batches(packed, 2, model.config.vision, extras)
    sharded = micro_batches(packed, 2, model.config.vision, extras, vision_shards=4)
    assert flat[0].pixel_values.ndim == 2 and sharded[0].pixel_values.shape[0] == 4
    # rows 1 and 3 of each micro-batch hold frames: shards 0 and 2 encode blank frames only
    assert (sharded[0].visual_index[0] < 0).all() and (sharded[0].visual_index[1] >= 0).any()
    encoded = step._place(sharded[0])["pixel_values"]
    assert encoded.sharding.shard_shape(encoded.shape)[0] == 1  # one shard of frames per batch device
    for a, b in zip(flat, sharded):
        np.testing.assert_allclose(np.asarray(step.logprobs(state.params, a)),
                                   np.asarray(step.logprobs(state.params, b)), atol=1e-5)
    with_prox = lambda batches: [b.with_extras(prox_logp=step.logprobs(state.params, b)) for b in batches]
    (g1, t1, n1), _ = step._gradients(state.params, with_prox(flat))
    (g2, t2, n2), _ = step._gradients(state.params, with_prox(sharded))
    assert int(n1) == int(n2)
    np.testing.assert_allclose(float(t1), float(t2), atol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_non_finite_update_is_skipped(sequences):
    model = init_model(preset("tiny"), seed=5)
    step = policy_step(model)
    state = step.init_state()
    before = jax.tree.map(np.asarray, state.params)
    _, batches = make(model, sequences, [np.nan] + [1.0] * 7, step)
    state, metrics = update(step, state, batches)
    assert metrics["skipped"] and int(state.skipped) == 1
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(a, np.asarray(b))


def test_sft_objective_reduces_nll(sequences):
    model = init_model(preset("tiny"), seed=6)
    step = TrainStep(model, OptimizerConfig(learning_rate=1e-2, weight_decay=0.0), sft_loss, HEAD)
    state = step.init_state()
    batches = micro_batches(pack(sequences), 1, model.config.vision)
    losses = []
    for _ in range(3):
        state, metrics = step.step(state, batches)
        losses.append(metrics["loss"])
    assert losses[-1] < losses[0] - 0.1, losses


def test_frozen_parameters_stay_and_the_rest_train(sequences):
    """optimizer.frozen: the vision tower takes no gradient and keeps its initial values (weight
    decay included) while the text tower moves; a prefix that names no parameter is refused."""
    from paravt_jax.train.step import make_optimizer, parameter_path

    model = init_model(preset("tiny"), seed=6)
    step = TrainStep(model, OptimizerConfig(learning_rate=1e-2, weight_decay=0.1, frozen=("visual",)), sft_loss, HEAD)
    state = step.init_state()
    before = {parameter_path(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(state.params)}
    batches = micro_batches(pack(sequences), 1, model.config.vision)
    grads = step._grads(state.params, step._place(batches[0]))[0]
    grads = {parameter_path(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(grads)}
    assert not any(grads[k].any() for k in grads if k.startswith("visual."))
    assert grads["language.embed_tokens"].any()
    state, _ = step.step(state, batches)
    after = {parameter_path(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(state.params)}
    vision = [k for k in before if k.startswith("visual.")]
    assert vision and all(np.array_equal(before[k], after[k]) for k in vision)
    assert not np.array_equal(before["language.embed_tokens"], after["language.embed_tokens"])
    with pytest.raises(ValueError, match=r"optimizer.frozen \['vision'\]"):
        make_optimizer(OptimizerConfig(frozen=("vision",))).init(state.params)


def test_sharded_steps_compile_once(sequences):
    """After the first step, further steps with the same bucket compile nothing new (state
    shardings are stable across the donated update)."""
    mesh = sh.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    model = init_model(preset("tiny"), seed=4, mesh=mesh)
    step = policy_step(model, mesh=mesh)
    state = step.init_state()
    _, batches = make(model, sequences, np.linspace(-1, 1, 8), step, 2)
    counts = lambda: [f._cache_size() for f in (step._grads, step._apply, step._logprobs, step._add)]
    state, _ = update(step, state, batches)
    warm = counts()
    for _ in range(2):
        state, _ = update(step, state, batches)
    assert counts() == warm
    params = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_flatten_with_path(state.params)[0]}
    moments = [(jax.tree_util.keystr(k), v) for k, v in jax.tree_util.tree_flatten_with_path(state.opt_state)[0]
               if v.ndim >= 1]
    assert len(moments) == 2 * len(params)  # mu and nu, sharded like their parameters (not replicated)
    for key, x in moments:
        assert x.sharding.is_equivalent_to(params[key[key.find("['"):]].sharding, x.ndim), key


def test_proximal_logprobs_from_the_gradient_pass_equal_a_separate_pass(sequences):
    """One update per step: the weights of the gradient pass are the proximal policy, so
    `prox_logprobs="same_pass"` (its own log-probs under a stop-gradient) gives the update,
    loss and clip metrics of the reference's separate recomputation before the update."""
    model = init_model(preset("tiny"), seed=1)
    rng = np.random.default_rng(3)
    results = []
    for mode in ("recompute", "same_pass"):
        step = policy_step(model, config=StepConfig(prox_logprobs=mode))
        state = step.init_state()
        packed, batches = make(model, sequences, rng.normal(size=len(sequences)), step, num_micro=2)
        behaviour = [np.asarray(step.logprobs(state.params, b)) + 0.3 * b.loss_mask for b in batches]
        batches = [b.with_extras(behaviour_logp=beh) for b, beh in zip(batches, behaviour)]
        if mode == "recompute":
            batches = [b.with_extras(prox_logp=step.logprobs(state.params, b)) for b in batches]
        state, metrics = step.step(state, batches)
        results.append((jax.tree.leaves(state.params), metrics))
        rng = np.random.default_rng(3)
    (params_a, metrics_a), (params_b, metrics_b) = results
    for key in ("loss", "grad_norm", "importance_ratio", "behaviour_weight", "clip_frac"):
        np.testing.assert_allclose(float(metrics_b[key]), float(metrics_a[key]), rtol=1e-5, atol=1e-6, err_msg=key)
    assert float(metrics_a["behaviour_weight"]) < 0.9  # the behaviour term is exercised
    # Adam's first update divides each gradient element by its own size, so a last-bit difference
    # in a near-zero element moves that weight by a visible part of a step (2.9e-6 seen with
    # XLA:CPU's unoptimised code generation): the loss and clip metrics above carry the
    # comparison, the weights are compared at 1e-5.
    for a, b in zip(params_a, params_b):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5)


def test_proximal_logprobs_mode_is_checked():
    with pytest.raises(ValueError, match="prox_logprobs"):
        StepConfig(prox_logprobs="stale")
