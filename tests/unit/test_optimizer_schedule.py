"""The optimizer's learning-rate schedules, read from the updates Adam makes on a constant
gradient (each update is -rate while the moments are the gradient's)."""
import jax.numpy as jnp
import numpy as np
import pytest

from paravt_jax.config import ConfigValueError
from paravt_jax.train.step import OptimizerConfig, make_optimizer


def rates(cfg: OptimizerConfig, steps: int) -> np.ndarray:
    tx = make_optimizer(cfg)
    params = {"w": jnp.zeros(())}
    state = tx.init(params)
    out = []
    for _ in range(steps):
        updates, state = tx.update({"w": jnp.ones(())}, state, params)
        out.append(-float(updates["w"]))
    return np.asarray(out)


def test_wsd_warms_up_holds_then_decays_linearly_to_zero_at_total_steps():
    cfg = OptimizerConfig(name="adam", learning_rate=2e-3, grad_clip=1e9, eps=1e-12, warmup_steps=4,
                          schedule="wsd", total_steps=20, decay_steps=8)
    got = rates(cfg, 22)
    lr = 2e-3
    want = [lr * t / 4 for t in range(4)] + [lr] * 8 + [lr * (1 - t / 8) for t in range(8)] + [0.0, 0.0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9)


def test_constant_and_cosine_keep_their_shapes():
    constant = rates(OptimizerConfig(name="adam", learning_rate=1e-3, grad_clip=1e9, eps=1e-12, warmup_steps=2), 5)
    np.testing.assert_allclose(constant, [0.0, 5e-4, 1e-3, 1e-3, 1e-3], rtol=1e-5, atol=1e-9)
    cosine = rates(OptimizerConfig(name="adam", learning_rate=1e-3, grad_clip=1e9, eps=1e-12, warmup_steps=2,
                                   schedule="cosine", total_steps=10), 11)
    assert cosine[2] == pytest.approx(1e-3, rel=1e-5) and cosine[10] == pytest.approx(0.0, abs=1e-9)
    assert np.all(np.diff(cosine[2:]) <= 1e-12)


@pytest.mark.parametrize("decay_steps", [0, 17])
def test_wsd_refuses_a_decay_outside_the_steps_after_warm_up(decay_steps):
    with pytest.raises(ConfigValueError, match=f"decay_steps={decay_steps}: the wsd schedule decays over 1 to "
                                               "total_steps - warmup_steps = 16 steps"):
        OptimizerConfig(schedule="wsd", total_steps=20, warmup_steps=4, decay_steps=decay_steps)
