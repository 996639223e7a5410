"""The TPU planner's depth extrapolation against a full compile of `small125m` (docs/scale-out.md)."""
from integration.test_plan_tpu import tpu_config
from paravt_jax.infra import meshes
from paravt_jax.models.qwen3_vl import preset
from paravt_jax.planner import programs as G
from paravt_jax.planner import targets as T
from paravt_jax.planner import workload as W
from paravt_jax.run_config import build_run


def test_depth_extrapolation_matches_a_full_compile(tokenizer):
    """small125m (12 layers) on v5p:2x2x2: every program's memory under --depth=extrapolate (the
    trainer's from 2 and 4 scanned layers, the sampler's whole) is within 5% of the full
    12-layer programs as a run compiles them."""
    config = tpu_config()
    config.model.preset = "small125m"
    target = T.resolve_target("tpu", meshes.get_mesh("v5p-16"))
    model = preset("small125m")
    rl = W.rl_settings(build_run(config))[0]
    work = W.workload(rl, model.vision, tokenizer, batch_devices=8)
    layout = W.sampler_layout(rl, work)
    sizes = meshes.mesh_shape("v5p-16")
    # memory only: the costs (from the same unrolled pair either way) are not compared
    guessed = G.compile_programs(model, rl, work, layout, sizes, target, "extrapolate", costs=False)
    full = G.compile_programs(model, rl, work, layout, sizes, target, "full", costs=False)
    assert guessed.depth.startswith("memory extrapolated from 2 and 4 scanned layers to 12")
    assert full.depth.startswith("full (12 scanned layers)")
    for a, b in zip(guessed.trainer + guessed.sampler, full.trainer + full.sampler):
        print(f"{a.name:<40} extrapolated {a.total_bytes / 2**20:9.1f} MiB  full {b.total_bytes / 2**20:9.1f} MiB  "
              f"({100 * (a.total_bytes / b.total_bytes - 1):+.2f}%)  temps {a.temp_bytes / 2**20:8.1f} / "
              f"{b.temp_bytes / 2**20:8.1f} MiB")
        assert a.name == b.name
        assert abs(a.total_bytes / b.total_bytes - 1) <= 0.05, (a.name, a.total_bytes, b.total_bytes)
