"""Real rollouts of the tiny model (the dispatcher and the scripted rollouts: tests/unit/test_agent_rollout.py)."""
import numpy as np
import pytest

from paravt_jax.agent.dispatch import CropDispatcher
from paravt_jax.agent.rollout import Episode, RolloutConfig, run_rollouts
from paravt_jax.models.qwen3_vl import init_model, preset
from paravt_jax.sampling import Sampler, SamplerConfig
from paravt_jax.text.tokenizer import train_tokenizer
from unit import test_agent_rollout as unit_tests
from unit.test_agent_rollout import CORPUS

video = unit_tests.video  # the fixture


@pytest.mark.parametrize("mode", ["subagent", "frames"])
def test_full_tiny_rollout(video, tmp_path, mode):
    tok = train_tokenizer(CORPUS)
    model = init_model(preset("tiny"), seed=0)
    sampler = Sampler(model, SamplerConfig(min_chunk_bucket=64))
    episodes = [Episode("a", "When does the blue circle appear?", "[10.0, 14.0]", "tvg", video, nframes=4),
                Episode("b", "Colour?", "blue", "oe", str(tmp_path / "gone.mp4"), nframes=4)]
    with CropDispatcher() as dispatcher:
        rollouts, skipped = run_rollouts(sampler, tok, episodes, 2,
                                         RolloutConfig(mode=mode, max_turns=1, max_new_tokens=8), dispatcher)
    assert len(rollouts) == 2 and len(skipped) == 1 and "gone.mp4" in skipped[0]
    for r in rollouts:
        assert r.inputs.length == len(r.logprobs) == len(r.structural_mask)
        assert 1 <= r.inputs.loss_mask.sum() <= 8 * 2
        assert np.all(r.logprobs[r.inputs.loss_mask == 1] <= 0)
