"""The packed prompt prefill (SamplerConfig.prompt_packing): a generate() call's prompts packed
several to a row, only their own tokens computed, their keys and values scattered into the
prompt cache. Against the right-padded prefill: the same cache on every filled slot, the same
greedy tokens and log-probs over a first turn and an extend; with images and videos, greedy
parity with transformers is in test_sampler.py."""
import jax
import numpy as np
import pytest

from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl import init_model, preset
from paravt_jax.sampling import Sampler, SamplerConfig, SamplingParams
from paravt_jax.sampling.calls import PromptShape
from paravt_jax.sampling.chunks import pack_rows
from paravt_jax.sampling.sampler import packed_rows
from paravt_jax.text.inputs import encode_ids

NEW = 20


def test_pack_rows_places_each_sequence_whole_in_the_first_row_with_room():
    places, rows = pack_rows([100, 30, 80, 70, 10], 128)
    assert places == [(0, 0), (1, 0), (1, 30), (2, 0), (0, 100)] and rows == 3
    assert packed_rows(16) == (4, 8, 16) and packed_rows(80) == (20, 40, 80) and packed_rows(1) == (1,)
    with pytest.raises(ValueError, match="does not fit rows of 64"):
        pack_rows([65], 64)


@pytest.fixture(scope="module")
def model():
    # the toy model with 16-slot attention blocks: a packed row's prompts span several blocks
    return init_model(preset("toy", attention_block=16), seed=5)


def episode(model, packing: bool):
    """Five prompts of 3 to 150 tokens (2 samples each), then an extend of 2 to 40 tokens a row."""
    rng = np.random.default_rng(7)
    prompts = [encode_ids(rng.integers(0, 900, n).tolist(), 0) for n in (3, 41, 150, 7, 60)]
    sampler = Sampler(model, SamplerConfig(prompt_packing=packing))
    sampling = SamplingParams(max_new_tokens=NEW)
    first, state = sampler.generate(prompts, num_samples=2, reserve=[(48, NEW)], sampling=sampling)
    prefix = jax.tree.map(np.asarray, state.prefix)
    chunks = [encode_ids(rng.integers(0, 900, int(n)).tolist(), int(state.chunk_start[b]))
              for b, n in enumerate(rng.integers(2, 40, state.num_rows))]
    second, _ = sampler.extend(state, chunks, sampling=sampling)
    return (first, second), prefix, sampler


def test_packed_prompts_give_the_padded_prefill_cache_tokens_and_logprobs(model):
    padded, padded_prefix, _ = episode(model, False)
    base = Sampler(model).compile_counts()["packed_prefill"]
    packed, packed_prefix, sampler = episode(model, True)
    assert sampler.compile_counts()["packed_prefill"] > base  # the packed programs ran
    valid = padded_prefix.valid
    np.testing.assert_array_equal(packed_prefix.valid, valid)
    for want, got in zip(padded_prefix.keys, packed_prefix.keys):  # [P, KV, hd, S]
        np.testing.assert_allclose(np.where(valid[:, None, None], got, 0), np.where(valid[:, None, None], want, 0),
                                   atol=1e-5, rtol=0)
    for want, got in zip(padded_prefix.values, packed_prefix.values):  # [P, KV, S, hd]
        np.testing.assert_allclose(np.where(valid[:, None, :, None], got, 0),
                                   np.where(valid[:, None, :, None], want, 0), atol=1e-5, rtol=0)
    for a, b in zip(packed, padded):
        assert a.tokens == b.tokens
        for x, y in zip(a.logprobs, b.logprobs):
            np.testing.assert_allclose(x, y, atol=2e-5, rtol=0)


def test_packed_calls_compile_every_row_count_on_their_first_call(model):
    """Calls of 1 to 16 prompts of 5 to 120 tokens in 16 prompt rows of 128 pack into 4, 8 or
    16 rows: the first call compiles the three programs, later ones nothing."""
    sampler = Sampler(model, SamplerConfig(prompt_packing=True))
    rng = np.random.default_rng(3)
    before = sampler.compile_counts()["packed_prefill"]
    for i, count in enumerate((1, 3, 16, 9, 16, 2)):
        prompts = [encode_ids(rng.integers(0, 900, int(n)).tolist(), 0) for n in rng.integers(5, 120, count)]
        sampler.generate(prompts, sampling=SamplingParams(max_new_tokens=2), shape=PromptShape(16, 128))
        assert sampler.compile_counts()["packed_prefill"] - before == 3, f"call {i}"


def test_prompt_packing_is_refused_on_a_mesh():
    mesh = sh.make_mesh({"data": 2, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:2])
    model = init_model(preset("tiny"), seed=0, mesh=mesh)
    with pytest.raises(ValueError, match="SamplerConfig.prompt_packing=True run unsharded only"):
        Sampler(model, SamplerConfig(prompt_packing=True), mesh=mesh)


def test_a_run_with_packed_prompts_on_several_devices_is_refused_before_training():
    """`paravt-jax run` / `train` check the rollout sampler against the rollouts' devices first
    (cli/assembly.py), not at the first RL step after the cold start's SFT."""
    from paravt_jax.cli.assembly import check_rollout_sampler
    from paravt_jax.config import ConfigValueError
    from paravt_jax.configs import paragrpo
    from paravt_jax.run_config import build_run

    run = build_run(paragrpo.get_config("toy"))
    assert run.rl.sampler.prompt_packing
    mesh = sh.make_mesh({"data": 2, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:2])
    model = init_model(preset("tiny"), seed=0, mesh=mesh)
    with pytest.raises(ConfigValueError, match="rl.sampler.prompt_packing=True run unsharded only"):
        check_rollout_sampler(run, model, None)
    one = sh.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
    check_rollout_sampler(run, model, one)  # sampling on a device of its own
