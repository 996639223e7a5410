"""The memory planner: byte counts against real (initialised, sharded) arrays, sharding
rules, optimizer state, preset parameter counts, fit verdicts and the CLI."""
import io
import json
import math
import os
from contextlib import redirect_stdout

import jax
import numpy as np
import pytest
from flax import nnx

from conftest import computed_once_per_session
from paravt_jax.cli.flags import UsageError
from paravt_jax.configs import paragrpo
from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl import init_model, preset
from paravt_jax.planner import arrays as A
from paravt_jax.planner import plan as P
from paravt_jax.planner import programs as G
from paravt_jax.planner import targets as T
from paravt_jax.planner import workload as W
from paravt_jax.planner.memory import ProgramMemory
from paravt_jax.run_config import build_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MESH8 = dict(data=1, fsdp=8, tensor=1)


def plan_of(config, sizes, memory, activations, tokenizer):
    return P.plan(build_run(config), sizes, memory, activations=activations, tokenizer=tokenizer)


def small_config(preset_name: str = "tiny"):
    """The tiny PARA-GRPO config with a short workload (fast XLA compiles)."""
    c = paragrpo.get_config("tiny")
    c.model.preset = preset_name
    c.rl.nframes_gating, c.rl.default_nframes = False, 4
    c.rl.rollout.max_new_tokens, c.rl.rollout.subagent_max_tokens, c.rl.rollout.max_turns = 32, 16, 1
    return c


def leaf_bytes(plan, name):
    return next(c for c in plan.trainer.components if c.name.startswith(name))


@pytest.fixture(scope="module")
def sharded_tiny():
    """(mesh, the tiny model initialised on it): built once, it takes seconds."""
    mesh = sh.make_mesh(MESH8)
    return mesh, init_model(preset("tiny"), mesh=mesh)


def test_fsdp_splits_divisible_weights_and_counts_replicated_leaves_fully():
    _, params, _ = A.abstract_params(preset("tiny"))
    for sizes, divided in ((MESH8, True), (dict(data=1, fsdp=3, tensor=1), False)):
        shardings = A.param_shardings(params, A.abstract_mesh(sizes))
        leaves = {path: (variable.get_value(), shardings[tuple(str(p) for p in path)])
                  for path, variable in nnx.to_flat_state(params)}
        embed, embed_sharding = leaves[("language", "embed_tokens")]  # (vocab 1000, embed 64)
        mine, whole = A._shard_bytes(embed.shape, embed.dtype, embed_sharding)
        # 64 % 8 == 0: an eighth per device; 64 % 3 != 0: the whole array on every device
        assert mine * (8 if divided else 1) == whole
        norm, norm_sharding = leaves[("language", "norm")]  # logical "norm": never sharded
        assert A._shard_bytes(norm.shape, norm.dtype, norm_sharding) == (norm.size * 4,) * 2
    total = A.tree_bytes(A._param_leaves(params, A.param_shardings(params, A.abstract_mesh(MESH8))))
    assert total.replicated_leaves > 0
    assert total.total / 8 < total.per_device < total.total / 8 + total.replicated_bytes


def test_optimizer_state_is_two_copies_of_the_parameters_plus_counts(tokenizer):
    for dtype in ("float32", "bfloat16"):
        config = paragrpo.get_config("tiny")
        config.model.param_dtype = dtype
        result = plan_of(config, MESH8, 16, "estimate", tokenizer)
        params, optimizer = leaf_bytes(result, "parameters"), leaf_bytes(result, "optimizer state")
        counts = 2 * 4  # adam's and the schedule's int32 step counters, replicated
        assert optimizer.global_bytes == 2 * params.global_bytes + counts
        assert optimizer.per_device_bytes == 2 * params.per_device_bytes + counts
        reference = leaf_bytes(result, "frozen reference")
        assert reference.per_device_bytes == params.per_device_bytes  # kl_ctl = 0.01 keeps one


@pytest.mark.parametrize("name,billions", [("2b", 2.13), ("4b", 4.44), ("8b", 8.77), ("32b", 33.36)])
def test_preset_parameter_counts_from_eval_shape(name, billions, tokenizer):
    _, params, _ = A.abstract_params(preset(name, param_dtype="bfloat16"))
    total = A.tree_bytes(A._param_leaves(params, A.param_shardings(params, A.abstract_mesh(MESH8))))
    assert abs(total.total / 2 / 1e9 - billions) < 0.006
    if name == "8b":  # v5p-8-like: 4 chips, fsdp over all
        config = paragrpo.get_config("qwen3vl_8b")
        result = plan_of(config, dict(data=1, fsdp=4, tensor=1), 95, "estimate", tokenizer)
        params = leaf_bytes(result, "parameters")
        assert abs(result.parameters / 1e9 - 8.77) < 0.005
        assert params.global_bytes == 2 * result.parameters
        assert math.isclose(params.per_device_bytes, params.global_bytes / 4, rel_tol=1e-3)


