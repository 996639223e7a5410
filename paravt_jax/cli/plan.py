"""`paravt-jax plan`: the flags of the memory and time planner (paravt_jax/planner/plan.py)."""
from __future__ import annotations

import json
import os

import jax
from absl import flags, logging

from paravt_jax.cli.flags import UsageError, define_config, parse_flags
from paravt_jax.infra import meshes
from paravt_jax.planner import arrays, programs, sft_plan, targets, workload
from paravt_jax.planner import plan as planner
from paravt_jax.run_config import build_run

STAGES = ("all", "rl", "sft")


def main(argv: list[str]) -> planner.MemoryPlan | sft_plan.SFTPlan:
    """`paravt-jax plan --config=FILE[:ARG] [--config.x=y] [--mesh=...] [--devices=N]
    [--device_memory_gb=G] [--activations=auto|xla|estimate] [--target=auto|cpu-fake|tpu|gpu|local]
    [--depth=auto|extrapolate|full] [--chip=NAME] [--stage=all|rl|sft] [--compile_in=children|process]
    [--compile_jobs=N] [--json=PATH] [--question_tokens=N] [--video_seconds=S]`. Returns the RL plan,
    or the SFT plan under --stage=sft (--json holds both under --stage=all: the SFT plan as its `sft`)."""
    argv = list(argv)
    values = flags.FlagValues()
    define_config(values, planner.DEFAULT_CONFIG, argv)
    flags.DEFINE_string("mesh", "", "AXIS=SIZE list (data=1,fsdp=8,tensor=1) or a paravt_jax/infra/meshes.py "
                        "preset name; default: config.mesh", flag_values=values)
    flags.DEFINE_integer("devices", None, "device count (fills a -1 mesh axis)", flag_values=values)
    flags.DEFINE_float("device_memory_gb", None, "memory per device in GiB (default: the mesh "
                       "preset's, else the local device's)", flag_values=values)
    flags.DEFINE_enum("activations", "auto", list(planner.ACTIVATION_MODES), "activation numbers: XLA "
                      "memory analysis or the shape estimate", flag_values=values)
    flags.DEFINE_string("json", "", "also write the plan as JSON to this path", flag_values=values)
    flags.DEFINE_enum("target", "auto", list(targets.TARGETS), "where the programs compile: cpu-fake (XLA:CPU on fake "
                      "devices), tpu (libtpu for the preset's TPU topology, from this CPU process), gpu (XLA:GPU "
                      "for the preset's GPUs, compile-only devices of the CUDA plugin in this CPU process; an axis "
                      "list on --chip's GPU, h100 by default), local (the devices present); auto: tpu for TPU "
                      "presets when libtpu is importable, gpu for GPU presets when the CUDA plugin and ptxas are",
                      flag_values=values)
    flags.DEFINE_enum("depth", "auto", list(programs.DEPTHS), "the trainer's memory from its full-depth scanned "
                      "programs, or extrapolated per layer from two reduced scanned depths (auto: full for "
                      "scanned layers); the sampler's programs are always compiled whole",
                      flag_values=values)
    flags.DEFINE_string("chip", "", "accelerator of the time plan (v5p, v5e, v6e, v4, h100, h200, a100); "
                        "default: the mesh preset's", flag_values=values)
    flags.DEFINE_enum("stage", "all", list(STAGES), "what to plan: the RL step (rl), the cold-start SFT step "
                      "(sft; no sampler programs), or both (all; SFT when the config has SFT steps)",
                      flag_values=values)
    flags.DEFINE_enum("compile_in", "children", list(programs.COMPILE_IN), "children: each program compiles in a "
                      "child process of its own, which returns its numbers and its memory (the host's memory stays "
                      "one program's); process: all in one process (this one, or one child with the fake CPU "
                      "devices this one lacks); target local always compiles in this process",
                      flag_values=values)
    flags.DEFINE_integer("compile_jobs", 1, "child processes compiling at once (--compile_in=children): each "
                         "holds one program's host memory", lower_bound=1, flag_values=values)
    flags.DEFINE_integer("question_tokens", workload.Assumptions.question_tokens, "assumed tokens of one question",
                         flag_values=values)
    flags.DEFINE_float("video_seconds", workload.Assumptions.video_seconds, "assumed video length (the digits of "
                       "every frame's timestamp)", flag_values=values)
    parse_flags(values, argv, "usage: " + main.__doc__.strip().strip("`"), show_config=True)
    run = build_run(values.config)
    try:
        memory = values.device_memory_gb
        text = values.mesh.strip()
        entry = None
        if text and "=" not in text:
            sizes, preset_memory = arrays.mesh_preset(text)
            memory = memory if memory is not None else preset_memory
            entry = meshes.get_mesh(text)
        else:
            sizes = arrays.parse_mesh(text) if text else run.mesh.axes()
        devices = values.devices
        if devices is None and -1 in sizes.values():
            devices = jax.device_count()
        sizes = arrays.resolve_mesh(sizes, devices)
        memory = memory if memory is not None else planner.local_device_memory()
        if memory is None:
            raise workload.PlanError(f"no device memory known for {jax.devices()[0].platform}: give "
                            "--device_memory_gb=G or a --mesh preset")
        if values.question_tokens < 0 or not values.video_seconds > 0:
            raise workload.PlanError(f"--question_tokens={values.question_tokens} must be >= 0 and "
                            f"--video_seconds={values.video_seconds} > 0")
        assumptions = workload.Assumptions(question_tokens=values.question_tokens, video_seconds=values.video_seconds)
        try:
            target = targets.resolve_target(values.target, entry, values.chip)
        except targets.TargetError as e:
            raise workload.PlanError(str(e)) from None
        if values.target in ("tpu", "gpu") and values.activations == "estimate":
            raise workload.PlanError(f"--target={values.target} compiles the programs: drop --activations=estimate")
        chip = values.chip or (entry["accelerator"] if entry else "")
        result = sft = None
        if values.stage in ("all", "rl"):
            result = planner.plan(run, sizes, memory, values.activations, assumptions, target=target,
                                  depth=values.depth, chip=chip, compile_in=values.compile_in,
                                  compile_jobs=values.compile_jobs)
            print(planner.format_plan(result), flush=True)
        if values.stage == "sft" or (values.stage == "all" and sft_plan.sft_settings(run)):
            sft = sft_plan.plan_sft(run, sizes, memory, values.activations, assumptions, target=target,
                                    depth=values.depth, compile_in=values.compile_in)
            print(("\n" if result else "") + sft_plan.format_sft_plan(sft), flush=True)
            print("\n".join(["", *(f"note: {n}" for n in sft.notes)]), flush=True)
    except workload.PlanError as e:
        raise UsageError(f"plan: {e}") from None
    if values.json:
        os.makedirs(os.path.dirname(os.path.abspath(values.json)), exist_ok=True)
        saved = result.to_json() if result else {}
        if sft:
            saved["sft"] = sft.to_json()
        with open(values.json, "w") as f:
            json.dump(saved, f, indent=2)
        logging.info(f"[plan] written to {values.json}")
    return result if result is not None else sft
