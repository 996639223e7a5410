"""`paravt-jax plan --target=gpu`: XLA:GPU compiles the planner's programs for GPUs from this CPU
process (the CUDA plugin's compile-only devices of a GpuTargetConfig, planner/gpu_target.py).

The target-config text, the topologies and the target rules run everywhere. The compiles need
the CUDA plugin and ptxas (`pip install 'paravt_jax[gpu-plan]'`), which the test extra leaves
out (4.4 GB of NVIDIA wheels; about 3 minutes to install, and this module's compiles 3 to 4
minutes on this 2-core machine, against CI's 30-minute budget): where they are missing those
tests are skipped with the reason, in CI as elsewhere (they are not the torch parity tests that
CI must run). With it: `pip install -e '.[test,gpu-plan]'`, then this module."""
import re

import pytest

from paravt_jax.infra import meshes
from paravt_jax.planner import gpu_target as GT
from paravt_jax.planner import programs as G
from paravt_jax.planner import targets as T
from paravt_jax.run_config import build_run

MISSING = GT.missing()
needs_gpu_compiler = pytest.mark.skipif(MISSING is not None, reason=f"no XLA:GPU here: {MISSING}")


def _fields(text: str) -> dict[str, str]:
    """`path.to.field` -> value of a text proto (nested messages joined by dots)."""
    out, stack = {}, []
    for line in text.splitlines():
        line = line.strip()
        if line.endswith("{"):
            stack.append(line[:-1].strip())
        elif line == "}":
            stack.pop()
        elif line:
            key, value = (part.strip() for part in line.split(":", 1))
            out[".".join([*stack, key])] = value
    assert not stack, "unbalanced braces"
    return out


def test_target_config_text_of_each_gpu():
    """The GpuTargetConfig text the CUDA plugin takes: the vendors' numbers for H100, H200 and
    A100 in the plugin's field names, no field the plugin rejects."""
    h100 = _fields(GT.target_config_text("h100", cudnn=(9, 10, 2)))
    assert h100["gpu_device_info.core_count"] == "132" and h100["gpu_device_info.fpus_per_core"] == "128"
    assert h100["gpu_device_info.cuda_compute_capability.major"] == "9"
    assert h100["gpu_device_info.cuda_compute_capability.minor"] == "0"
    assert h100["gpu_device_info.memory_bandwidth"] == str(3_350_000_000_000)
    assert h100["gpu_device_info.l2_cache_size"] == str(50 * 2**20)
    assert h100["gpu_device_info.shared_memory_per_block_optin"] == str(227 * 1024)
    assert h100["device_description_str"] == '"NVIDIA H100 80GB HBM3"' and h100["platform_name"] == '"CUDA"'
    assert (h100["dnn_version_info.major"], h100["dnn_version_info.minor"], h100["dnn_version_info.patch"]) == \
        ("9", "10", "2")
    h200 = _fields(GT.target_config_text("h200"))
    assert h200["gpu_device_info.memory_bandwidth"] == str(4_800_000_000_000)
    assert int(h200["gpu_device_info.device_memory_size"]) == 141 * 2**30
    a100 = _fields(GT.target_config_text("a100"))
    assert a100["gpu_device_info.cuda_compute_capability.major"] == "8"
    assert a100["gpu_device_info.core_count"] == "108" and a100["gpu_device_info.l2_cache_size"] == str(40 * 2**20)
    for accelerator in GT.GPUS:
        text = GT.target_config_text(accelerator)
        # XLA's own spec files carry it; the jax[cuda12] 0.10 plugin refuses the config with it
        assert "collective_memory_granularity" not in text
        assert len(re.findall(r"^[a-z]", text, re.M)) == 4  # gpu_device_info, platform, dnn version, name
    with pytest.raises(ValueError, match="no GPU target config for 'v100'"):
        GT.target_config_text("v100")


def test_gpu_topologies_and_targets(monkeypatch):
    """Every GPU preset has a topology (its hosts as slices), `auto` picks gpu for GPU presets
    where XLA:GPU is installed (cpu-fake where not), and the target's refusals."""
    assert GT.gpu_topology(1, 8) == "1x1x8" and GT.gpu_topology(2, 16) == "2x1x8"
    assert GT.topology_devices("2x1x8") == 16
    assert T.gpu_topology_of(2) == "1x1x2" and T.gpu_topology_of(16) == "2x1x8"
    monkeypatch.setattr(GT, "missing", lambda: None)
    for name, entry in meshes.MESHES.items():
        if entry["platform"] == "gpu":
            target = T.resolve_target("gpu", entry)
            assert target.compiler == "gpu" and target.accelerator == entry["accelerator"], name
            assert GT.topology_devices(target.topology) == entry["devices"], name
    assert T.resolve_target("gpu", meshes.get_mesh("gpu16_tp2-h200")) == T.Target("gpu", "gpu", "2x1x8",
                                                                                 accelerator="h200")
    assert T.resolve_target("auto", meshes.get_mesh("gpu8")).name == "gpu"
    assert T.resolve_target("gpu", None, "a100") == T.Target("gpu", "gpu", accelerator="a100")
    with pytest.raises(T.TargetError, match="needs a GPU mesh preset"):
        T.resolve_target("gpu", meshes.get_mesh("v5p-16"))
    with pytest.raises(T.TargetError, match="no target config for GPU 'v100'"):
        T.resolve_target("gpu", None, "v100")
    monkeypatch.setattr(GT, "missing", lambda: "the CUDA plugin is not installed")
    assert T.resolve_target("auto", meshes.get_mesh("gpu8")) == T.Target("cpu-fake", "gpu")
    with pytest.raises(T.TargetError, match="needs XLA:GPU here: the CUDA plugin is not installed"):
        T.resolve_target("gpu", meshes.get_mesh("gpu8"))


