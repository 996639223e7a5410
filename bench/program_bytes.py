"""What a compiled program's bytes are made of: the planner's gradient program (unrolled at a
few layers, as the time plan's cost programs are) or one 8B-shaped decode step, compiled for a
target, its `cost_analysis()` bytes beside the per-instruction count of its optimised HLO
(paravt_jax/planner/hlo_counts.py: each instruction "counted" with its operands read whole, and
"physical" with slices and in-place updates at their sizes), grouped by kind and by source.

    python bench/program_bytes.py --program gradients --layers 3 --target tpu --save /tmp/g3
    python bench/program_bytes.py --program decode --layers 4 --target tpu
    python bench/program_bytes.py --program decode --decode decode --layers 36 --target tpu  # the recipe's, v5p-16
    python bench/program_bytes.py --program prefill --prefill "sub-agent prefill" --layers 4 --target tpu
    python bench/program_bytes.py --load /tmp/g3          # the saved HLO and costs, no compile

A prefill (`--prefill`: one of the recipe's, on `--config` and `--mesh`) is compiled twice, its
hidden states split by rows (SamplerConfig.prefill_row_split, the default) and as the baseline
(every device computes every token of the row group against its part of the weights), the two
side by side, then the split one broken down. A recipe's decode (`--decode`) is compiled
twice too, its weight copies' MLP and lm head split as tensor parallelism
(SamplerConfig.decode_weight_split, the default) and in the parameters' layout (the baseline).

The decode step is compiled as the recipes' rollouts run it (top_p 1, top_k 0: no top-p / top-k
branch); `--truncation` adds the branch. The gradient program is the RL recipe's (`--config`,
default configs/paragrpo.py:qwen3vl_8b) on
the mesh preset (`--mesh`, default v5p-16) with `--layers` unrolled decoder layers: the program
`paravt-jax plan` compiles for the time plan's trainer costs, on the largest micro-batch. The
decode step is bench/decode.py's (64 rows x 20,480 suffix slots, 8 prompts x 16,384, one chip).
The TPU compiler compiles from this CPU (libtpu); an 8B gradient at 3 layers takes minutes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import print_table  # noqa: E402


def _devices(target: str, topology: str, count: int):
    import jax

    if target == "tpu":
        from paravt_jax.planner.targets import tpu_devices

        return tpu_devices(topology)[:count]
    return jax.devices()[:count]


def gradients(config_arg: str, mesh_name: str, layers: int, target: str):
    """(compiled gradient program, its ProgramMemory) of the recipe at `layers` unrolled layers."""
    from paravt_jax.configs import paragrpo
    from paravt_jax.infra import meshes
    from paravt_jax.infra import sharding as sh
    from paravt_jax.models.qwen3_vl.hf_io import abstract_model
    from paravt_jax.planner import arrays, programs, targets
    from paravt_jax.planner import workload as W
    from paravt_jax.planner.arrays import train_batch_spec
    from paravt_jax.planner.memory import compile_for
    from paravt_jax.rl.objective import policy_head, policy_loss
    from paravt_jax.run_config import build_run
    from paravt_jax.train.step import TrainStep

    config = build_run(paragrpo.get_config(config_arg))
    sizes, _ = arrays.mesh_preset(mesh_name)
    _, model = W.model_config(config)
    rl = W.rl_settings(config)[0]
    tokenizer, _ = W.plan_tokenizer(config)
    count = math.prod(sizes.values())
    work = W.workload(rl, model.vision, tokenizer, W.Assumptions(), sh.batch_devices(arrays.abstract_mesh(sizes)))
    topology = targets.resolve_target(target, meshes.get_mesh(mesh_name)).topology if target == "tpu" else ""
    mesh = sh.make_mesh(sizes, _devices(target, topology, count))
    cut = programs.with_depth(model, layers, False)
    step = TrainStep(abstract_model(cut), rl.optimizer, policy_loss(rl.step), policy_head(rl.step), mesh=mesh)
    params = programs._abstract_params(step.params, mesh)
    batch = train_batch_spec(cut, work, mesh)
    stats, compiled = compile_for("gradients", step._grads, (params, batch), {}, batch, work.micro_batch_rows,
                                  list(mesh.devices.flat), keep=True)
    return compiled, stats


def decode(layers: int, target: str, truncation: bool = False):
    """(compiled decode step, its ProgramMemory): bench/decode.py's 8B-shaped step, with the
    sampling's top-p / top-k branch only under `truncation` (the recipes' rollouts, at top_p 1
    and top_k 0, compile without it)."""
    import dataclasses

    from paravt_jax.infra import sharding as sh
    from paravt_jax.models.qwen3_vl import preset
    from paravt_jax.planner.memory import SamplerPrograms
    from paravt_jax.sampling.sampler import SamplerConfig

    config = preset("8b")
    config = config.replace(text=dataclasses.replace(config.text, num_hidden_layers=layers),
                            dtype="bfloat16", param_dtype="bfloat16")
    mesh = sh.make_mesh({"data": 1}, _devices(target, "v5p:2x2x1", 1))
    programs = SamplerPrograms(config, SamplerConfig(), mesh, platform="tpu" if target == "tpu" else "gpu",
                               keep_compiled=True)
    stats = programs.decode(64, 20480, 8, 16384, 2048, truncation=truncation)
    return programs.compiled[stats.name], stats


def _recipe(config_arg: str, mesh_name: str):
    """(the RL settings, the model config, the planned workload) of a configs/paragrpo.py preset on a
    mesh preset, as `paravt-jax plan` derives them."""
    from paravt_jax.configs import paragrpo
    from paravt_jax.infra import sharding as sh
    from paravt_jax.planner import arrays
    from paravt_jax.planner import workload as W
    from paravt_jax.run_config import build_run

    run = build_run(paragrpo.get_config(config_arg))
    sizes, _ = arrays.mesh_preset(mesh_name)
    _, config = W.model_config(run)
    rl, _ = W.rl_settings(run)
    tokenizer, _ = W.plan_tokenizer(run)
    work = W.workload(rl, config.vision, tokenizer, W.Assumptions(), sh.batch_devices(arrays.abstract_mesh(sizes)))
    return rl, config, work


def _sampler_programs(config, settings, mesh_name: str, layers: int, target: str):
    """The planner's SamplerPrograms for `config` cut to `layers` decoder layers on the mesh preset,
    compiled for `target` (keeping each compiled program)."""
    import dataclasses

    from paravt_jax.infra import meshes
    from paravt_jax.infra import sharding as sh
    from paravt_jax.planner import arrays, targets
    from paravt_jax.planner.memory import SamplerPrograms

    sizes, _ = arrays.mesh_preset(mesh_name)
    config = config.replace(text=dataclasses.replace(config.text, num_hidden_layers=layers))
    topology = targets.resolve_tpu(meshes.MESHES[mesh_name]).topology if target == "tpu" else ""
    mesh = sh.make_mesh(sizes, _devices(target, topology, math.prod(sizes.values())))
    return SamplerPrograms(config, settings, mesh, platform="tpu" if target == "tpu" else "gpu", keep_compiled=True)


def recipe_decode(config_arg: str, mesh_name: str, name: str, layers: int, target: str, split: bool = True):
    """(compiled decode, its ProgramMemory): the recipe's decode `name` ("decode", "sub-agent
    decode") as the planner compiles it for the mesh preset (its rows, caches and shardings) at
    `layers` unrolled layers, the weight copies' MLP and head split as tensor parallelism
    (`split`, SamplerConfig.decode_weight_split) or in the parameters' layout (the baseline)."""
    import dataclasses

    from paravt_jax.planner import programs as P
    from paravt_jax.planner import workload as W

    rl, config, work = _recipe(config_arg, mesh_name)
    jobs = dict(P._sampler_jobs(rl, work, W.sampler_layout(rl, work)))
    if name not in jobs or "decode" not in name:
        raise SystemExit(f"--decode={name!r}: the {config_arg} recipe's decodes are "
                         f"{[n for n in jobs if 'decode' in n]}")
    settings = dataclasses.replace(rl.sampler, decode_weight_split=split)
    programs = _sampler_programs(config, settings, mesh_name, layers, target)
    stats = jobs[name](programs)
    return programs.compiled[stats.name], stats


