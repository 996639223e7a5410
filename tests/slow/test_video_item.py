"""The sampler's prefill of a video then an image against the forward pass."""
import numpy as np
import pytest

from integration import test_video_item as integration_tests
from paravt_jax.text import chat
from paravt_jax.text.inputs import encode

tokenizer = integration_tests.tokenizer  # the module's fixture (other words than conftest's)


def test_sampler_prefill_of_a_video_then_an_image_matches_the_forward_pass(tokenizer):
    """The rollout's rows hold the overview video and then crop images: the sampler's batched
    vision inputs must place both as the model's own forward does."""
    from paravt_jax.models.qwen3_vl import init_model, preset
    from paravt_jax.sampling import Sampler, SamplerConfig, SamplingParams

    rng = np.random.default_rng(0)
    clip = chat.Video(rng.integers(0, 256, (4, 64, 96, 3), dtype=np.uint8), np.arange(4) * 0.5)
    crop = chat.Image(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    inputs = encode(chat.render([chat.Message("user", (clip, chat.Text("When?"), crop, chat.Text("ok")))],
                                add_generation_prompt=True), tokenizer)
    model = init_model(preset("tiny"), seed=0)
    logits = np.asarray(model(**inputs.model_kwargs()).logits, np.float64)[0, -1]
    log_probs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    out, _ = Sampler(model, SamplerConfig(min_chunk_bucket=64)).generate([inputs],
                                                                         sampling=SamplingParams(max_new_tokens=1))
    token = out.tokens[0][0]
    assert token == int(logits.argmax()) and out.logprobs[0][0] == pytest.approx(log_probs[token], abs=1e-4)