def tiny_gpu_config(dtype: str = "bfloat16"):
    """The tiny recipe with a short workload (one tool round of one crop of two frames) in
    bfloat16, so that cuDNN's attention takes the training and vision calls."""
    from paravt_jax.configs import paragrpo

    c = paragrpo.get_config("tiny")
    c.rl.nframes_gating, c.rl.default_nframes = False, 4
    c.rl.rollout.max_new_tokens, c.rl.rollout.subagent_max_tokens, c.rl.rollout.max_turns = 32, 16, 1
    c.rl.dispatch.max_parallel, c.rl.dispatch.max_frames = 1, 2
    c.model.dtype = dtype
    return c


@needs_gpu_compiler
def test_tiny_plan_compiled_by_the_gpu_compiler(tokenizer):
    """The tiny recipe's every program compiled by XLA:GPU for 2 H100s (topology 1x1x2): each
    phase names the GPU compiler, cuDNN's attention runs in the gradient and the vision tower,
    and the time plan says where its FLOPs and bytes come from."""
    from paravt_jax.planner import plan as P
    from paravt_jax.planner.memory import MODULE_COSTS

    target = T.resolve_target("gpu", None, "h100")
    result = P.plan(build_run(tiny_gpu_config()), {"data": 1, "fsdp": 2, "tensor": 1}, 80, "xla", tokenizer=tokenizer,
                    target=target, chip="h100", compile_in="process")
    assert result.target == "gpu" and result.activations == "xla"
    for phase in result.phases:
        assert phase.compiler == "gpu" and phase.compile_seconds > 0 and phase.fits
    programs = result.programs
    assert programs.compiler == "gpu"
    assert "cudnn" in programs.get("gradients").attention
    assert "cudnn" in programs.get("vision tower (first prompt prefill)").attention
    # the sampler's costs: XLA:CPU's analysis of the GPU modules; the trainer's: its unrolled
    # programs compiled by XLA:CPU (targets.COST_TARGETS)
    for program in programs.sampler:
        assert program.compiler == "gpu" and program.cost_source == MODULE_COSTS, program.name
    for program in programs.trainer:
        assert program.compiler == "gpu" and program.cost_source == "xla:cpu", program.name
    assert "trainer costs from 2 unrolled layers compiled by xla:cpu" in programs.depth
    assert programs.get("gradients").flops > 0 and programs.get("decode").bytes_accessed > 0
    assert result.time_plan.costs == "xla:cpu's cost_analysis; XLA:CPU's cost analysis of gpu's optimised modules"
    assert any("NVIDIA H100 80GB HBM3 x 2, topology 1x1x2" in n for n in result.notes)
    saved = result.to_json()
    assert saved["trainer"]["compiler"] == "gpu" and saved["time_plan"]["costs"] == result.time_plan.costs


@needs_gpu_compiler
def test_gpu_module_flops_match_xla_cpu(tokenizer):
    """XLA:CPU's cost analysis of the optimised GPU module counts the FLOPs XLA:CPU's own
    compile of the same program counts: the tiny gradient program (2 unrolled layers, float32,
    dense attention: the same work on both) for 2 H100s and for 2 fake CPU devices."""
    import jax

    from paravt_jax.infra import sharding as sh
    from paravt_jax.planner.memory import MODULE_COSTS
    from paravt_jax.planner.workload import Assumptions, model_config, rl_settings, workload

    config = tiny_gpu_config("float32")
    config.model.attention = "dense"
    _, model = model_config(build_run(config))
    rl, _ = rl_settings(build_run(config))
    model = model.replace(scan_layers=False)
    work = workload(rl, model.vision, tokenizer, Assumptions(), 2)
    sizes = {"data": 1, "fsdp": 2, "tensor": 1}
    gpu_devices = T.target_devices(T.resolve_target("gpu", None, "h100"), 2)
    gpu = G.trainer_programs(model, rl, work, sh.make_mesh(sizes, gpu_devices), ["gradients"])[0]
    cpu = G.trainer_programs(model, rl, work, sh.make_mesh(sizes, jax.devices("cpu")[:2]), ["gradients"])[0]
    assert gpu.compiler == "gpu" and gpu.cost_source == MODULE_COSTS and cpu.compiler == "xla:cpu"
    assert gpu.flops == pytest.approx(cpu.flops, rel=0.05), (gpu.flops, cpu.flops)