def prefill(config_arg: str, mesh_name: str, name: str, layers: int, target: str, split_rows: bool):
    """(compiled prefill, its ProgramMemory): the recipe's prefill `name` ("sub-agent prefill",
    "tool-response prefill", "first prompt prefill") as the planner compiles it for the mesh
    preset at `layers` unrolled layers, its hidden states split by rows (`split_rows`,
    SamplerConfig.prefill_row_split) or not (the baseline)."""
    import dataclasses

    from paravt_jax.planner import workload as W

    rl, config, work = _recipe(config_arg, mesh_name)
    calls, _ = W.sampler_calls(W.sampler_layout(rl, work), work, rl)
    call = {c.name: c for c in calls}.get(name)
    if call is None:
        raise SystemExit(f"--prefill={name!r}: the {config_arg} recipe's prefills are {[c.name for c in calls]}")
    settings = dataclasses.replace(rl.sampler, prefill_row_split=split_rows)
    programs = _sampler_programs(config, settings, mesh_name, layers, target)
    stats = programs.prefill(call)
    return programs.compiled[stats.name], stats


def prefill_table(layouts: dict) -> None:
    """The row-split prefill beside the baseline (every device every token of the row group)."""
    def row(label, stats):
        return [label, stats.row_shards, f"{stats.temp_bytes / 2**20:,.1f}", f"{stats.flops / 1e12:,.4f}",
                f"{stats.bytes_accessed / 1e9:,.3f}", f"{stats.physical_bytes / 1e9:,.3f}",
                f"{stats.collective_bytes / 1e9:,.3f}"]

    print_table("one prefill call per device: rows split vs every token on every device (row blocks 1: the "
                "rows do not split over the devices, the same program)",
                ["layout", "row blocks", "temporaries MiB", "TFLOP", "cost analysis GB", "physical GB",
                 "collectives GB"],
                [row(label, stats) for label, stats in layouts.items()])


