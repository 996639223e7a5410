"""Sampler: parity with transformers generate and with teacher-forced forwards, multi-turn,
stop ids, truncation supports, seeds, compile counts, sharding."""
import jax
import numpy as np
import pytest

from conftest import require_torch
from paravt_jax.infra import sharding as sh
from paravt_jax.infra.buckets import bucket
from paravt_jax.models.qwen3_vl import init_model, load_pretrained, preset
from paravt_jax.models.qwen3_vl.rope import get_rope_index
from paravt_jax.sampling import Sampler, SamplerConfig, SamplingParams, generate, sample_logits
from paravt_jax.sampling.calls import PromptShape
from paravt_jax.text import chat
from paravt_jax.text.inputs import ModelInputs, encode_ids
from support.hf_tiny import IM_START, build_hf_tiny, image_tokens, patches, text_ids, video_tokens

NEW = 24


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, torch_module):
    directory = str(tmp_path_factory.mktemp("tiny_sampler"))
    hf = build_hf_tiny(directory, seed=41)
    return hf, load_pretrained(directory)


def as_inputs(ids, types, pv=None, igrid=None, pvv=None, vgrid=None) -> ModelInputs:
    """A hand-built unpadded row as ModelInputs (positions from get_rope_index)."""
    ids = np.asarray(ids)
    pos, _ = get_rope_index(types[None], np.ones((1, len(ids))), igrid, vgrid)
    empty = np.zeros((0, 1536), np.float32)
    return ModelInputs(ids.astype(np.int32), types.astype(np.int32), np.zeros(len(ids), np.int32),
                       pos[:, 0], pv if pv is not None else empty,
                       np.asarray(igrid if igrid is not None else np.zeros((0, 3)), np.int64),
                       pvv if pvv is not None else empty,
                       np.asarray(vgrid if vgrid is not None else np.zeros((0, 3)), np.int64),
                       int(pos.max()) + 1)


