"""Decoupled PPO-clip loss and (sum, count) accumulation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paravt_jax.rl.loss import ppo_loss
from paravt_jax.train.stats import RunningMax, WeightedMean, finalize_stats, merge_stats


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _random_batch(rng, n=8, t=6):
    prox = rng.normal(-1.5, 0.5, size=(n, t))
    logp = prox + rng.normal(0.0, 0.15, size=(n, t))
    behaviour = prox + rng.normal(0.0, 0.6, size=(n, t))
    adv = rng.normal(0.0, 1.0, size=(n, t))
    mask = (rng.random((n, t)) < 0.7).astype(np.int32)
    mask[:, 0] = 1
    return logp, prox, behaviour, adv, mask


def test_hand_computed_tokens():
    # Four loss tokens (+ one masked), eps 0.2, cap 5, prox = behaviour except token 3.
    #   tok0: A=+1, ratio e^0.1=1.10517 (inside)          -> loss -1.10517
    #   tok1: A=+2, ratio e^0.5=1.64872 > 1.2 (clipped)   -> loss -2 * 1.2 = -2.4
    #   tok2: A=-1, ratio e^-0.5=0.60653 < 0.8 (clipped)  -> loss -(-1 * 0.8) = 0.8
    #   tok3: A=+1, ratio 1, behaviour weight e^1.8=6.05 > 5 (capped) -> loss 0
    #   tok4: masked out (garbage logp = -inf must not matter)
    logp = np.array([[0.1, 0.5, -0.5, 0.0, -np.inf]])
    prox = np.zeros((1, 5))
    behaviour = np.array([[0.0, 0.0, 0.0, -1.8, 0.0]])
    adv = np.array([[1.0, 2.0, -1.0, 1.0, 3.0]])
    mask = np.array([[1, 1, 1, 1, 0]])
    loss_sum, count, metrics = ppo_loss(logp, prox, behaviour, adv, mask)
    np.testing.assert_allclose(float(loss_sum), -np.exp(0.1) - 2.4 + 0.8, rtol=1e-6)
    assert int(count) == 4                     # the capped token still counts
    stats = finalize_stats(metrics)
    np.testing.assert_allclose(float(stats["clip_frac"]), 2 / 4)
    np.testing.assert_allclose(float(stats["behaviour_capped_frac"]), 1 / 4)
    np.testing.assert_allclose(float(stats["behaviour_weight"]), 1.0)        # mean over kept tokens
    np.testing.assert_allclose(float(stats["behaviour_weight_max"]), np.exp(1.8), rtol=1e-6)
    np.testing.assert_allclose(float(stats["approx_kl"]), -(0.1 + 0.5 - 0.5 + 0.0) / 4, rtol=1e-6)
    k3 = sum(np.exp(v) - 1 - v for v in (0.1, 0.5, -0.5, 0.0)) / 4
    np.testing.assert_allclose(float(stats["approx_kl_k3"]), k3, rtol=1e-5)
    np.testing.assert_allclose(float(stats["loss"]), float(loss_sum) / 4, rtol=1e-6)

    grad = jax.grad(lambda lp: ppo_loss(lp, prox, behaviour, adv, mask)[0])(jnp.asarray(logp))
    # d/dlogp of -A * ratio is -A * ratio for the unclipped token; 0 for clipped, capped, masked.
    np.testing.assert_allclose(np.asarray(grad), [[-np.exp(0.1), 0.0, 0.0, 0.0, 0.0]], rtol=1e-6)


def test_clipping_gradients():
    # ratio 1.5 with A > 0 and ratio 0.5 with A < 0: clipped side -> zero gradient.
    # ratio 0.5 with A > 0 and ratio 1.5 with A < 0: unclipped side -> gradient -A * ratio.
    logp = np.log(np.array([[1.5, 0.5, 0.5, 1.5]]))
    prox = np.zeros_like(logp)
    adv = np.array([[1.0, -1.0, 1.0, -1.0]])
    mask = np.ones_like(adv)
    grad = jax.grad(lambda lp: ppo_loss(lp, prox, None, adv, mask)[0])(jnp.asarray(logp, jnp.float32))
    np.testing.assert_allclose(np.asarray(grad), [[0.0, 0.0, -0.5, 1.5]], rtol=1e-6)
    # Asymmetric clip: eps_clip_high 0.6 lets ratio 1.5 (A > 0) through: gradient -1.5.
    grad_hi = jax.grad(lambda lp: ppo_loss(lp, prox, None, adv, mask, eps_clip_high=0.6)[0])(
        jnp.asarray(logp, jnp.float32))
    np.testing.assert_allclose(np.asarray(grad_hi), [[-1.5, 0.0, -0.5, 1.5]], rtol=1e-6)
    # Dual clip (c = 3): A = -1, ratio 4 -> loss min(4, 3) = 3 -> zero gradient.
    lp4 = jnp.log(jnp.array([[4.0]]))
    g4 = jax.grad(lambda lp: ppo_loss(lp, jnp.zeros((1, 1)), None, jnp.array([[-1.0]]), jnp.ones((1, 1)),
                                      c_clip=3.0)[0])(lp4)
    np.testing.assert_allclose(np.asarray(g4), [[0.0]])


def test_behaviour_cap_masks_tokens():
    # Behaviour weight exp(prox - behaviour): 2 on token 0 (kept, scales the loss), 6 on
    # token 1 (> 5: no loss, no gradient, but counted).
    logp = jnp.zeros((1, 2))
    prox = jnp.zeros((1, 2))
    behaviour = -jnp.log(jnp.array([[2.0, 6.0]]))
    adv = jnp.array([[1.0, 1.0]])
    mask = jnp.ones((1, 2))
    loss_sum, count, metrics = ppo_loss(logp, prox, behaviour, adv, mask)
    np.testing.assert_allclose(float(loss_sum), -2.0, rtol=1e-6)
    assert int(count) == 2
    grad = jax.grad(lambda lp: ppo_loss(lp, prox, behaviour, adv, mask)[0])(logp)
    np.testing.assert_allclose(np.asarray(grad), [[-2.0, 0.0]], rtol=1e-6)
    # Without a cap both tokens count: -(2 + 6).
    np.testing.assert_allclose(float(ppo_loss(logp, prox, behaviour, adv, mask, behaviour_cap=None)[0]), -8.0,
                               rtol=1e-6)


def test_gradient_matches_finite_differences(x64):
    rng = np.random.default_rng(0)
    logp, prox, behaviour, adv, mask = _random_batch(rng)

    @jax.jit
    def f(lp):
        s, c, _ = ppo_loss(lp, prox, behaviour, adv, mask)
        return s / c

    grad = np.asarray(jax.grad(f)(jnp.asarray(logp)))
    assert grad.dtype == np.float64
    h = 1e-6
    fd = np.zeros_like(logp)
    for idx in np.ndindex(*logp.shape):
        up, down = logp.copy(), logp.copy()
        up[idx] += h
        down[idx] -= h
        fd[idx] = (float(f(jnp.asarray(up))) - float(f(jnp.asarray(down)))) / (2 * h)
    np.testing.assert_allclose(grad, fd, atol=1e-7)
    assert np.count_nonzero(grad) > 10           # the check is not vacuous
    assert np.all(grad[mask == 0] == 0)


def test_micro_batch_accumulation_equals_full_batch():
    rng = np.random.default_rng(1)
    logp, prox, behaviour, adv, mask = _random_batch(rng, n=8, t=6)
    args = [jnp.asarray(a, jnp.float32) for a in (prox, behaviour, adv, mask)]
    lp = jnp.asarray(logp, jnp.float32)
    loss_fn = jax.jit(ppo_loss)
    grad_fn = jax.jit(jax.grad(lambda x, *a: ppo_loss(x, *a)[0]))
    full_sum, full_count, full_metrics = loss_fn(lp, *args)
    full_grad = grad_fn(lp, *args)

    total, count, stats, grads = 0.0, 0, None, []
    for i in range(4):
        sl = slice(2 * i, 2 * i + 2)
        mb = [a[sl] for a in args]
        s, c, m = loss_fn(lp[sl], *mb)
        total, count = total + s, count + c
        stats = m if stats is None else merge_stats(stats, m)
        grads.append(grad_fn(lp[sl], *mb))
    assert int(count) == int(full_count) == int(mask.sum())
    np.testing.assert_allclose(float(total / count), float(full_sum / full_count), rtol=1e-5)
    np.testing.assert_allclose(np.concatenate(grads) / int(count), np.asarray(full_grad) / int(full_count),
                               atol=1e-6)
    a, b = finalize_stats(stats), finalize_stats(full_metrics)
    for k in b:
        np.testing.assert_allclose(float(a[k]), float(b[k]), rtol=1e-5, atol=1e-7, err_msg=k)


def test_stat_helpers():
    w = WeightedMean(jnp.array(3.0), jnp.array(2)).merge(WeightedMean(jnp.array(5.0), jnp.array(6)))
    np.testing.assert_allclose(float(w.value), 1.0)
    np.testing.assert_allclose(float(WeightedMean(jnp.array(0.0), jnp.array(0)).value), 0.0)
    m = RunningMax(jnp.array(2.0), jnp.array(3)).merge(RunningMax(jnp.array(-jnp.inf), jnp.array(0)))
    np.testing.assert_allclose(float(m.value), 2.0)
    np.testing.assert_allclose(float(RunningMax(jnp.array(-jnp.inf), jnp.array(0)).value), 0.0)
    with pytest.raises(ValueError):
        merge_stats({"a": w}, {"b": w})
    # Stats are pytrees: they go through jit.
    out = jax.jit(lambda *a: ppo_loss(*a)[2])(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.zeros((1, 2)),
                                             jnp.ones((1, 2)), jnp.ones((1, 2)))
    assert isinstance(out["clip_frac"], WeightedMean) and isinstance(out["behaviour_weight_max"], RunningMax)


def test_clip_bound_tie_passes_the_gradient_as_torch_clamp():
    """A ratio exactly on a clip bound: both branches are equal, each gets half of the gradient
    (max ties), and the clipped branch passes its half as torch.clamp does (jnp.clip would not):
    the total is the unclipped gradient -A * ratio, not half of it."""
    ratio = float(jnp.exp(jnp.float32(0.25)))
    eps = ratio - 1.0  # so that 1 + eps is exactly the float32 ratio
    logp = jnp.full((1, 2), 0.25, jnp.float32)
    prox = jnp.zeros((1, 2), jnp.float32)
    adv = jnp.array([[1.0, 2.0]], jnp.float32)
    loss = lambda lp: ppo_loss(lp, prox, None, adv, jnp.ones((1, 2)), eps_clip=eps)
    _, _, metrics = loss(logp)
    assert float(metrics["importance_ratio"].total) / 2 == ratio == np.float32(1.0 + eps)
    grad = jax.grad(lambda lp: loss(lp)[0])(logp)
    np.testing.assert_allclose(np.asarray(grad), [[-ratio, -2.0 * ratio]], rtol=1e-6)