def decode_table(layouts: dict) -> None:
    """The decode step with the weight copies split as tensor parallelism beside the baseline."""
    def row(label, stats):
        return [label, f"{stats.temp_bytes / 2**20:,.1f}", f"{stats.bytes_accessed / 1e9:,.3f}",
                f"{stats.physical_bytes / 1e9:,.3f}", f"{stats.collective_bytes / 1e9:,.4f}"]

    print_table("one decode step per device: the MLP and the lm head split as tensor parallelism vs the "
                "parameters' layout (the attention's analytic bytes, the same in both, not included)",
                ["weight copies", "temporaries MiB", "cost analysis GB", "physical GB", "collectives GB"],
                [row(label, stats) for label, stats in layouts.items()])


def report(text: str, meta: dict, label: str, top: int) -> dict:
    from paravt_jax.planner import hlo_counts as H

    rows = H.breakdown(text, H.ATTENTION_SCOPES)
    totals = dict(counted=sum(r.counted for r in rows), physical=sum(r.physical * r.runs for r in rows))
    print(f"{label}: cost_analysis {meta['bytes_accessed'] / 1e9:,.2f} GB, {meta['flops'] / 1e12:,.2f} TFLOP "
          f"(+ analytic attention {meta['kernel_text_bytes'] / 1e9:,.2f} GB, {meta['kernel_text_flops'] / 1e12:,.2f} "
          f"TFLOP); generic HloCostAnalysis {meta.get('generic_bytes', 0) / 1e9:,.2f} GB; HLO, {len(rows)} "
          f"instructions: {totals['counted'] / 1e9:,.2f} GB counted (once each), {totals['physical'] / 1e9:,.2f} GB "
          "physical (x runs)")

    def gb(x):
        return f"{x / 1e9:,.2f}"

    def table(title, key):
        print_table(title, ["group", "instructions", "counted GB", "physical x runs GB"],
                    [[k[:100], n, gb(c), gb(p)] for k, n, c, p in H.summarize(rows, key)[:top]])

    table("by kind", lambda r: r.kind)
    table("by source (op_name, first 4 parts)", lambda r: "/".join(r.op_name.split("/")[:4]))
    table("by computation (runs)", lambda r: f"{r.computation} x{r.runs}")
    largest = sorted(rows, key=lambda r: -r.physical * r.runs)[:top]
    print_table("largest instructions (physical x runs)", ["instruction", "kind", "counted GB", "physical GB", "runs",
                                                           "source"],
                [[r.name[:40], r.kind, gb(r.counted), gb(r.physical), r.runs, r.op_name[-80:]] for r in largest])
    return totals


