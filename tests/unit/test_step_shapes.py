"""rl/shapes.py's step sizes and the sampler's rows per call (sampling/sampler.py call_rows)."""
import pytest

from paravt_jax.configs import paragrpo
from paravt_jax.infra.buckets import bucket, fit
from paravt_jax.rl.shapes import step_shapes
from paravt_jax.run_config import build_run
from paravt_jax.sampling.calls import PromptShape, call_rows, call_width
from paravt_jax.text.inputs import encode_ids


@pytest.mark.parametrize("prompts,shape,minimum,rows", [
    (5, PromptShape(), 1, 8),  # each call's own power-of-two bucket
    (5, PromptShape(), 16, 16),
    (3, PromptShape(rows=8), 1, 8),  # a fixed shape pads the call to it
    (280, PromptShape(rows=320), 1, 320),  # exactly, not a power of two (bucket(280) = 512)
    (320, PromptShape(rows=320), 1, 320),
    (321, PromptShape(rows=320), 1, 512),  # more prompts than the shape: their own bucket
    (4, PromptShape(rows=6), 8, 8),  # never below the sampler's smallest batch
])
def test_call_rows(prompts, shape, minimum, rows):
    assert call_rows(prompts, shape, minimum) == rows


@pytest.mark.parametrize("n,fixed,minimum", [(n, f, m) for n in (1, 3, 4, 5, 100) for f in (0, 1, 4, 8, 128)
                                              for m in (1, 2, 16)])
def test_fit_is_the_bucket_rule_for_power_of_two_sizes(n, fixed, minimum):
    """Every existing power-of-two shape keeps its size (so no program and no number changes)."""
    assert fit(n, fixed, minimum) == max(bucket(n, minimum), fixed)


def test_call_width_is_exactly_a_fixed_width_the_prompts_fit():
    prompts = [encode_ids(list(range(n)), 0) for n in (1422, 900)]
    assert call_width(prompts, PromptShape(width=1536)) == 1536  # not bucket(1422) = 2048
    assert call_width(prompts, PromptShape()) == 2048
    assert call_width(prompts, PromptShape(width=1024)) == 2048  # too narrow: the prompts' bucket
    assert call_width(prompts[1:], PromptShape(width=1536), 4096) == 4096


def test_a_rounds_sub_agent_prompts_in_one_call_under_the_recipe_presets():
    """The 8B recipe's 7 prompts x 8 samples are 64 episode rows; with up to 5 calls a turn its
    sub-agent calls have 320 rows (a round in one call), where the toy keeps calls of its 16
    episode rows; the main prompt's rows stay the prompts' power-of-two bucket (8 for 7)."""
    rl = build_run(paragrpo.get_config("qwen3vl_8b")).rl
    shapes = step_shapes(rl, rl.prompts_per_step)
    assert rl.shapes.subagent_batch == "round" and rl.dispatch.max_parallel == 5
    assert (shapes.prompt.rows, shapes.subagent.rows, shapes.subagent.width) == (8, 64 * 5, 1536)
    toy = build_run(paragrpo.get_config("toy")).rl
    assert step_shapes(toy, toy.prompts_per_step).subagent.rows == 16
    per_episode = paragrpo.get_config("qwen3vl_8b")
    per_episode.rl.shapes.subagent_batch = "episode_rows"
    rl = build_run(per_episode).rl
    assert step_shapes(rl, rl.prompts_per_step).subagent.rows == 64
    per_episode.rl.shapes.subagent_batch = "all"
    with pytest.raises(ValueError, match="subagent_batch"):
        build_run(per_episode)
