"""The memory planner against compiled programs and real arrays: byte counts of the initialised,
sharded tiny model, the sampler's cache and working sets from XLA, the `plan` command (the unit
tests: tests/unit/test_plan.py; a plan in one process against a child per program:
tests/slow/test_plan_compile_in.py)."""
import json
import os
import subprocess
import sys

import jax
import pytest

from paravt_jax.configs import paragrpo
from paravt_jax.models.qwen3_vl import init_model, preset
from paravt_jax.planner import workload as W
from paravt_jax.run_config import build_run
from unit import test_plan as unit_tests
from unit.test_plan import MESH8, ROOT, leaf_bytes, plan_of, run_plan, small_config

sharded_tiny, xla_plan = unit_tests.sharded_tiny, unit_tests.xla_plan  # the fixtures


def test_parameter_bytes_equal_the_initialised_sharded_model(sharded_tiny, tokenizer):
    config = paragrpo.get_config("tiny")
    result = plan_of(config, MESH8, 16, "estimate", tokenizer)
    mesh, model = sharded_tiny
    arrays = [x for x in jax.tree.leaves(model) if isinstance(x, jax.Array)]
    device = mesh.devices.flat[0]
    on_device = sum(s.data.nbytes for a in arrays for s in a.addressable_shards if s.device == device)
    params = leaf_bytes(result, "parameters")
    assert result.parameters == sum(a.size for a in arrays)
    assert params.global_bytes == sum(a.nbytes for a in arrays)
    assert params.per_device_bytes == on_device


def test_kv_cache_matches_the_samplers_own_cache(sharded_tiny, tokenizer):
    """The prompt cache (one per prompt) and the per-row cache after the prompt are the arrays
    the sampler allocates; the episode's cache is reserved up front (no growth copy row)."""
    from paravt_jax.sampling.sampler import Sampler

    config = small_config()
    result = plan_of(config, MESH8, 16, "estimate", tokenizer)
    layout = W.sampler_layout(W.rl_settings(build_run(config))[0], result.workload)
    mesh, model = sharded_tiny
    sampler = Sampler(model, mesh=mesh)
    for name, rows, slots in (("prompt KV cache (", layout.prompt_rows, layout.prefix_slots),
                              ("KV cache (", layout.rows, layout.suffix_slots)):
        cache = sampler.empty_cache(rows, slots)
        arrays = cache.keys + cache.values
        row = next(c for c in result.sampler.components if c.name.startswith(name))
        assert row.per_device_bytes == sum(a.addressable_shards[0].data.nbytes for a in arrays)
        assert row.global_bytes == sum(a.nbytes for a in arrays)
    assert layout.prompt_rows == 2 and layout.rows == 2 * result.workload.samples_per_prompt
    assert not any("growth" in c.name for c in result.sampler.components)


def test_rollout_reserve_never_grows_the_cache():
    """The suffix the planner counts is the one the rollout reserves: a tiny model's rollout
    turns at their longest never outgrow it."""
    from paravt_jax.sampling import Sampler, SamplerConfig, SamplingParams
    from paravt_jax.sampling.kv_cache import episode_capacity
    from paravt_jax.text.inputs import encode_ids

    turns = [(0, 5), (40, 5), (70, 3)]
    slots = episode_capacity(turns, 16, 1024)
    sampler = Sampler(init_model(preset("tiny"), seed=1), SamplerConfig(min_chunk_bucket=16))
    out, state = sampler.generate([encode_ids(list(range(1, 9)), 0)], num_samples=2,
                                  sampling=SamplingParams(max_new_tokens=5), reserve=turns[1:])
    for chunk, budget in turns[1:]:
        chunks = [encode_ids(list(range(1, chunk + 1)), int(s)) for s in state.chunk_start]
        out, state = sampler.extend(state, chunks, sampling=SamplingParams(max_new_tokens=budget))
        assert state.suffix.capacity == slots


def test_sampler_working_sets_come_from_xla(xla_plan):
    """xla mode: the sampler's working set is XLA's analysis of the real prefill/decode/vision
    programs (one per call, the largest counted); the per-call row groups follow the token budget."""
    config, result = xla_plan
    row = next(c for c in result.sampler.components if c.name.startswith("prefill/decode working set (xla:cpu"))
    assert row.per_device_bytes > 0 and not row.estimate
    note = next(n for n in result.notes if n.startswith("sampler working sets"))
    for name in ("first prompt prefill", "tool-response prefill", "sub-agent prefill", "decode", "sub-agent decode",
                 "vision tower (sub-agent prefill)", "weight refresh"):
        assert name in note
    assert row.per_device_bytes == max(p.working_bytes for p in result.programs.sampler)
    rl = W.rl_settings(build_run(config))[0]
    layout = W.sampler_layout(rl, result.workload)
    extend = result.programs.get("tool-response prefill")
    # the extend's 8 rows (2 prompts x 4 samples) split by rows over the 8 devices, one a device:
    # each device's block lies within one prompt (prefill.block_prefixes)
    assert (extend.row_shards, extend.group_rows) == (8, layout.rows) and layout.prompt_rows == 2
    assert result.trainer.compiler == result.sampler.compiler == "xla:cpu" and result.target == "cpu-fake"