def generic_bytes(text: str) -> float:
    """XLA's generic HloCostAnalysis (the CPU backend's) of an optimised module's text: beside
    the target compiler's own cost model."""
    import jax
    from jax._src.lib import _jax  # no public entry point: jax's own Lowered.cost_analysis uses it
    from jaxlib import _hlo

    module = _hlo.hlo_module_from_text(text)
    return float(_jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module).get("bytes accessed", 0.0))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--program", choices=("gradients", "decode", "prefill"), default="gradients")
    parser.add_argument("--prefill", default="sub-agent prefill",
                        help="prefill: which of the recipe's prefills (compiled split by rows and as the baseline)")
    parser.add_argument("--decode", default="", help="decode: the recipe's decode (\"decode\", \"sub-agent decode\") "
                        "on --config and --mesh instead of the one-chip 8B-shaped step")
    parser.add_argument("--config", default="qwen3vl_8b", help="configs/paragrpo.py preset (gradients, prefill, "
                        "--decode)")
    parser.add_argument("--mesh", default="v5p-16", help="mesh preset (gradients, prefill, --decode)")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--target", choices=("cpu", "tpu"), default="tpu")
    parser.add_argument("--save", default="", help="directory to write the HLO text and the costs to")
    parser.add_argument("--load", default="", help="a --save directory: report it without compiling")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--truncation", action="store_true",
                        help="decode: compile the top-p / top-k branch too (a rollout that truncates)")
    args = parser.parse_args()
    if args.load:
        text = open(os.path.join(args.load, "module.hlo")).read()
        meta = json.load(open(os.path.join(args.load, "costs.json")))
    else:
        start = time.perf_counter()
        if args.program == "gradients":
            compiled, stats = gradients(args.config, args.mesh, args.layers, args.target)
        elif args.program == "prefill":
            _, baseline = prefill(args.config, args.mesh, args.prefill, args.layers, args.target, False)
            compiled, stats = prefill(args.config, args.mesh, args.prefill, args.layers, args.target, True)
            prefill_table({"every token on every device (baseline)": baseline, "split by rows": stats})
        elif args.decode:
            _, baseline = recipe_decode(args.config, args.mesh, args.decode, args.layers, args.target, False)
            compiled, stats = recipe_decode(args.config, args.mesh, args.decode, args.layers, args.target)
            decode_table({"the parameters' layout (baseline)": baseline, "split as tensor parallelism": stats})
        else:
            compiled, stats = decode(args.layers, args.target, args.truncation)
        text = compiled.as_text()
        meta = dict(program=args.program, prefill=args.prefill if args.program == "prefill" else None,
                    decode=args.decode if args.program == "decode" else None,
                    layers=args.layers, target=args.target, config=args.config, mesh=args.mesh,
                    truncation=args.truncation if args.program == "decode" else None,
                    bytes_accessed=stats.bytes_accessed, flops=stats.flops, kernel_text_bytes=stats.kernel_text_bytes,
                    kernel_text_flops=stats.kernel_text_flops, compiler=stats.compiler,
                    physical_bytes=stats.physical_bytes,
                    seconds=time.perf_counter() - start)
        if args.save:
            os.makedirs(args.save, exist_ok=True)
            with open(os.path.join(args.save, "module.hlo"), "w") as f:
                f.write(text)
            with open(os.path.join(args.save, "costs.json"), "w") as f:
                json.dump(meta, f, indent=1)
    meta.setdefault("generic_bytes", generic_bytes(text))
    print(json.dumps(meta))
    report(text, meta, f"{meta['program']} at {meta['layers']} layers ({meta['compiler']})", args.top)


if __name__ == "__main__":
    main()