@pytest.fixture(scope="module")
def xla_plan(tokenizer):
    """The tiny recipe's plan from XLA's analysis of its compiled programs on 8 devices (the
    prefill token budget small enough to split the tool-response prefill into row groups)."""
    def compute():
        config = small_config()
        config.rl.sampler.prefill_tokens = 64
        return config, plan_of(config, MESH8, 16, "xla", tokenizer)

    return computed_once_per_session("xla_plan", compute)


def test_batch_spec_vision_layout_matches_vision_layout(tokenizer):
    """The spec's vision inputs have the shapes train/batch.py gives them: per shard of rows
    when the batch devices divide the rows (each shard's frames padded to a power of two),
    one replicated pass when they do not."""
    from paravt_jax.models.qwen3_vl.vision import frame_buckets, vision_layout

    config = small_config()
    model = preset("tiny")
    work = W.workload(W.rl_settings(build_run(config))[0], model.vision, tokenizer)
    h, w = (s // 16 for s in work.frame_size)
    for sizes, shards in ((MESH8, 8), ({"data": 1, "fsdp": 3, "tensor": 1}, 1)):
        assert work.micro_batch_rows % 8 == 0 and work.micro_batch_rows % 3
        spec = A.train_batch_spec(model, work, A.abstract_mesh(sizes))
        frames = frame_buckets({(h, w): work.micro_batch_rows // shards * work.overview_frames})[(h, w)]
        grids = np.array([[1, h, w]] * frames)
        real = vision_layout(grids, model.vision).device_arrays()
        lead = (shards,) if shards > 1 else ()
        expected = [lead + x.shape for x in jax.tree.leaves(real)]
        assert [x.shape for x in jax.tree.leaves(spec["vision_meta"])] == expected
        assert spec["pixel_values"].shape == lead + (int(grids.prod(1).sum()), model.vision.patch_dim)


def test_batch_spec_takes_parent_ids_with_shared_prompts(tokenizer):
    """rl.share_prompts: the planned train step takes parent ids beside the segment ids, as the
    run's micro-batches carry them; without it, neither it nor the workload's flag."""
    config = small_config()
    model = preset("tiny")
    config.rl.max_tokens_per_micro_batch = 8 * 1024
    plain = W.workload(W.rl_settings(build_run(config))[0], model.vision, tokenizer)
    config.rl.share_prompts = True
    shared = W.workload(W.rl_settings(build_run(config))[0], model.vision, tokenizer)
    assert plain.packed and shared.packed and not plain.shared_prompts and shared.shared_prompts
    mesh = A.abstract_mesh(MESH8)
    assert "parent_ids" not in A.train_batch_spec(model, plain, mesh)
    spec = A.train_batch_spec(model, shared, mesh)
    assert spec["parent_ids"].shape == spec["segment_ids"].shape


def test_fit_verdicts(tokenizer):
    config = paragrpo.get_config("tiny")
    roomy = plan_of(config, MESH8, 16, "estimate", tokenizer)
    assert all(p.fits for p in roomy.phases)
    assert 0 < roomy.trainer.headroom_percent < 100
    assert roomy.trainer.verdict().startswith("fits (headroom")
    tight = plan_of(config, MESH8, 0.01, "estimate", tokenizer)
    assert not tight.trainer.fits
    needs = tight.trainer.total_bytes / P.GIB
    assert tight.trainer.verdict() == f"does NOT fit (needs {needs:.2f} GiB, has 0.01)"


def test_plan_is_its_three_stages_and_a_measurement_reports_at_any_device_memory(tokenizer):
    """plan() = measure (the typed model and rl sections, the workload) -> compile (nothing to
    compile for the estimate) -> report; one measurement reported against two device memories
    gives the same rows and different verdicts."""
    run = build_run(paragrpo.get_config("tiny"))
    name, model = W.model_config(run)
    rl, _ = W.rl_settings(run)
    work = W.workload(rl, model.vision, tokenizer, W.Assumptions(), 8)
    measured = P.measure(model, rl, work, MESH8)
    assert measured.work == work and measured.layout == W.sampler_layout(rl, work)
    compiled = P.compile_stage(measured, "estimate")
    assert compiled.programs is None and compiled.compiler == "estimate" and compiled.notes == ()
    roomy, tight = (P.report(measured, compiled, name, gb) for gb in (16, 0.01))
    whole = plan_of(paragrpo.get_config("tiny"), MESH8, 16, "estimate", tokenizer)
    skip = ("host_peak_bytes", "notes")
    assert {k: v for k, v in roomy.to_json().items() if k not in skip} == \
        {k: v for k, v in whole.to_json().items() if k not in skip}
    assert roomy.notes == whole.notes[1:]  # the tokenizer note is plan()'s: it knows where the tokenizer came from
    assert roomy.trainer.components == tight.trainer.components and roomy.parameters == measured.state.count
    assert roomy.trainer.fits and not tight.trainer.fits


def test_a_config_without_rl_plans_the_rl_defaults(tokenizer):
    config = paragrpo.get_config("tiny")
    del config["rl"]
    rl, notes = W.rl_settings(build_run(config))
    assert rl == type(rl)() and notes == ("the config has no `rl` section: RLConfig defaults are planned",)
    result = plan_of(config, MESH8, 16, "estimate", tokenizer)
    assert result.notes[0] == notes[0] and result.workload.prompts_per_step == rl.prompts_per_step


class FakeJobs:
    """Stands in for programs.Jobs: records the depths asked for and returns programs whose
    temporaries grow 10 bytes and FLOPs 7 a layer (a scanned program's FLOPs count one layer)."""

    def __init__(self):
        self.asked, self.children = [], []

    def __call__(self, kind, config, settings, work, layout, names, where):
        layers, scan = config.text.num_hidden_layers, config.scan_layers
        self.asked.append((layers, scan))
        return [ProgramMemory(name, 100 + 10 * layers, 0, 1, 1.0, flops=7.0 * (1 if scan else layers))
                for name in names]


def test_trainer_compiles_take_memory_from_scanned_and_costs_from_unrolled_depths():
    """small125m (12 scanned layers), --depth=extrapolate: memory from 2 and 4 scanned layers,
    costs from 2 and 4 unrolled ones (by the cost target's jobs when it has its own), each
    number extended linearly to 12 layers; full: the 12-layer scanned program's memory."""
    config = preset("small125m")
    jobs, costs = FakeJobs(), FakeJobs()
    compiles = G.TrainerCompiles(config, None, None, jobs, costs, "xla:cpu")
    trainer, how = compiles.programs("extrapolate")
    assert jobs.asked == [(2, True), (4, True)] and costs.asked == [(2, False), (4, False)]
    assert how == ("memory extrapolated from 2 and 4 scanned layers to 12; trainer costs from 2 and 4 unrolled "
                   "layers compiled by xla:cpu")
    assert [p.name for p in trainer] == list(G.TRAINER_PROGRAMS)
    assert all(p.temp_bytes == 220 and p.flops == 84.0 and p.seconds == 4.0 for p in trainer)
    full, how = G.TrainerCompiles(config, None, None, jobs, jobs).programs("full", costs=False)
    assert jobs.asked[2:] == [(12, True)] and how == "full (12 scanned layers); no trainer costs"
    assert all(p.temp_bytes == 220 and p.flops == 0.0 for p in full)
    unscanned = G.TrainerCompiles(config.replace(scan_layers=False), None, None, jobs, jobs)
    assert unscanned.programs("full")[1] == "full (12 unrolled layers)" and jobs.asked[3:] == [(12, False)]
    assert G.resolved_depth("auto", config) == "full"
    assert G.resolved_depth("auto", config.replace(scan_layers=False)) == "extrapolate"


def test_a_failing_child_compile_returns_its_traceback(tokenizer):
    """Each program compiles in a child process (with 16 fake CPU devices here); a failing child's
    traceback comes back in a PlanError naming the program; a child runs only CHILD_FUNCTIONS."""
    from paravt_jax.planner import child as C
    from paravt_jax.planner import programs as G

    rl = W.rl_settings(build_run(small_config()))[0]
    bad = W.workload(rl, preset("tiny").vision, tokenizer)
    target = P.Target("cpu-fake", "gpu")
    with pytest.raises(P.PlanError, match=r"compiling gradients \[test\] in a child process failed with exit status 1:"
                                          r"\n(?s:.*)AttributeError: 'NoneType' object"):
        C.run_in_child(G.program_job, ("trainer", preset("tiny"), None, bad, None, dict(data=1, fsdp=16, tensor=1),
                                       target, ("gradients",)), T.target_env(target, 16), "gradients [test]")
    with pytest.raises(ValueError, match="is not one of"):
        C.run_in_child(P.plan, (), {}, "plan")


def plan_numbers(saved: dict) -> dict:
    """A plan's JSON without what depends on the host (compile seconds, child processes, host
    memory): what children and one process must agree on."""
    out = json.loads(json.dumps(saved))
    del out["host_peak_bytes"], out["programs"]["children"], out["programs"]["compile_seconds"]
    for program in out["programs"]["trainer"] + out["programs"]["sampler"]:
        del program["seconds"]
    for phase in ("trainer", "sampler", "rollout"):
        del out[phase]["compile_seconds"]
    out["notes"] = [n for n in out["notes"] if not n.startswith(("programs: compiled", "host memory:"))]
    return out


def test_cpu_fake_compiles_run_under_the_memory_scheduler(monkeypatch):
    """Every cpu-fake compile runs under CPU_FAKE_XLA_FLAGS: a child gets them in place of the
    parent's values; this process compiles for the mesh itself only when its XLA has them (the
    suite's processes do not: programs that run under them may deadlock XLA:CPU's collectives,
    seen in bench/vision_shards.py; the planner only compiles)."""

    flags = T.child_xla_flags("--xla_force_host_platform_device_count=8 --xla_dump_to=/tmp/x "
                              "--xla_cpu_enable_concurrency_optimized_scheduler=true", 16).split()
    assert flags.count("--xla_cpu_enable_concurrency_optimized_scheduler=false") == 1
    assert "--xla_cpu_enable_concurrency_optimized_scheduler=true" not in flags
    assert "--xla_force_host_platform_device_count=16" in flags and "--xla_dump_to=/tmp/x" in flags
    target = P.Target("cpu-fake", "gpu")
    assert T.target_devices(target, 8) is None  # this process' XLA schedules otherwise: a child compiles
    monkeypatch.setenv("XLA_FLAGS", " ".join(("--xla_force_host_platform_device_count=8", *T.CPU_FAKE_XLA_FLAGS)))
    assert T.target_devices(target, 8) == jax.devices()[:8]


def test_token_budget_micro_batches_and_rows_per_device(tokenizer):
    config = small_config()
    config.rl.prompts_per_step, config.rl.samples_per_prompt = 2, 8
    one = plan_of(config, MESH8, 16, "estimate", tokenizer)
    assert one.workload.micro_batches == 1 and one.workload.micro_batch_rows == 16 and one.rows_per_device == 2
    width = one.workload.train_length
    config.rl.max_tokens_per_micro_batch = 8 * width  # 8 rows per micro-batch: one per device
    budget = plan_of(config, MESH8, 16, "estimate", tokenizer)
    w = budget.workload
    assert (w.micro_batches, w.micro_batch_rows, w.packed, budget.rows_per_device) == (2, 8, True, 1)
    assert leaf_bytes(budget, "activations").per_device_bytes < leaf_bytes(one, "activations").per_device_bytes
    config.rl.max_tokens_per_micro_batch = 4 * width  # rounded up to 8 rows, the batch's devices
    assert plan_of(config, MESH8, 16, "estimate", tokenizer).workload.micro_batch_rows == 8
    config.rl.max_tokens_per_micro_batch, config.rl.micro_batches = 0, 4  # 4 rows do not divide fsdp = 8
    replicated = plan_of(config, MESH8, 16, "estimate", tokenizer)
    assert replicated.rows_per_device == 4 and any("replicated batch" in n for n in replicated.notes)


def plan_main(argv):
    from paravt_jax.cli.plan import main

    return main(argv)


def run_plan(*args):
    from paravt_jax.cli import main

    out = io.StringIO()
    with redirect_stdout(out):
        status = main(["paravt-jax", "plan", *args])
    assert status == 0, out.getvalue()[-2000:]
    return out.getvalue()


def test_cli_prints_the_table_and_writes_json(tmp_path, builtin_root):
    path = tmp_path / "plan.json"
    text = run_plan(f"--config={ROOT}/configs/paragrpo.py:tiny", "--config.rl.samples_per_prompt=8",
                    f"--config.data.builtin_root={builtin_root}",
                    "--mesh=data=2,fsdp=4,tensor=1", "--device_memory_gb=16", "--activations=estimate",
                    f"--json={path}", "--stage=rl")
    for phase in ("TRAINER", "SAMPLER", "ROLLOUT"):
        assert phase in text
    assert "mesh data=2 fsdp=4 tensor=1 (8 devices)" in text
    assert "optimizer state (adamw" in text and "KV cache (16 rows" in text
    assert text.count("=> fits (headroom") == 3
    saved = json.loads(path.read_text())
    assert saved["workload"]["rollout_rows"] == 16
    assert saved["trainer"]["fits"] is True
    assert saved["trainer"]["total_bytes"] == sum(c["per_device_bytes"] for c in saved["trainer"]["components"]
                                                  if c["counted"])


def test_cli_mesh_preset_and_bad_mesh(builtin_root):
    text = run_plan(f"--config={ROOT}/configs/paragrpo.py:tiny", "--mesh=v5p-8", "--activations=estimate",
                    f"--config.data.builtin_root={builtin_root}")
    assert "mesh data=1 fsdp=4 tensor=1 (4 devices); device memory 95 GiB" in text
    for mesh, message in (("data=1,fsdp=eight", "size of 'fsdp' is 'eight'"),
                          ("data=1,model=8", "unknown axis 'model'"),
                          ("fsdp=-1,data=-1", "at most one axis may be -1"),
                          ("v9z-1", "unknown mesh preset 'v9z-1'")):
        with pytest.raises(UsageError, match=message):
            plan_main(["plan", f"--config={ROOT}/configs/paragrpo.py:tiny", f"--mesh={mesh}", "--device_memory_gb=16"])
    with pytest.raises(UsageError, match="has 8 devices, 4 available"):
        plan_main(["plan", f"--config={ROOT}/configs/paragrpo.py:tiny", "--mesh=fsdp=8", "--devices=4",
                   "--device_memory_gb=16"])


def test_split_plan_scales_each_side_by_its_devices():
    """split_plan: the rollout stages over R devices, the training stages over N - R, the weight
    copy over the interconnect, the step the slower side (shared devices: the sum); the spread
    bytes grow as a side's devices shrink, the fixed ones do not; the suggestion is the fastest
    placement that leaves 10% of the memory on both sides."""
    from paravt_jax.planner.time_plan import CHIPS, PhaseTime, SideBytes, TimePlan, divisions, split_plan

    def phase(stage, seconds):
        return PhaseTime(stage, stage, 1.0, 0.0, 0.0, 0.0, 0.0, seconds, 0.0, 0.0)

    colocated = TimePlan("h100", "xla:cpu", (phase("rollout", 6.0), phase("refresh", 1.0),
                                             phase("gradients", 3.0), phase("update", 1.0)))
    assert divisions(8) == [4] and divisions(16) == [8] and divisions(12) == [6]
    gib = 2**30
    sides = dict(trainer=SideBytes(10 * gib, 10 * gib), rollout=SideBytes(8 * gib, 2 * gib), param_bytes=16 * gib)
    split = split_plan(colocated, 8, device_memory_bytes=80 * gib, given=2, **sides)
    assert split.colocated_seconds == 11.0 and [d.rollout_devices for d in split.divisions] == [0, 2, 4]
    shared, given, half = split.divisions
    assert shared.step_seconds == 11.0 and shared.bound == "shared"  # the sides share the devices' time
    assert shared.trainer_bytes == shared.rollout_bytes == 32 * gib  # 20 + 10 + 16 / 8: all at once
    assert (half.rollout_seconds, half.train_seconds) == (14.0, 8.0)  # 7 s x 8/4, 4 s x 8/4
    assert half.transfer_seconds == pytest.approx(4 * gib / CHIPS["h100"].interconnect_bytes_per_s)
    assert half.step_seconds == 14.0 and half.bound == "rollout"
    assert (half.trainer_bytes, half.rollout_bytes) == (30 * gib, 22 * gib)  # 10 x 2 + 10; 8 x 2 + 2 + 16 / 4
    assert given.rollout_seconds == 28.0 and given.train_seconds == pytest.approx(4 * 8 / 6)
    assert given.rollout_bytes == 42 * gib  # 8 x 4 + 2 + 16 / 2
    assert split.best is shared  # 11 s against 14 s and 28 s
    # the bound conserves device seconds: no division beats the colocated 11 s
    assert min(d.step_seconds for d in split.divisions) >= split.colocated_seconds
    tight = split_plan(colocated, 8, device_memory_bytes=32 * gib, given=2, **sides)
    assert not any(d.fits for d in tight.divisions) and tight.best is None  # 32, 42 and 30 GiB over 28.8
    roomy = split_plan(colocated, 8, device_memory_bytes=34 * gib, given=2, **sides)
    assert roomy.best is roomy.divisions[2]  # only the even split fits 30.6 GiB: 30 and 22 GiB