def prompts_mixed(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    row = [IM_START] + text_ids(rng, 9)
    out.append(as_inputs(row, np.zeros(len(row), np.int64)))
    igrid = [[1, 4, 6]]
    row = [IM_START] + text_ids(rng, 3) + image_tokens(igrid[0]) + text_ids(rng, 4)
    out.append(as_inputs(row, (np.array(row) == 912).astype(np.int64), patches(rng, igrid), igrid))
    vgrid = [[3, 4, 4]]
    row = [IM_START] + text_ids(rng, 2) + video_tokens(rng, vgrid[0]) + text_ids(rng, 5)
    out.append(as_inputs(row, (np.array(row) == 913).astype(np.int64) * 2, pvv=patches(rng, vgrid), vgrid=vgrid))
    return out


def hf_greedy(hf, prompt: ModelInputs):
    torch = require_torch()
    kw = {k: torch.tensor(v.astype(np.int64) if v.dtype.kind == "i" else v)
          for k, v in prompt.model_kwargs().items()}
    with torch.no_grad():
        out = hf.generate(**kw, max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, prompt.length:].tolist()


@pytest.mark.parametrize("decode_cache,prompt_packing", [("contiguous", False), ("paged", False),
                                                          ("contiguous", True)])
def test_greedy_equals_hf_generate_mixed_batch(tiny, decode_cache, prompt_packing):
    """Text, image and video prompts; prompt_packing: all three prefilled in one packed row."""
    hf, ours = tiny
    prompts = prompts_mixed()
    result, _ = Sampler(ours, SamplerConfig(decode_cache=decode_cache, prompt_packing=prompt_packing)).generate(
        prompts, sampling=SamplingParams(max_new_tokens=NEW))
    for b, p in enumerate(prompts):
        assert result.tokens[b] == hf_greedy(hf, p), f"row {b}"
        assert len(result.tokens[b]) == NEW and not result.finished[b]


def full_logprobs(model, seq: ModelInputs, start: int, tokens, temperature):
    logits = np.asarray(model(**seq.model_kwargs()).logits)[0].astype(np.float64)
    t = temperature if temperature > 0 else 1.0
    top = (logits / t).max(-1, keepdims=True)
    logp = logits / t - np.log(np.exp(logits / t - top).sum(-1, keepdims=True)) - top
    return np.array([logp[start - 1 + i, tok] for i, tok in enumerate(tokens)])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_teacher_forced_forward(tiny, temperature):
    _, ours = tiny
    prompts = prompts_mixed(1)
    result, _ = Sampler(ours).generate(prompts, num_samples=2, seed=3,
                                       sampling=SamplingParams(max_new_tokens=NEW, temperature=temperature))
    assert result.tokens[0] != result.tokens[1]  # two samples of one prompt differ
    for b, tokens in enumerate(result.tokens):
        prompt = prompts[b // 2]
        seq = prompt.extend(encode_ids(tokens, prompt.next_position))
        want = full_logprobs(ours, seq, prompt.length, tokens, temperature)
        np.testing.assert_allclose(result.logprobs[b], want, atol=1e-4)


def test_multi_turn_with_frames_equals_full_forward(tiny):
    _, ours = tiny
    from paravt_jax.text.inputs import encode
    from paravt_jax.text.tokenizer import train_tokenizer

    tok = train_tokenizer(["a tool response about frames and seconds"] * 20)
    rng = np.random.default_rng(5)
    frames = (rng.random((2, 64, 64, 3)) * 255).astype(np.uint8)
    prompt = encode(chat.render(chat.paravt_messages("Where?", frames, [0.0, 1.0], tools=()),
                                add_generation_prompt=True, assistant_prefix="<think>\n"), tok)
    prompts = [prompt, prompts_mixed(2)[0]]
    sampler = Sampler(ours)
    twelve = SamplingParams(max_new_tokens=12)
    first, state = sampler.generate(prompts, sampling=twelve)
    crop = (rng.random((2, 32, 64, 3)) * 255).astype(np.uint8)
    response = chat.tool_response_messages([[chat.Text("2 frames."), *chat.frames_as_images(crop, [3.0, 4.0])]])
    chunk_segments = [chat.Text("\n")] + chat.render(response, add_generation_prompt=True)
    chunks = [encode(chunk_segments, tok, start_position=int(state.chunk_start[0])), None]
    second, state2 = sampler.extend(state, chunks, sampling=twelve)
    assert second.lengths[1] == 0 and second.tokens[1] == []
    full = (prompt.extend(encode_ids(first.tokens[0], prompt.next_position))
            .extend(chunks[0]))
    start = full.length
    full = full.extend(encode_ids(second.tokens[0], full.next_position))
    logits = np.asarray(ours(**full.model_kwargs()).logits)[0]
    greedy = logits[start - 1:start - 1 + len(second.tokens[0])].argmax(-1).tolist()
    assert second.tokens[0] == greedy
    want = full_logprobs(ours, full, start, second.tokens[0], 0.0)
    np.testing.assert_allclose(second.logprobs[0], want, atol=1e-4)
    # a third turn for the row that sat out continues from its own pending token
    third, _ = sampler.extend(state2, [None, encode_ids([5, 6], int(state2.chunk_start[1]))], sampling=twelve)
    base = prompts[1]
    seq = base.extend(encode_ids(first.tokens[1], base.next_position))
    seq = seq.extend(encode_ids([5, 6], seq.next_position))
    start = seq.length
    seq = seq.extend(encode_ids(third.tokens[1], seq.next_position))
    logits = np.asarray(ours(**seq.model_kwargs()).logits)[0]
    assert third.tokens[1] == logits[start - 1:start - 1 + len(third.tokens[1])].argmax(-1).tolist()


def test_stop_ids_and_budgets():
    model = init_model(preset("tiny"), seed=2)
    free = generate(model, [[1, 2, 3]], SamplingParams(max_new_tokens=16))
    stop = free.tokens[0][5]
    out = generate(model, [[1, 2, 3], [4, 5]], SamplingParams(max_new_tokens=16, stop_ids=[stop]))
    assert out.tokens[0] == free.tokens[0][:free.tokens[0].index(stop) + 1]
    assert out.finished[0] and out.tokens[0][-1] == stop
    sampler = Sampler(model)
    res, _ = sampler.generate([encode_ids([1, 2, 3], 0)], sampling=SamplingParams(max_new_tokens=7))
    assert res.lengths.tolist() == [7] and not res.finished[0]


@pytest.mark.parametrize("field,value", [("max_new_tokens", 0), ("temperature", -0.5), ("temperature", float("nan")),
                                         ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1), ("stop_ids", tuple(range(9)))])
def test_bad_sampling_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}=.*: must be"):
        SamplingParams(**{field: value})