def test_xla_activations_agree_with_the_estimate(xla_plan, tokenizer):
    config, xla = xla_plan
    estimate = plan_of(config, MESH8, 16, "estimate", tokenizer)
    measured = leaf_bytes(xla, "activations (xla:cpu").per_device_bytes
    guessed = leaf_bytes(estimate, "activations (ESTIMATE").per_device_bytes
    assert xla.activations == "xla" and measured > 0
    assert 0.5 < guessed / measured < 2.0


def test_plan_exits_0_and_prints_only_notes_after_the_table(builtin_root, tmp_path):
    """`python -m paravt_jax.cli plan` from a plain environment (no XLA_FLAGS: the xla compile
    for 2 devices runs in a child process, here one for all the programs; a child per program,
    the default, in tests/integration/test_plan_tpu.py and tests/unit/test_plan.py): exit 0,
    nothing after the table but notes."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = ROOT
    done = subprocess.run([sys.executable, "-m", "paravt_jax.cli", "plan", f"--config={ROOT}/configs/paragrpo.py:tiny",
                           f"--config.data.builtin_root={builtin_root}", "--config.rl.rollout.max_new_tokens=32",
                           "--config.rl.rollout.max_turns=1", "--mesh=data=1,fsdp=2,tensor=1", "--device_memory_gb=16",
                           "--activations=xla", "--question_tokens=40", "--stage=rl", "--compile_in=process"],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "MemoryPlan(" not in done.stderr and "Traceback" not in done.stderr
    lines = done.stdout.rstrip().splitlines()
    last_verdict = max(i for i, line in enumerate(lines) if line.startswith("  => "))
    assert lines[last_verdict - 1].startswith("  total")
    after = [line for line in lines[last_verdict + 1:] if line]
    # then the compiled programs' table (and a time plan for a named chip), then notes only
    first_note = next(i for i, line in enumerate(after) if line.startswith("note: "))
    assert after[0].startswith("PROGRAMS: compiled by xla:cpu")
    assert all(line.startswith(("  ", "TIME PLAN")) for line in after[1:first_note]), after[:first_note]
    tail = after[first_note:]
    assert tail and all(line.startswith("note: ") for line in tail), tail
    assert any("2 fake CPU devices" in line and "in one child process" in line for line in tail)
    assert any(line.startswith("note: host memory: ") for line in tail)
    assert any("assumed question 40 tokens" in line for line in tail)


# run by tests/slow/test_plan_compile_in.py (~41 s)
def gpu_preset_prints_the_time_plan_from_xla(tmp_path, builtin_root):
    """`--mesh=gpu8`: the programs compile with XLA (fake CPU devices planning GPU kernels) and
    the time plan uses the H100's peaks; --json names the compiler of each phase and holds it."""
    path = tmp_path / "plan.json"
    text = run_plan(f"--config={ROOT}/configs/paragrpo.py:tiny", f"--config.data.builtin_root={builtin_root}",
                    "--config.rl.nframes_gating=False", "--config.rl.default_nframes=4",
                    "--config.rl.rollout.max_new_tokens=32", "--config.rl.rollout.max_turns=1",
                    "--config.rl.dispatch.max_parallel=1", "--config.rl.dispatch.max_frames=2",
                    "--config.mesh.rollout_devices=4", "--mesh=gpu8", "--target=cpu-fake", f"--json={path}",
                    "--stage=rl", "--compile_in=process")
    assert "TRAINER: one optimizer step [xla:cpu" in text and "TIME PLAN: one RL step, lower bound on h100" in text
    assert "ASYNCHRONOUS ROLLOUTS" in text and "<- config" in text and "suggested: mesh.rollout_devices=" in text
    saved = json.loads(path.read_text())
    assert saved["target"] == "cpu-fake" and saved["trainer"]["compiler"] == "xla:cpu"
    timing = saved["time_plan"]
    assert timing["chip"] == "h100" and timing["step_seconds"] > 0
    assert timing["bounding_phase"] in {p["name"] for p in timing["phases"]}
    assert timing["reference_step_seconds"] == 250.0
    split = timing["split"]  # colocated against split, for the divisions that keep the shards whole
    assert split["given"] == 4 and [d["rollout_devices"] for d in split["divisions"]] == [0, 4]
    assert split["colocated_step_seconds"] == pytest.approx(timing["step_seconds"])
    assert split["suggested"] in (None, *[d["rollout_devices"] for d in split["divisions"] if d["fits"]])
