"""`paravt-jax plan --target=tpu`: the TPU compiler (libtpu, installed by the `tpu` extra that the
`test` extra includes) compiles the tiny recipe's train step, prefills, decodes and vision tower
for a v5p:2x2x2 topology from this CPU process; the plan's fields, the time plan, the topology
table, the target rules and the depth extrapolation."""
import dataclasses
import json
import os

import pytest

from conftest import computed_once_per_session
from paravt_jax.configs import paragrpo
from paravt_jax.infra import meshes
from paravt_jax.models.qwen3_vl import preset
from paravt_jax.planner import plan as P
from paravt_jax.planner import programs as G
from paravt_jax.planner import targets as TG
from paravt_jax.planner import time_plan as T
from paravt_jax.planner import workload as W
from paravt_jax.planner.memory import collective_bytes
from paravt_jax.run_config import build_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tpu_config():
    """The tiny recipe with a short workload: one tool round of one crop of two frames."""
    c = paragrpo.get_config("tiny")
    c.rl.nframes_gating, c.rl.default_nframes = False, 4
    c.rl.rollout.max_new_tokens, c.rl.rollout.subagent_max_tokens, c.rl.rollout.max_turns = 32, 16, 1
    c.rl.dispatch.max_parallel, c.rl.dispatch.max_frames = 1, 2
    return c


def test_topologies_and_targets(monkeypatch):
    assert TG.tpu_topology("v5p", 8) == "v5p:2x2x2" and TG.tpu_topology("v5p", 32) == "v5p:2x4x4"
    assert TG.tpu_topology("v5e", 16) == "v5e:4x4"
    for name, entry in meshes.MESHES.items():  # every TPU preset has a topology
        if entry["platform"] == "tpu":
            target = TG.resolve_target("tpu", entry)
            assert target.name == "tpu" and target.compiler == "tpu" and target.slices == entry["slices"], name
    assert TG.resolve_target("auto", meshes.get_mesh("v5p-16")).name == "tpu"  # libtpu is installed here
    # a GPU preset under auto: XLA:CPU where XLA:GPU is missing (as in CI; with the CUDA plugin
    # installed auto picks gpu: tests/integration/test_plan_gpu.py)
    monkeypatch.setattr(TG.gpu_target, "missing", lambda: "the CUDA plugin is not installed")
    assert TG.resolve_target("auto", meshes.get_mesh("gpu8")) == TG.Target("cpu-fake", "gpu")
    with pytest.raises(TG.TargetError, match="needs a TPU mesh preset"):
        TG.resolve_target("tpu", meshes.get_mesh("gpu8"))
    with pytest.raises(TG.TargetError, match="--target='cuda'"):
        TG.resolve_target("cuda", None)
    with pytest.raises(TG.TargetError, match="no v5p topology of 6 chips"):
        TG.tpu_topology("v5p", 6)


def test_collective_bytes_reads_the_hlo_ops():
    hlo = """
  %ag = bf16[8,1024]{1,0} all-gather(bf16[1,1024]{1,0} %p), replica_groups=[1,8]<=[8], dimensions={0}
  %rs = f32[128]{0} reduce-scatter(f32[1024]{0} %g), replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %ar = (f32[256]{0}, f32[256]{0}) all-reduce-start(f32[256]{0} %x), replica_groups=[2,4]<=[8]
  %add = f32[128]{0} add(f32[128]{0} %a, f32[128]{0} %b)
"""
    expected = 8 * 1024 * 2 * 7 / 8 + 128 * 4 * 7 + 256 * 4 * 2 * 3 / 4
    assert collective_bytes(hlo) == pytest.approx(expected)


@pytest.fixture(scope="module")
def tiny_tpu_plan(tokenizer):
    """The tiny recipe's plan for v5p-16 by the TPU compiler, every program compiled in this
    process (`compile_in="process"`: 14 child processes, the default, would spend ~60 CPU seconds
    more starting JAX and libtpu; the children are compared with it below)."""
    def compute():
        target = TG.resolve_target("tpu", meshes.get_mesh("v5p-16"))
        return P.plan(build_run(tpu_config()), meshes.mesh_shape("v5p-16"), 95, "xla", tokenizer=tokenizer,
                      target=target, depth="extrapolate", chip="v5p", compile_in="process")

    return computed_once_per_session("tiny_tpu_plan", compute)