def test_top_k_top_p_never_leave_the_support():
    logits = jax.numpy.asarray(np.log(np.array([[0.5, 0.3, 0.15, 0.05, 0.0 + 1e-9]] * 64, np.float32)))
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(0), i))(jax.numpy.arange(64))
    tok_k, _ = sample_logits(logits, keys, 1.0, 1.0, 2)
    assert set(np.asarray(tok_k).tolist()) <= {0, 1} and len(set(np.asarray(tok_k).tolist())) == 2
    tok_p, _ = sample_logits(logits, keys, 1.0, 0.7, 0)
    assert set(np.asarray(tok_p).tolist()) <= {0, 1}
    tok_p, _ = sample_logits(logits, keys, 1.0, 0.9, 0)
    assert set(np.asarray(tok_p).tolist()) <= {0, 1, 2} and 2 in set(np.asarray(tok_p).tolist())
    greedy, lp = sample_logits(logits, keys, 0.0, 1.0, 0)
    assert set(np.asarray(greedy).tolist()) == {0}
    np.testing.assert_allclose(np.asarray(lp), np.log(0.5), atol=1e-5)


def test_a_program_without_the_truncation_branch_samples_the_same_tokens():
    """SamplingParams.truncates False (top_k 0, top_p 1): the decode compiles sample_logits
    without the top-p / top-k branch (no sort of the logits in the program), and draws the same
    tokens and log-probs as the program holding it, sampled or greedy."""
    rng = np.random.default_rng(0)
    logits = jax.numpy.asarray(rng.normal(size=(16, 300)).astype(np.float32) * 3)
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(1), i))(jax.numpy.arange(16))
    for temperature in (0.0, 0.7, 1.0):
        with_branch = sample_logits(logits, keys, temperature, 1.0, 0, True)
        without = sample_logits(logits, keys, temperature, 1.0, 0, False)
        for a, b in zip(with_branch, without):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    def hlo(truncation):
        fn = jax.jit(lambda l, k, t, p, kk: sample_logits(l, k, t, p, kk, truncation))
        return fn.lower(logits, keys, 0.7, 1.0, 0).compile().as_text()

    assert " sort(" in hlo(True) and " sort(" not in hlo(False)
    assert not SamplingParams().truncates and not SamplingParams(temperature=0.7).truncates
    assert SamplingParams(top_k=5).truncates and SamplingParams(top_p=0.9).truncates


def test_the_sampler_compiles_the_truncation_its_call_asks_for():
    """Sampler.generate passes SamplingParams.truncates to the decode: top_k=1 at temperature 1
    samples the greedy tokens (it would not if the branch were left out), top_k=0 does not."""
    model = init_model(preset("tiny"), seed=2)
    prompts = [encode_ids(list(range(3, 3 + n)), 0) for n in (5, 9)]
    sampler = Sampler(model)
    greedy, _ = sampler.generate(prompts, num_samples=4, sampling=SamplingParams(max_new_tokens=12), seed=1)
    top1, _ = sampler.generate(prompts, num_samples=4, sampling=SamplingParams(max_new_tokens=12, temperature=1.0,
                                                                                top_k=1), seed=1)
    plain, _ = sampler.generate(prompts, num_samples=4, sampling=SamplingParams(max_new_tokens=12, temperature=1.0),
                                seed=1)
    np.testing.assert_array_equal(np.asarray(top1.tokens), np.asarray(greedy.tokens))
    assert not np.array_equal(np.asarray(plain.tokens), np.asarray(greedy.tokens))


def test_seed_reproducibility():
    model = init_model(preset("tiny"), seed=4)
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0)
    a = generate(model, [[1, 2], [3, 4, 5]], sampling, seed=7)
    b = generate(model, [[1, 2], [3, 4, 5]], sampling, seed=7)
    c = generate(model, [[1, 2], [3, 4, 5]], sampling, seed=8)
    assert a.tokens == b.tokens and a.tokens != c.tokens


def test_no_compiles_after_warm_up():
    model = init_model(preset("tiny"), seed=6)
    sampler = Sampler(model, SamplerConfig(min_chunk_bucket=32, min_batch_bucket=4, cache_multiple=256))
    rng = np.random.default_rng(0)

    def call(i):
        n = int(rng.integers(1, 4))
        prompts = [encode_ids(rng.integers(0, 900, int(rng.integers(3, 30))).tolist(), 0) for _ in range(n)]
        sampling = SamplingParams(max_new_tokens=int(rng.integers(1, 9)),
                                  temperature=float(rng.choice([0.0, 0.7, 1.0])))
        out, state = sampler.generate(prompts, sampling=sampling, seed=i)
        chunks = [encode_ids(rng.integers(0, 900, int(rng.integers(1, 10))).tolist(), int(s))
                  for s in state.chunk_start[:n]]
        sampler.extend(state, chunks, sampling=SamplingParams(max_new_tokens=int(rng.integers(1, 9))))

    for i in range(3):
        call(i)
    warm = sampler.compile_counts()
    for i in range(20):
        call(100 + i)
    assert sampler.compile_counts() == warm