@needs_gpu_compiler
def test_codegen_options_change_no_number(monkeypatch):
    """gpu_target.COMPILE_OPTIONS (LLVM and ptxas without optimisation) change only the generated
    code: a sharded, rematerialised, scanned bfloat16 gradient compiled with and without them for
    2 H100s has the same optimised module and the same memory numbers; the planner's compiles
    pass them."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as PS

    from paravt_jax.infra import sharding as sh
    from paravt_jax.planner.memory import compile_for

    devices = T.target_devices(T.resolve_target("gpu", None, "h100"), 2)
    mesh = sh.make_mesh({"data": 1, "fsdp": 2, "tensor": 1}, devices)

    def loss(w, x):
        def layer(h, w_layer):
            return jnp.tanh(h @ w_layer) + h, None

        h, _ = jax.lax.scan(jax.checkpoint(layer), x, w)
        return jnp.mean(h.astype(jnp.float32) ** 2)

    w = jax.ShapeDtypeStruct((4, 512, 512), jnp.bfloat16, sharding=NamedSharding(mesh, PS(None, "fsdp", None)))
    x = jax.ShapeDtypeStruct((8, 256, 512), jnp.bfloat16, sharding=NamedSharding(mesh, PS("fsdp")))
    grad = jax.jit(jax.grad(loss))
    lowered = grad.lower(w, x)
    fast, plain = lowered.compile(compiler_options=dict(GT.COMPILE_OPTIONS)), lowered.compile()
    fields = ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes")
    assert [getattr(fast.memory_analysis(), f) for f in fields] == \
        [getattr(plain.memory_analysis(), f) for f in fields]
    assert fast.memory_analysis().temp_size_in_bytes > 0
    assert fast.as_text() == plain.as_text()

    seen = []
    compile_ = jax.stages.Lowered.compile

    def record(self, compiler_options=None, **kwargs):
        seen.append(compiler_options)
        return compile_(self, compiler_options=compiler_options, **kwargs)

    monkeypatch.setattr(jax.stages.Lowered, "compile", record)
    compile_for("toy gradient", grad, (w, x), {}, (), 1, devices, mesh=mesh)
    assert seen == [GT.COMPILE_OPTIONS]


@needs_gpu_compiler
def test_a_fused_kernel_the_gpu_compiler_refuses_is_named(monkeypatch):
    """An attention kernel that fails to compile is an error naming the kernel and the program,
    not a bare compiler error."""
    import jax
    import jax.numpy as jnp

    from paravt_jax.infra import sharding as sh
    from paravt_jax.models.qwen3_vl import attention
    from paravt_jax.models.qwen3_vl.attention_mask import AttentionMask
    from paravt_jax.planner.memory import compile_for

    devices = T.target_devices(T.resolve_target("gpu", None, "h100"), 1)
    mesh = sh.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices)

    @jax.jit
    def attend(q):
        mask = AttentionMask.causal_segments(jnp.ones(q.shape[:2], jnp.int32))
        return attention.attend(q, q, q, mask, "cudnn")

    q = jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.bfloat16,
                             sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))

    def refuse(*args, **kwargs):
        raise RuntimeError("UNIMPLEMENTED: no cuDNN fused attention for this graph")

    monkeypatch.setattr(jax.stages.Lowered, "compile", refuse)
    with pytest.raises(ValueError, match=r"model.attention='cudnn': the gpu compiler refused toy attention with "
                                         r"the attention kernel cudnn .*UNIMPLEMENTED"):
        compile_for("toy attention", attend, (q,), {}, (), 1, devices, mesh=mesh)


def test_children_compile_in_parallel_in_order(monkeypatch):
    """--compile_jobs=N: up to N child processes at once; the programs come back in their order
    and every child is counted."""
    import threading
    import time

    from paravt_jax.planner.child import ChildRun
    from paravt_jax.planner.memory import ProgramMemory

    running, most = [0], [0]
    lock = threading.Lock()

    def fake_child(function, args, env, label):
        name = args[-1][0]
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.3 if name == "a" else 0.05)
        with lock:
            running[0] -= 1
        return [ProgramMemory(name, 1, 0, 1, 0.1)], ChildRun(label, 0.3, 1)

    monkeypatch.setattr(G, "run_in_child", fake_child)
    monkeypatch.setattr(G, "target_env", lambda target, devices: {})
    jobs = G.Jobs(T.Target("cpu-fake", "gpu"), {"data": 1, "fsdp": 2, "tensor": 1}, None, parallel=2)
    out = jobs("sampler", None, None, None, None, ("a", "b", "c"), "test")
    assert [p.name for p in out] == ["a", "b", "c"] and most[0] == 2
    assert [r.label for r in jobs.children] == ["a [test]", "b [test]", "c [test]"]
