"""Sampler.sample_queued: many single-turn prompts through a few decode rows refilled as their
samples end (DecodePlan.refill) give the tokens of one generate() call over all of them, greedy
and sampled, packed or not, whatever the slots and refill threshold; one compiled decode for
every refill; the sub-agent round through it; bad arguments refused."""
import dataclasses

import numpy as np
import pytest

from paravt_jax.models.qwen3_vl import init_model, preset
from paravt_jax.sampling import Sampler, SamplerConfig, SamplingParams
from paravt_jax.sampling.calls import PromptShape
from paravt_jax.text.inputs import encode_ids

NEW = 24
LENGTHS = (3, 41, 150, 7, 90, 12, 33, 60, 5)


@pytest.fixture(scope="module", params=["tiny", "toy"])
def model(request):
    return init_model(preset(request.param, attention_block=16), seed=5)


@pytest.fixture(scope="module")
def tiny():
    return init_model(preset("tiny", attention_block=16), seed=5)


def prompts(seed=3):
    rng = np.random.default_rng(seed)
    return [encode_ids(rng.integers(0, 900, n).tolist(), 0) for n in LENGTHS]


def sampler_of(model, **config):
    sampler = Sampler(model, SamplerConfig(**config))
    # 16-slot decode blocks: a refilled row's restart moves the bounded read's last block
    sampler.backend = dataclasses.replace(sampler.backend, decode_block=16)
    return sampler


def stops_of(sampler, sampling, **kw):
    """Stop ids taken from an unstopped run, so that the samples end at very different steps."""
    out, _ = sampler.generate(prompts(), sampling=sampling, **kw)
    return tuple({out.tokens[0][2], out.tokens[3][11], out.tokens[5][5]})


def assert_same(got, want, atol=2e-5):
    assert got.tokens == want.tokens
    np.testing.assert_array_equal(got.finished, want.finished)
    np.testing.assert_array_equal(got.lengths, want.lengths)
    for x, y in zip(got.logprobs, want.logprobs):
        np.testing.assert_allclose(x, y, atol=atol, rtol=0)


# refill_at 2 with 4 slots: test_queued_sampling_follows_each_prompts_stream; as many slots as
# prompts: test_fewer_prompts_than_slots
@pytest.mark.parametrize("slots,refill_at", [(3, 1), (4, 0)])
def test_queued_greedy_equals_one_call(model, slots, refill_at):
    sampler = sampler_of(model)
    sampling = SamplingParams(max_new_tokens=NEW)
    sampling = dataclasses.replace(sampling, stop_ids=stops_of(sampler, sampling))
    want, _ = sampler.generate(prompts(), sampling=sampling)
    assert min(want.lengths) < NEW < max(want.lengths) + 1 and any(want.finished)  # samples end apart
    before = sampler.compile_counts()["decode"]
    got = sampler.sample_queued(prompts(), slots, sampling=sampling, refill_at=refill_at)
    assert_same(got, want)
    assert sampler.compile_counts()["decode"] - before <= 1  # one refilled decode for every refill
    if slots < len(LENGTHS):  # fewer row-steps than calls of `slots` prompts one after another
        starts = range(0, len(LENGTHS), slots)
        calls = [sampler.generate(prompts()[i:i + slots], sampling=sampling,
                                  row_ids=list(range(i, min(i + slots, len(LENGTHS)))))[0] for i in starts]
        assert [t for c in calls for t in c.tokens] == want.tokens
        assert got.row_steps < sum(c.row_steps for c in calls)


def test_queued_sampling_follows_each_prompts_stream(model):
    """Sampled at temperature 1 with row ids of their own: each prompt's tokens are those of its
    stream, whichever row it ran in and when."""
    sampler = sampler_of(model)
    ids = [11 * i + 3 for i in range(len(LENGTHS))]
    sampling = SamplingParams(max_new_tokens=NEW, temperature=1.0)
    sampling = dataclasses.replace(sampling, stop_ids=stops_of(sampler, sampling, seed=4, row_ids=ids))
    want, _ = sampler.generate(prompts(), sampling=sampling, seed=4, row_ids=ids)
    assert len(set(want.lengths.tolist())) > 1
    got = sampler.sample_queued(prompts(), 4, sampling=sampling, seed=4, row_ids=ids, refill_at=2)
    assert_same(got, want)