def test_sharded_sampler_equals_unsharded(tiny):
    _, ours = tiny
    mesh = sh.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharded_model = init_model(preset("tiny"), seed=0, mesh=mesh)  # overwritten below with ours' weights
    from flax import nnx
    nnx.update(sharded_model, jax.device_put(nnx.state(ours), sh.state_shardings(ours, mesh)))
    prompts = prompts_mixed(4)
    sampled = SamplingParams(max_new_tokens=10, temperature=1.0)
    plain_sampler = Sampler(ours)
    plain, _ = plain_sampler.generate(prompts, num_samples=2, sampling=sampled, seed=1)
    sharded_sampler = Sampler(sharded_model, mesh=mesh)
    # q/k/v and gate/up fuse into one matmul only when no device holds a slice of their outputs
    assert "qkv_t" in plain_sampler.weights.layers[0] and "gate_up_t" in plain_sampler.weights.layers[0]
    assert "qkv_t" not in sharded_sampler.weights.layers[0] and "q_proj_t" in sharded_sampler.weights.layers[0]
    sharded, state = sharded_sampler.generate(prompts, num_samples=2, sampling=sampled, seed=1)
    assert plain.tokens == sharded.tokens
    for a, b in zip(plain.logprobs, sharded.logprobs):
        np.testing.assert_allclose(a, b, atol=1e-4)
    assert state.suffix.keys[0].sharding.spec[0] is not None  # batch rows are split


def test_no_compiles_after_warm_up_with_varied_frames():
    """Prompts and tool-response chunks with varied numbers of frames (the RL and eval case):
    frame counts are padded to powers of two, so a warm run compiles nothing new."""
    model = init_model(preset("tiny"), seed=6)
    sampler = Sampler(model, SamplerConfig(min_chunk_bucket=64, min_batch_bucket=4,
                                           cache_multiple=256))
    rng = np.random.default_rng(1)
    grid = [1, 4, 6]

    def frames_row(n, start=0):
        grids = [grid] * n
        row = [IM_START] + text_ids(rng, int(rng.integers(2, 6)))
        for _ in range(n):
            row += image_tokens(grid)
        row += text_ids(rng, 3)
        inputs = as_inputs(row, (np.array(row) == 912).astype(np.int64), patches(rng, grids), grids)
        if start:  # a later chunk: same content at the row's next positions
            inputs = ModelInputs(inputs.input_ids, inputs.mm_token_type_ids, inputs.loss_mask,
                                 inputs.position_ids + start, inputs.pixel_values, inputs.image_grid_thw,
                                 inputs.pixel_values_videos, inputs.video_grid_thw, inputs.next_position + start)
        return inputs

    def call(counts):
        out, state = sampler.generate([frames_row(n) for n in counts], sampling=SamplingParams(max_new_tokens=4),
                                      seed=1)
        chunks = [frames_row(int(rng.integers(1, 4)), int(s)) for s in state.chunk_start[:len(counts)]]
        sampler.extend(state, chunks, sampling=SamplingParams(max_new_tokens=4))

    def random_call():
        call([int(n) for n in rng.integers(1, 4, int(rng.integers(1, 3)))])

    base = sampler.compile_counts()  # jit caches are per process: other tests' entries count too
    for _ in range(10):  # 1-2 rows of 1-3 frames, then 1-3 frames per row in the next turn
        random_call()
    warm = sampler.compile_counts()
    assert warm["vision"] - base["vision"] <= 4  # frame totals 1, 2, 4, 8 (without padding: one per total)
    for _ in range(12):
        random_call()
    assert sampler.compile_counts() == warm