def test_tiny_plan_compiled_by_the_tpu_compiler(tiny_tpu_plan):
    """CI's TPU check: the tiny recipe's programs compile for v5p:2x2x2 (8 chips, v5p-16), the
    training attention is the splash kernel, every phase names the TPU compiler, and the time
    plan is built from the TPU compiler's cost analysis."""
    result = tiny_tpu_plan
    assert result.target == "tpu" and result.activations == "xla"
    for phase in result.phases:
        assert phase.compiler == "tpu" and phase.compile_seconds > 0 and phase.fits
    programs = result.programs
    assert [p.name for p in programs.trainer] == ["gradients", "log-probs", "optimizer update"]
    names = [p.name for p in programs.sampler]
    for name in ("first prompt prefill", "tool-response prefill", "sub-agent prefill", "decode", "sub-agent decode",
                 "vision tower (first prompt prefill)", "vision tower (sub-agent prefill)", "weight refresh"):
        assert name in names
    for program in programs.trainer + programs.sampler:
        assert program.compiler == "tpu" and program.seconds > 0
        assert program.argument_bytes > 0 and program.total_bytes >= program.temp_bytes
    grads = programs.get("gradients")
    assert "splash" in grads.attention and grads.kernel_text_flops > 0  # Pallas, counted analytically
    assert grads.flops > programs.get("log-probs").flops > 0 and grads.collective_bytes > 0
    activations = next(c for c in result.trainer.components if c.name.startswith("activations (tpu temp"))
    assert activations.per_device_bytes == max(p.temp_bytes for p in programs.trainer)

    timing = result.time_plan
    assert timing.chip == "v5p" and timing.compiler == "tpu" and timing.step_seconds > 0
    decode = next(p for p in timing.phases if p.name == "decode")
    assert decode.calls == 2 * 32  # two turns of 32 decode steps
    assert timing.bounding.seconds == max(p.seconds for p in timing.phases)

    saved = result.to_json()
    assert saved["trainer"]["compiler"] == saved["sampler"]["compiler"] == saved["rollout"]["compiler"] == "tpu"
    assert saved["time_plan"]["step_seconds"] == pytest.approx(timing.step_seconds)
    assert {p["name"] for p in saved["time_plan"]["phases"]} >= {"gradients", "decode", "optimizer update"}
    json.dumps(saved)  # plain JSON
    text = P.format_plan(result)
    assert "PROGRAMS: compiled by tpu" in text and "TIME PLAN" in text and "bounded by:" in text


def test_programs_compiled_in_children_equal_those_compiled_in_this_process(tiny_tpu_plan):
    """Each program compiled by the TPU compiler in a child process of its own (the planner's
    default; libtpu's topology made in each child) gives the numbers of the same program compiled
    in this process: the decode and the sub-agent prefill's vision tower compiled in children
    against the plan's, compiled here (the whole plan in one process is
    tests/integration/test_plan.py's comparison for XLA:CPU)."""
    result = tiny_tpu_plan
    assert not result.programs.children  # compile_in="process"
    run = build_run(tpu_config())
    _, model = W.model_config(run)
    rl = W.rl_settings(run)[0]
    names = ("decode", "vision tower (sub-agent prefill)")
    jobs = G.Jobs(TG.resolve_target("tpu", meshes.get_mesh("v5p-16")), meshes.mesh_shape("v5p-16"), None)
    children = jobs("sampler", model, rl, result.workload, W.sampler_layout(rl, result.workload), names, "test")
    assert len(jobs.children) == len(names) and all(child.peak_bytes > 0 for child in jobs.children)

    def numbers(program):
        return {k: v for k, v in dataclasses.asdict(program).items() if k != "seconds"}

    assert [numbers(p) for p in children] == [numbers(result.programs.get(name)) for name in names]
    assert children[0].temp_bytes > 0 and children[0].flops > 0


def test_requested_kernel_off_its_platform_is_an_error(tokenizer):
    config = tpu_config()
    config.model.attention = "cudnn"
    target = TG.resolve_target("tpu", meshes.get_mesh("v5p-8"))
    with pytest.raises(ValueError, match="model.attention='cudnn' runs on gpu only; this program is compiled for tpu"):
        P.plan(build_run(config), meshes.mesh_shape("v5p-8"), 95, "xla", tokenizer=tokenizer, target=target,
               depth="extrapolate")


def test_time_plan_counts_calls_and_bounds():
    """The time of a phase is max(compute, memory, network) x calls; the step is their sum."""
    from paravt_jax.planner.memory import ProgramMemory

    grads = ProgramMemory("gradients", 0, 0, 8, 1.0, flops=459e12, bytes_accessed=1e9, collective_bytes=0.0)
    update = ProgramMemory("optimizer update", 0, 0, 0, 1.0, bytes_accessed=2765e9 * 2)
    programs = G.ProgramSet((grads, update), (), "tpu", "test", 2.0)
    rl = W.rl_settings(build_run(tpu_config()))[0]
    work = dataclasses.replace(_workload(), micro_batches=3)
    result = T.time_plan(programs, rl, work, None, preset("tiny"), "v5p")
    g, u = result.phases
    assert (g.calls, g.seconds, g.bound) == (3, pytest.approx(3.0), "compute")
    assert (u.calls, u.seconds, u.bound) == (1, pytest.approx(2.0), "memory")
    assert result.step_seconds == pytest.approx(5.0) and result.bounding.name == "gradients"
    with pytest.raises(ValueError, match="no peak numbers for chip 'v9'"):
        T.time_plan(programs, rl, work, None, preset("tiny"), "v9")


def _workload():
    from paravt_jax.text.tokenizer import train_tokenizer

    tok = train_tokenizer(["crop_video start_time end_time seconds frames"] * 10)
    return W.workload(W.rl_settings(build_run(tpu_config()))[0], preset("tiny").vision, tok)