def test_queued_packed_prompts_with_a_fixed_shape(tiny):
    """The prompts prefilled packed (prompt_packing) into a call of fixed rows and width: the
    same tokens as one packed call over all of them (the log-probs to the bits of the packed
    attention's other blocks)."""
    sampler = sampler_of(tiny, prompt_packing=True)
    sampling = SamplingParams(max_new_tokens=NEW)
    sampling = dataclasses.replace(sampling, stop_ids=stops_of(sampler, sampling))
    want, _ = sampler.generate(prompts(), sampling=sampling)
    got = sampler.sample_queued(prompts(), 4, sampling=sampling, shape=PromptShape(rows=4, width=160))
    assert_same(got, want, atol=2e-4)


def test_fewer_prompts_than_slots(tiny):
    sampler = sampler_of(tiny)
    sampling = SamplingParams(max_new_tokens=NEW)
    want, _ = sampler.generate(prompts()[:2], sampling=sampling)
    assert_same(sampler.sample_queued(prompts()[:2], 8, sampling=sampling), want)


def test_bad_arguments_are_refused(tiny):
    sampler = sampler_of(tiny)
    with pytest.raises(ValueError, match="no prompts"):
        sampler.sample_queued([], 2)
    with pytest.raises(ValueError, match="slots=0"):
        sampler.sample_queued(prompts(), 0)
    with pytest.raises(ValueError, match="refill_at=-1"):
        sampler.sample_queued(prompts(), 2, refill_at=-1)
    with pytest.raises(ValueError, match="row_ids: 2 ids for 9 prompts"):
        sampler.sample_queued(prompts(), 2, row_ids=[1, 2])
    with pytest.raises(ValueError, match="decode_cache='paged'"):
        sampler_of(tiny, decode_cache="paged").sample_queued(prompts(), 2)


def test_subagent_round_through_refilled_rows(tmp_path):
    """A round of 7 crops answered by sub-agents in rows of 2: refilled (one call) and in calls
    one after another give the same summaries and trajectories."""
    from paravt_jax.agent.dispatch import CropDispatcher, CropTask
    from paravt_jax.agent.responses import subagent_responses
    from paravt_jax.agent.rollout import RolloutConfig, sampling_params
    from paravt_jax.agent.tools import ToolCall
    from paravt_jax.data.synthetic import Event, write_video
    from paravt_jax.text.tokenizer import train_tokenizer
    from unit.test_agent_rollout import CORPUS

    path = write_video(str(tmp_path / "v.mp4"), 30.0, [Event(4.0, 9.0, "red", "circle")], fps=2.0, height=56,
                       width=56, seed=1)
    tok = train_tokenizer(CORPUS)
    sampler = Sampler(init_model(preset("tiny"), seed=0), SamplerConfig(min_chunk_bucket=64))
    config = RolloutConfig(mode="subagent", subagent_max_tokens=12, temperature=1.0)
    windows = [(0.0, 4.0), (2.0, 9.0), (5.0, 6.0), (10.0, 20.0), (1.0, 29.0), (12.0, 13.0), (3.0, 7.0)]
    tasks = [CropTask(k % 3, k, path, 30.0, ToolCall("crop_video", {"start_time": s, "end_time": e}))
             for k, (s, e) in enumerate(windows)]
    with CropDispatcher() as dispatcher:
        results = dispatcher.run(tasks)
    assert all(r.ok for r in results)
    sampling = sampling_params(config, tok, config.subagent_max_tokens)
    shape = PromptShape(rows=2)
    runs = [subagent_responses(results, sampler, tok, sampling, shape, 9, [5 * k + 1 for k in range(7)], refill)
            for refill in (False, True)]
    (texts, subs), (texts_refilled, subs_refilled) = runs
    assert texts_refilled == texts
    for a, b in zip(subs_refilled, subs):
        np.testing.assert_array_equal(a.inputs.input_ids, b.inputs.input_ids)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-5, rtol=0)