@pytest.mark.parametrize("decode_cache", ["contiguous", "paged"])
def test_long_decode_grows_the_cache_on_schedule_and_matches_teacher_forced_forward(tiny, monkeypatch, decode_cache):
    """An extend whose decode outgrows the suffix grows it twice mid-decode, to the sizes the
    planner's kv_cache.capacity_after predicts (one schedule); the tokens sampled across the
    growths still carry teacher-forced log-probs (also on pages: each decode segment pages the
    grown caches again)."""
    from paravt_jax.sampling import sampler as sampler_module
    from paravt_jax.sampling.kv_cache import capacity_after, turn_capacity

    sizes = []  # the suffix capacity after each growth

    def grow(cache, extra, shardings):
        sizes.append(cache.capacity + extra)
        return grow_suffix(cache, extra, shardings)

    grow_suffix = sampler_module.grow_suffix
    monkeypatch.setattr(sampler_module, "grow_suffix", grow)
    _, ours = tiny
    prompts = prompts_mixed(2)
    sampler = Sampler(ours, SamplerConfig(decode_cache=decode_cache))
    first, state = sampler.generate(prompts, sampling=SamplingParams(max_new_tokens=1), seed=5)
    assert state.suffix.capacity == 16 and state.write_index == 0
    rng = np.random.default_rng(0)
    chunks = [encode_ids(text_ids(rng, 6), int(s)) for s in state.chunk_start[:len(prompts)]]
    new = 250
    result, grown = sampler.extend(state, chunks, sampling=SamplingParams(max_new_tokens=new, temperature=1.0),
                                   seed=6)
    width = bucket(1 + 6, 16)  # the pending token + the chunk
    at_start = turn_capacity(16, width, new, 1024)
    final, before = capacity_after(16, width, new, 1024)
    assert sizes == [at_start, before, final] == [128, 256, 512]  # before the decode, then twice in it
    assert grown.suffix.capacity == final
    for b, tokens in enumerate(result.tokens):
        assert len(tokens) == new
        seq = prompts[b].extend(encode_ids(first.tokens[b], prompts[b].next_position)).extend(chunks[b])
        full = seq.extend(encode_ids(tokens, seq.next_position))
        want = full_logprobs(ours, full, seq.length, tokens, 1.0)
        np.testing.assert_allclose(result.logprobs[b], want, atol=1e-4)


def test_attention_block_bytes_sizes_the_prefill_block(monkeypatch):
    """SamplerConfig.attention_block_bytes is the score budget the blockwise prefill's block is
    sized from (0 = the backend default, 8 MB on CPU); the sampled tokens and log-probs do not
    depend on it; a negative budget is refused by name."""
    from paravt_jax.models.qwen3_vl import attention as A

    seen = []
    original = A.blockwise_attention

    def spy(*args, **kwargs):
        seen.append(args[5] if len(args) > 5 else kwargs["block"])
        return original(*args, **kwargs)

    monkeypatch.setattr(A, "blockwise_attention", spy)
    monkeypatch.setattr(A, "DENSE_MAX_SCORE_BYTES", 0)  # auto: blockwise for every prefill
    model = init_model(preset("tiny"), seed=0)
    prompt = [encode_ids(np.random.default_rng(4).integers(0, 900, 300).tolist(), 0)]
    outs = []
    for budget in (0, 64 << 10):
        sampler = Sampler(model, SamplerConfig(attention_block_bytes=budget))
        assert sampler.backend.prefill_score_bytes == (budget or 8 << 20)
        out, _ = sampler.generate(prompt, sampling=SamplingParams(max_new_tokens=3, temperature=1.0), seed=5)
        outs.append(out)
    # 1 row x 4 heads: 8 MB allows the model's 512 block (capped), 64 kB a block of 64
    assert {512, 64} <= set(seen)
    assert outs[0].tokens == outs[1].tokens
    np.testing.assert_allclose(outs[0].logprobs[0], outs[1].logprobs[0], atol=1e-5)
    with pytest.raises(ValueError, match="attention_block_bytes"):
        Sampler(model, SamplerConfig(attention_block_bytes=-1))


def test_weight_first_matmul_equals_plain():
    """The CPU policy's matmul_t: few rows and a >= 1 MB weight take the weight-first form
    (the sampler's decode with real-size weights); both forms equal x @ w^T. Accelerators
    never take it."""
    from paravt_jax.sampling.backend import backend_policy

    cpu = backend_policy("cpu")
    assert backend_policy("gpu").weight_first_max_rows == 0
    rng = np.random.default_rng(2)
    w = rng.standard_normal((1024, 512)).astype(np.float32)  # 2 MB
    assert w.nbytes >= cpu.weight_first_min_bytes and 3 <= cpu.weight_first_max_rows < 80  # both branches
    for shape in ((3, 1, 512), (2, 40, 512)):  # 3 rows (weight-first), 80 rows (plain)
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(np.asarray(cpu.matmul_t(x, w)), x @ w.T, rtol=1e-5, atol=1e-4)


