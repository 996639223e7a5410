"""A train step's summed gradients over micro-batches, and the check that two layouts of the
same sequences give the same step (test_packing, test_shared_prompts)."""
import jax
import numpy as np


def summed_gradients(step, params, batches) -> tuple:
    """(gradients, loss sum, token count) summed over `batches` as TrainStep.step sums them."""
    acc = None
    for b in batches:
        g, total, n, _ = step._grads(params, step._place(b))
        acc = (g, total, n) if acc is None else step._add(acc, (g, total, n))
    return acc


def assert_same_step(step, params, batches, reference: tuple, tokens: int, atol: float = 1e-6) -> None:
    """`batches` give the same trained-token count (`tokens`) as `reference` (a
    `summed_gradients` result), and the mean loss and mean gradients within atol."""
    g_ref, total_ref, n_ref = reference
    g, total, n = summed_gradients(step, params, batches)
    assert int(n) == int(n_ref) == tokens
    count = float(n)
    assert abs(float(total) / count - float(total_ref) / count) <= atol
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(np.asarray(a) / count, np.asarray(b) / count, atol=atol, rtol=0)
