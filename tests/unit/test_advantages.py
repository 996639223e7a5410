"""PARA-GRPO advantages: hand-derived numbers for shaping, group norm, k1 KL, reward-to-go,
batch norm and the targeted anchor."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paravt_jax.rl.advantages import (
    AdvantageConfig,
    anchor_advantages,
    anchor_positions,
    compute_advantages,
    group_normalize,
    group_normalize_by_ids,
    masked_normalize,
    reward_to_go,
    shape_rewards,
    token_rewards,
)

EPS = 1e-5

# ---------------------------------------------------------------------------------------------
# One group of 4 completions, T = 4, ragged loss masks.
#
# rewards r = [-3.0, 0.6, 1.8, 2.5]
# shaping (r - 0.2) * 10 = [-32, 4, 16, 23] -> clip to +-20 -> [-20, 4, 16, 20]
# group mean = 20 / 4 = 5; deviations [-25, -1, 11, 15]; squares 625 + 1 + 121 + 225 = 972;
# unbiased var = 972 / 3 = 324 -> std 18  =>  normalised a = [-25, -1, 11, 15] / (18 + 1e-5)
# ---------------------------------------------------------------------------------------------
REWARDS = np.array([-3.0, 0.6, 1.8, 2.5])
SHAPED = np.array([-20.0, 4.0, 16.0, 20.0])
A = np.array([-25.0, -1.0, 11.0, 15.0]) / (18.0 + EPS)

LOSS_MASK = np.array([
    [0, 1, 1, 1],   # prompt then 3 generated tokens
    [0, 0, 1, 1],   # 2 generated tokens
    [0, 1, 0, 1],   # generated, tool response (not generated), generated
    [0, 1, 1, 0],   # 2 generated tokens, then padding
])
# old_logp - ref_logp per position; values at non-loss positions must be ignored.
DIFF = np.array([
    [7.0, 1.0, -2.0, 0.5],
    [0.3, 0.3, 15.0, -1.0],     # 15 is clamped to 10 by the k1 estimator's clamp
    [0.0, 3.0, 100.0, -4.0],    # 100 sits on the tool-response token: ignored
    [0.0, -0.5, 2.0, 9.0],      # 9 sits on padding: ignored
])
REF = np.linspace(-3.0, -1.0, 16).reshape(4, 4)
OLD = REF + DIFF

# k1 KL reward = -0.01 * clamp(diff) on loss tokens:
KL = np.array([
    [0.0, -0.01, 0.02, -0.005],
    [0.0, 0.0, -0.1, 0.01],
    [0.0, -0.03, 0.0, 0.04],
    [0.0, 0.005, -0.02, 0.0],
])
# + normalised reward at each row's last loss token (cols 3, 3, 3, 2):
TOTAL = KL.copy()
TOTAL[0, 3] += A[0]
TOTAL[1, 3] += A[1]
TOTAL[2, 3] += A[2]
TOTAL[3, 2] += A[3]
# reward-to-go over loss tokens (sum of the row's loss-token rewards at or after t), 0 off-mask:
RTG = np.array([
    [0.0, 0.005 + A[0], 0.015 + A[0], -0.005 + A[0]],
    [0.0, 0.0, -0.09 + A[1], 0.01 + A[1]],
    [0.0, 0.01 + A[2], 0.0, 0.04 + A[2]],   # skips the tool-response token at col 2
    [0.0, -0.015 + A[3], -0.02 + A[3], 0.0],
])


def _batch_norm(x, mask):
    """Reference batch normalisation written out: mean and ddof-1 std over the 9 loss tokens."""
    vals = x[mask > 0]
    assert vals.size == 9
    mean = vals.mean()
    std = np.sqrt(((vals - mean) ** 2).sum() / (vals.size - 1))
    return np.where(mask > 0, (x - mean) / (std + EPS), 0.0)


def test_shaping_and_group_norm():
    np.testing.assert_allclose(shape_rewards(REWARDS, AdvantageConfig()), SHAPED, atol=1e-5)
    np.testing.assert_allclose(group_normalize(SHAPED, 4, EPS), A, atol=1e-6)
    # Two groups of two: [1, 3] -> mean 2, unbiased std sqrt(2); [5, 5] -> std 0 -> 0.
    two = group_normalize(np.array([1.0, 3.0, 5.0, 5.0]), 2, EPS)
    s = np.sqrt(2.0) + EPS
    np.testing.assert_allclose(two, [-1 / s, 1 / s, 0.0, 0.0], atol=1e-6)
    # Group of one: the reference uses std 1 -> value 0.
    np.testing.assert_allclose(group_normalize(np.array([4.0, -2.0]), 1, EPS), [0.0, 0.0])
    # Same groups given by (shuffled) ids.
    ids = np.array([1, 0, 1, 0])
    x = np.array([5.0, 1.0, 5.0, 3.0])
    np.testing.assert_allclose(group_normalize_by_ids(x, ids, EPS), [0.0, -1 / s, 0.0, 1 / s], atol=1e-6)
    with pytest.raises(ValueError):
        group_normalize(np.zeros(6), 4)


def test_token_rewards_and_reward_to_go():
    total, kl = token_rewards(A, OLD, REF, LOSS_MASK, kl_ctl=0.01, kl_clamp=10.0)
    np.testing.assert_allclose(kl, KL, atol=1e-6)
    np.testing.assert_allclose(total, TOTAL, atol=1e-6)
    np.testing.assert_allclose(reward_to_go(total, LOSS_MASK), RTG, atol=1e-6)


def test_reward_to_go_discounted_skips_non_loss_tokens():
    # gamma = 0.5 on row 2: A_3 = 0.04 + a2; A_1 = -0.03 + 0.5 * A_3 (col 2 is skipped entirely).
    got = reward_to_go(TOTAL, LOSS_MASK, gamma=0.5)
    a3 = 0.04 + A[2]
    np.testing.assert_allclose(got[2], [0.0, -0.03 + 0.5 * a3, 0.0, a3], atol=1e-6)
    # row 0: A_3 = -0.005 + a0; A_2 = 0.02 + 0.5 A_3; A_1 = -0.01 + 0.5 A_2
    r3 = -0.005 + A[0]
    r2 = 0.02 + 0.5 * r3
    np.testing.assert_allclose(got[0], [0.0, -0.01 + 0.5 * r2, r2, r3], atol=1e-6)


def test_compute_advantages_end_to_end():
    cfg = AdvantageConfig(anchor_mode="sequence")
    fn = jax.jit(functools.partial(compute_advantages, cfg=cfg, group_size=4))
    adv, metrics = fn(REWARDS, LOSS_MASK, OLD, REF)
    expected = _batch_norm(RTG, LOSS_MASK)
    np.testing.assert_allclose(adv, expected, atol=1e-5)
    # Masked mean 0, unbiased std ~1 after normalisation.
    assert abs(float(metrics["adv/mean"])) < 1e-5
    np.testing.assert_allclose(float(metrics["adv/std"]), 1.0, atol=1e-4)
    assert int(metrics["loss_tokens"]) == 9
    np.testing.assert_allclose(float(metrics["reward/clipped_frac"]), 0.5)   # -3.0 and 2.5
    # Without batch norm the output is the raw reward-to-go.
    adv_raw, _ = compute_advantages(REWARDS, LOSS_MASK, OLD, REF,
                                    AdvantageConfig(anchor_mode="sequence", batch_norm=False), group_size=4)
    np.testing.assert_allclose(adv_raw, RTG, atol=1e-5)
    # Group ids instead of group size: identical.
    adv_ids, _ = compute_advantages(REWARDS, LOSS_MASK, OLD, REF, cfg, group_ids=np.zeros(4, np.int32))
    np.testing.assert_allclose(adv_ids, expected, atol=1e-5)


def test_masked_normalize_edge_cases():
    x = np.arange(6.0).reshape(2, 3)
    # Empty mask: returned unchanged (reference early return).
    np.testing.assert_allclose(masked_normalize(x, np.zeros((2, 3))), x)
    # A single token: std 1 -> (x - x) / (1 + eps) = 0.
    one = np.zeros((2, 3))
    one[1, 2] = 1
    np.testing.assert_allclose(masked_normalize(x, one), np.zeros((2, 3)))


# ---------------------------------------------------------------------------------------------
# Targeted anchor.
#
# anchor rewards R = [-0.4, 0.08, 0.32, 0.4]: mean 0.1, deviations [-0.5, -0.02, 0.22, 0.3]
# = 0.02 * [-25, -1, 11, 15]; squares sum 0.0004 * 972 = 0.3888; / 3 = 0.1296 -> std 0.36.
# anchor value per row = 0.5 * dev / (0.36 + 1e-5).
# ---------------------------------------------------------------------------------------------
ANCHOR_R = np.array([-0.4, 0.08, 0.32, 0.4])
ANCHOR_V = 0.5 * np.array([-0.5, -0.02, 0.22, 0.3]) / (0.36 + EPS)

A_LOSS = np.array([
    [0, 1, 1, 1, 1],
    [0, 1, 1, 1, 0],
    [0, 0, 1, 1, 1],
    [0, 1, 0, 1, 0],
])
A_STRUCT = np.array([
    [0, 1, 0, 1, 0],   # two tags among the generated tokens -> positions 1 and 3
    [0, 0, 0, 0, 0],   # no tag -> last loss token, position 3
    [1, 0, 0, 0, 1],   # position 0 is a prompt token (not generated) -> only position 4
    [0, 0, 1, 0, 0],   # the only tag is in a tool response -> counts as none -> position 3
])
A_POS = np.array([
    [0, 1, 0, 1, 0],
    [0, 0, 0, 1, 0],
    [0, 0, 0, 0, 1],
    [0, 0, 0, 1, 0],
], bool)


def _anchor_inputs(seed=0):
    rng = np.random.default_rng(seed)
    ref = rng.normal(-2.0, 0.5, size=(4, 5))
    old = ref + rng.normal(0.0, 0.3, size=(4, 5))
    rewards = np.array([0.1, 0.9, 0.5, 0.3])
    return rewards, old, ref


def test_anchor_positions_and_values():
    np.testing.assert_array_equal(anchor_positions(A_STRUCT, A_LOSS), A_POS)
    got = anchor_advantages(ANCHOR_R, A_STRUCT, A_LOSS, weight=0.5, eps=EPS, group_size=4)
    expected = np.where(A_POS, ANCHOR_V[:, None], 0.0)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    # A row without any loss token gets no anchor at all.
    empty = A_LOSS.copy()
    empty[1] = 0
    assert not bool(anchor_positions(A_STRUCT, empty)[1].any())


@pytest.mark.parametrize("batch_norm", [False, True])
def test_token_vs_sequence_mode_differ_only_at_anchor_positions(batch_norm):
    rewards, old, ref = _anchor_inputs()
    seq_cfg = AdvantageConfig(anchor_mode="sequence", batch_norm=batch_norm)
    tok_cfg = AdvantageConfig(anchor_mode="token", anchor_weight=0.5, batch_norm=batch_norm)
    adv_seq, _ = compute_advantages(rewards, A_LOSS, old, ref, seq_cfg, group_size=4)
    tok = jax.jit(functools.partial(compute_advantages, cfg=tok_cfg, group_size=4))
    adv_tok, metrics = tok(rewards, A_LOSS, old, ref, anchor_rewards=ANCHOR_R, structural_mask=A_STRUCT)
    diff = np.asarray(adv_tok) - np.asarray(adv_seq)
    np.testing.assert_allclose(diff, np.where(A_POS, ANCHOR_V[:, None], 0.0), atol=1e-5)
    assert np.all(diff[~A_POS] == 0.0)       # bit-identical everywhere else
    assert int(metrics["anchor/positions"]) == 5
    assert int(metrics["anchor/fallback_rows"]) == 2
    # anchor_weight 0 in token mode: exactly the sequence-mode result.
    adv_off, _ = compute_advantages(rewards, A_LOSS, old, ref,
                                    AdvantageConfig(anchor_weight=0.0, batch_norm=batch_norm), group_size=4)
    np.testing.assert_array_equal(adv_off, adv_seq)


def test_token_mode_requires_anchor_inputs():
    rewards, old, ref = _anchor_inputs()
    with pytest.raises(ValueError):
        compute_advantages(rewards, A_LOSS, old, ref, AdvantageConfig(), group_size=4)
    with pytest.raises(ValueError):
        AdvantageConfig(anchor_mode="tokens")


def test_jit_and_dtype():
    fn = jax.jit(functools.partial(compute_advantages, cfg=AdvantageConfig(), group_size=4))
    adv, _ = fn(jnp.asarray(REWARDS, jnp.float32), jnp.asarray(A_LOSS[:, :4]), jnp.asarray(OLD, jnp.bfloat16),
                jnp.asarray(REF, jnp.float32), anchor_rewards=ANCHOR_R, structural_mask=A_STRUCT[:, :4])
    assert adv.dtype == jnp.float32 and adv.shape == (4, 4)
    assert np.all(np.isfinite(np.asarray(adv)))