def test_prefill_blockwise_attention_equals_dense():
    """The cached forward with blockwise attention (blocks of 32 over 128 queries: causal
    block skipping, a padded row) writes the same hidden states and cache as dense attention."""
    import jax.numpy as jnp

    from paravt_jax.models.qwen3_vl.text import CacheView, KVCache

    model = init_model(preset("tiny", attention="dense"), seed=0)
    t = model.config.text
    rows, length, capacity = 2, 128, 192  # 128 queries: four causal blocks of 32
    rng = np.random.default_rng(1)
    ids = jnp.asarray(rng.integers(0, 900, (rows, length)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(length)[None, None], (3, rows, length))
    valid = jnp.zeros((rows, capacity), bool).at[0, :length].set(True).at[1, :100].set(True)
    zeros_k = tuple(jnp.zeros((rows, t.num_key_value_heads, t.head_dim, capacity)) for _ in range(t.num_hidden_layers))
    zeros_v = tuple(jnp.zeros((rows, t.num_key_value_heads, capacity, t.head_dim)) for _ in range(t.num_hidden_layers))
    view = CacheView(KVCache(zeros_k, zeros_v, valid), 0, window=length)

    def run(lang):
        return lang.forward_cached(ids, positions, view, block=32)

    dense = run(model.language)
    other = run(init_model(preset("tiny", attention="blockwise"), seed=0).language)
    for a, b in zip(jax.tree.leaves(dense), jax.tree.leaves(other)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_packed_vision_pass_over_the_fewest_frames_gives_the_fixed_pass_tokens(monkeypatch):
    """SamplerConfig.vision_buckets: a packed prefill whose prompts hold few of the call's fixed
    frames (4 rows x 8 frames) encodes a quarter or half of them, its features padded to the fixed
    count; the same greedy tokens and log-probs as encoding every blank frame, and the first call
    of the shape compiles each floor's pass (later calls compile nothing)."""
    from paravt_jax.sampling import programs
    from paravt_jax.sampling.vision_pass import vision_floor, vision_floors

    assert vision_floors(32) == (8, 16, 32) and vision_floors(1) == (1,)
    assert vision_floor({(4, 6): 3}, 32) == 8 and vision_floor({(4, 6): 9, (4, 4): 1}, 32) == 16
    assert vision_floor({(4, 6): 20}, 32) == 32 and vision_floor({(4, 6): 40}, 32) == 64  # beyond: its own bucket
    model = init_model(preset("tiny"), seed=6)
    rng = np.random.default_rng(2)
    grid = [1, 4, 6]

    def frames_row(n):
        row = [IM_START] + text_ids(rng, 3) + image_tokens(grid) * n + text_ids(rng, 2)
        return as_inputs(row, (np.array(row) == 912).astype(np.int64), patches(rng, [grid] * n), [grid] * n)

    shape = PromptShape(rows=4, width=128, frames_per_row=8)
    calls = [[frames_row(n) for n in counts] for counts in ((1, 2), (3, 4, 2), (6, 5, 7, 3), (2,))]
    frames = []
    real = programs.vision

    def spy(graphdef, params, pixels, meta, mesh=None, feature_rows=0):
        frames.append(pixels.shape[0] // (grid[1] * grid[2]))
        return real(graphdef, params, pixels, meta, mesh, feature_rows)

    monkeypatch.setattr(programs, "vision", spy)
    outs = {}
    for buckets in (False, True):
        sampler = Sampler(model, SamplerConfig(prompt_packing=True, vision_buckets=buckets))
        frames.clear()
        outs[buckets] = [sampler.generate(prompts, sampling=SamplingParams(max_new_tokens=6), shape=shape)[0]
                         for prompts in calls]
        if buckets:  # the first call compiles the other floors on blank frames first, then runs its own
            assert frames == [16, 32, 8, 16, 32, 8]  # 3, 9, 21 and 2 frames
            warm = real._cache_size()
            sampler.generate(calls[1], sampling=SamplingParams(max_new_tokens=2), shape=shape)
            assert real._cache_size() == warm
        else:
            assert frames == [32, 32, 32, 32]
    for fixed, bucketed in zip(outs[False], outs[True]):
        assert fixed.tokens == bucketed.tokens
        for a, b in zip(fixed.logprobs, bucketed.logprobs):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
