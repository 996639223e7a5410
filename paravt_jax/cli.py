"""`paravt-jax <command> --config=FILE[:ARG] [--config.field=value ...]`.

Commands: run (default: the main job: cold-start SFT, PARA-GRPO, evaluation), sft, train
(RL only), export (latest checkpoint -> HF safetensors), generate (one greedy episode),
forward (one timed forward pass on a synthetic video prompt); with their own flags: eval
(benchmark driver, paravt_jax/eval/driver.py), plan (memory planner), sweep and report
(ablations).
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "configs", "base.py")


def config_module(name: str):
    """A module from the repository's configs/ folder (e.g. the mesh presets)."""
    import importlib.util

    path = os.path.join(os.path.dirname(DEFAULT_CONFIG), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"paravt_configs_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_model(config, default_dir: str | None = None):
    """The configured checkpoint, else the built-in tiny checkpoint directory."""
    from paravt_jax import sharding as sh
    from paravt_jax.models.qwen3_vl import init_model, load_pretrained, preset

    m = config.model
    if config.get("mesh_preset", ""):  # a named TPU slice / GPU host layout (configs/meshes.py)
        preset = config_module("meshes").get_mesh(config.mesh_preset)
        mesh = sh.make_hybrid_mesh(preset["ici"], preset["dcn"])
    else:
        mesh = sh.make_mesh(dict(config.mesh))
    # The built-in checkpoint stands in for `tiny`; other presets without a checkpoint are
    # randomly initialised (benchmarks, memory checks).
    directory = m.checkpoint or (default_dir if m.preset == "tiny" else None)
    if directory:
        return load_pretrained(directory, dtype=m.param_dtype, compute_dtype=m.dtype, mesh=mesh,
                               remat=m.remat, scan_layers=m.scan_layers, attention=m.attention,
                               attention_block=m.attention_block)
    knobs = dict(param_dtype=m.param_dtype, dtype=m.dtype, remat=m.remat, scan_layers=m.scan_layers,
                 attention=m.attention, attention_block=m.attention_block)
    return init_model(preset(m.preset, **knobs), seed=config.seed, mesh=mesh)


def builtin_assets(config):
    from paravt_jax.data.builtin import ensure_builtin

    d = config.data
    # The built-in data and initial tiny model have their own seed, so runs that differ only
    # by `config.seed` (sweep seeds) share data and initialisation.
    return ensure_builtin(d.builtin_root, seed=d.get("seed", 0), num_train=d.num_train,
                          num_eval=d.num_eval, durations=tuple(d.durations))


def first_prompt(config, tokenizer, data_dir: str):
    """The ParaVT prompt for the first held-out synthetic question: K overview frames as
    images, each after its `<t seconds>` text, the question, and the `<think>` prefix."""
    import json
    import os

    import pyarrow.parquet as pq

    from paravt_jax.text import chat
    from paravt_jax.text.inputs import encode
    from paravt_jax.video import read_frames

    row = pq.read_table(os.path.join(data_dir, "rl_eval.parquet")).to_pylist()[0]
    video = os.path.join(data_dir, row["videos"][0]["video"])
    question = row["prompt"][0]["content"].replace("<video>", "").strip()
    d = config.demo
    clip = read_frames(video, nframes=d.frames, min_pixels=d.min_pixels, max_pixels=d.max_pixels)
    messages = chat.paravt_messages(question, clip.frames, clip.timestamps,
                                    video_name=os.path.basename(video))
    segments = chat.render(messages, add_generation_prompt=True, assistant_prefix="<think>\n")
    return encode(segments, tokenizer), json.loads(row["extra_info"]), video


def forward_command(config) -> dict:
    import jax

    from paravt_jax.text.inputs import check_against_model
    from paravt_jax.text.tokenizer import Tokenizer

    t0 = time.perf_counter()
    assets = builtin_assets(config)
    setup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = build_model(config, default_dir=assets.model_dir)
    load_s = time.perf_counter() - t0
    tokenizer = Tokenizer.from_directory(config.model.checkpoint or assets.model_dir)
    check_against_model(tokenizer, model.config)
    inputs, info, video = first_prompt(config, tokenizer, assets.data_dir)
    kwargs = inputs.model_kwargs()
    times = []
    for _ in range(max(2, config.demo.repeats)):
        start = time.perf_counter()
        out = model(**kwargs)
        jax.block_until_ready(out.logits)
        times.append(time.perf_counter() - start)
    logits = np.asarray(out.logits)
    summary = {
        "devices": f"{jax.device_count()} x {jax.devices()[0].platform}",
        "model": config.model.checkpoint or f"built-in tiny ({assets.model_dir})",
        "video": f"{video} ({config.demo.frames} overview frames)",
        "question type / answer": f"{info['question_type']} / {info['answer']}",
        "input_ids": tuple(kwargs["input_ids"].shape),
        "image tokens": int((inputs.mm_token_type_ids == 1).sum()),
        "pixel_values": tuple(inputs.pixel_values.shape),
        "image_grid_thw": inputs.image_grid_thw[0].tolist(),
        "logits": tuple(logits.shape), "logits_finite": bool(np.isfinite(logits).all()),
        "greedy next token": repr(tokenizer.decode([int(logits[0, -1].argmax())])),
        "assets_s": round(setup_s, 3), "model_load_s": round(load_s, 3),
        "first_call_s (compile)": round(times[0], 3),
        "steady_call_ms (median)": round(1e3 * float(np.median(times[1:])), 2),
        "tokens_per_s": round(inputs.length / float(np.median(times[1:])), 1),
    }
    width = max(len(k) for k in summary)
    print("paravt-jax forward pass on the built-in synthetic video prompt")
    for key, value in summary.items():
        print(f"  {key:<{width}}  {value}")
    if not summary["logits_finite"]:
        raise SystemExit("forward produced non-finite logits")
    return summary


# ----------------------------------------------------------------------------- training
def _workdir(config, flag_workdir: str) -> str:
    import os

    workdir = flag_workdir or config.get("workdir", "") or os.path.join("runs", f"{config.get('preset', 'tiny')}")
    os.makedirs(workdir, exist_ok=True)
    return workdir


def _setup(config):
    import os

    from paravt_jax.data.paravt_parquet import load_rl_rows, load_sft_rows
    from paravt_jax.text.inputs import check_against_model
    from paravt_jax.text.tokenizer import Tokenizer

    from paravt_jax import distributed

    # Process 0 creates the built-in assets (if missing) before the others read them.
    assets = builtin_assets(config) if distributed.is_primary() else None
    distributed.barrier("paravt:builtin-assets")
    assets = assets or builtin_assets(config)
    model = build_model(config, default_dir=assets.model_dir)
    tokenizer = Tokenizer.from_directory(config.model.checkpoint or assets.model_dir)
    check_against_model(tokenizer, model.config)
    data = config.data
    root = data.get("video_root", "") or assets.data_dir
    paths = {name: data.get(name, "") or os.path.join(assets.data_dir, f"{name}.parquet")
             for name in ("sft", "rl_train", "rl_eval")}
    sft_rows, _ = load_sft_rows(paths["sft"], root)
    if data.get("tfds_dir", ""):  # RL rows through the TFDS ArrayRecord builder + grain
        from paravt_jax.data import tfds_builder as tb

        sources = tb.build("rl", {"train": paths["rl_train"], "eval": paths["rl_eval"]}, data.tfds_dir, root)
        rl_rows = [tb.rl_row(x) for x in tb.grain_loader(sources["train"], seed=config.seed, num_epochs=1,
                                                          shuffle=False)]
        eval_rows = [tb.rl_row(x) for x in tb.grain_loader(sources["eval"], seed=config.seed, num_epochs=1,
                                                            shuffle=False)]
    else:
        rl_rows, _ = load_rl_rows(paths["rl_train"], root)
        eval_rows, _ = load_rl_rows(paths["rl_eval"], root)
    return model, tokenizer, sft_rows, rl_rows, eval_rows, root


def sft_config(config):
    from paravt_jax.rl.train_step import OptimizerConfig
    from paravt_jax.sft.trainer import SFTConfig

    s = config.sft
    return SFTConfig(steps=s.steps, batch_size=s.batch_size, micro_batches=s.micro_batches, seed=config.seed,
                     nframes=s.nframes, max_pixels=s.max_pixels,
                     optimizer=OptimizerConfig(learning_rate=s.learning_rate, weight_decay=0.0))


def rl_config(config):
    from paravt_jax.agent.dispatch import DispatchConfig
    from paravt_jax.agent.rollout import RolloutConfig
    from paravt_jax.rl.advantages import AdvantageConfig
    from paravt_jax.rl.train_step import OptimizerConfig, StepConfig
    from paravt_jax.rl.trainer import RewardConfig, RLConfig

    r = config.rl
    return RLConfig(
        steps=r.steps, prompts_per_step=r.prompts_per_step, samples_per_prompt=r.samples_per_prompt,
        micro_batches=r.micro_batches, seed=config.seed, nframes_gating=r.nframes_gating,
        default_nframes=r.default_nframes,
        rollout=RolloutConfig(mode=r.mode, max_turns=r.max_turns, max_new_tokens=r.max_new_tokens,
                              temperature=r.temperature, think_prefix=r.think_prefix,
                              overview_max_pixels=r.overview_max_pixels,
                              overview_fps=r.overview_fps, overview_max_frames=r.overview_max_frames,
                              subagent_max_tokens=r.subagent_max_tokens),
        dispatch=DispatchConfig(max_parallel=r.max_parallel, max_pixels=r.overview_max_pixels),
        reward=RewardConfig(answer_suffix=r.answer_suffix, anchor_weight=r.anchor_weight,
                            format_weight=r.format_weight, mode=r.reward_mode,
                            text=r.reward_text),
        advantage=AdvantageConfig(anchor_mode=r.anchor_mode, anchor_weight=r.anchor_weight, kl_ctl=r.kl_ctl),
        step=StepConfig(temperature=r.temperature, eps_clip=r.eps_clip, behaviour_cap=r.behaviour_cap,
                        reference_temperature=r.reference_temperature or None),
        optimizer=OptimizerConfig(learning_rate=r.learning_rate, weight_decay=r.weight_decay,
                                  grad_clip=r.grad_clip),
        checkpoint_every=r.checkpoint_every, eval_every=r.get("eval_every", 0))


def evaluate_all(config, model, tokenizer, eval_rows) -> list[dict]:
    from paravt_jax.rl.evaluate import evaluate

    e = config.eval
    rows = eval_rows[: e.limit] if e.limit else eval_rows
    results = []
    for tools in (False, True):
        for k in e.nframes:
            results.append(evaluate(model, tokenizer, rows, nframes=int(k), tools=tools,
                                    max_new_tokens=e.max_new_tokens, max_turns=e.max_turns).row())
    return results


def print_results(results: list[dict]) -> str:
    header = "| tools | K | accuracy | format compliance | kappa | calls per tool turn | samples |"
    lines = [header, "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {'yes' if r['tools'] else 'no'} | {r['nframes']} | {r['accuracy']:.3f} | "
                     f"{r['format_compliance']:.3f} | {r['kappa']:.3f} | {r['calls_per_turn']:.2f} | {r['samples']} |")
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def run_command(config, workdir: str = "") -> dict:
    """The main job: SFT, then PARA-GRPO, then evaluation with and without tools."""
    import os

    from paravt_jax.files import write_json_atomic
    from paravt_jax.models.qwen3_vl import save_pretrained
    from paravt_jax.rl.trainer import train_rl
    from paravt_jax.sft.trainer import train_sft

    workdir = _workdir(config, workdir)
    t0 = time.perf_counter()
    model, tokenizer, sft_rows, rl_rows, eval_rows, root = _setup(config)
    print(f"[run] workdir {os.path.abspath(workdir)}; {len(sft_rows)} SFT rows, {len(rl_rows)} RL rows, "
          f"{len(eval_rows)} held-out rows", flush=True)
    summary = {"workdir": os.path.abspath(workdir)}
    if config.sft.steps:
        model, sft = train_sft(model, tokenizer, sft_rows, root, os.path.join(workdir, "sft"), sft_config(config))
        summary["sft_loss"] = [round(h["loss"], 4) for h in sft.history]
    if config.rl.steps:
        model, rl = train_rl(model, tokenizer, rl_rows, os.path.join(workdir, "rl"), rl_config(config),
                             eval_rows=eval_rows)
        summary["rl"] = [{k: round(float(h[k]), 4) for k in ("reward", "format_compliance", "kappa", "loss")}
                         for h in rl.history]
    from paravt_jax import distributed

    model = distributed.local_model(model)  # multi-process: a whole copy on this process's devices
    if not distributed.is_primary():  # process 0 alone saves, evaluates and writes the summary
        return summary
    final = os.path.join(workdir, "final")
    save_pretrained(model, final)
    tokenizer.save(final)
    print("[run] evaluation on held-out synthetic videos (greedy)", flush=True)
    summary["eval"] = evaluate_all(config, model, tokenizer, eval_rows)
    summary["table"] = print_results(summary["eval"])
    summary["minutes"] = round((time.perf_counter() - t0) / 60, 2)
    from paravt_jax.plots import plot_run

    summary["curves"] = plot_run({p: os.path.join(workdir, p, "metrics.jsonl") for p in ("sft", "rl")},
                                 os.path.join(workdir, "curves.png"))
    write_json_atomic(os.path.join(workdir, "summary.json"), summary)
    print(f"[run] done in {summary['minutes']} min; final model {final}; curves {summary['curves']}; "
          f"metrics {os.path.join(workdir, 'rl', 'metrics.jsonl')}", flush=True)
    return summary


def sft_command(config, workdir: str = ""):
    from paravt_jax.sft.trainer import train_sft

    workdir = _workdir(config, workdir)
    model, tokenizer, sft_rows, _, _, root = _setup(config)
    return train_sft(model, tokenizer, sft_rows, root, workdir, sft_config(config))


def train_command(config, workdir: str = ""):
    from paravt_jax.rl.trainer import train_rl

    workdir = _workdir(config, workdir)
    model, tokenizer, _, rl_rows, eval_rows, _ = _setup(config)
    return train_rl(model, tokenizer, rl_rows, workdir, rl_config(config), eval_rows=eval_rows)


def export_command(config, workdir: str = ""):
    """The latest checkpoint under workdir (rl/ preferred, else sft/) -> an HF checkpoint in
    workdir/export that transformers loads."""
    import os

    from paravt_jax.checkpointing import Checkpointer
    from paravt_jax.models.qwen3_vl import save_pretrained
    from paravt_jax.rl.train_step import TrainStep

    model, tokenizer, *_ = _setup(config)
    step = TrainStep(model)
    for phase in ("rl", "sft", ""):
        directory = os.path.join(workdir, phase, "checkpoints")
        if os.path.isdir(directory) and Checkpointer(directory).latest_step() is not None:
            state, meta = Checkpointer(directory).restore_latest(step.init_state())
            out = os.path.join(workdir, "export")
            save_pretrained(step.model(state), out)
            tokenizer.save(out)
            print(f"[export] {directory} step {meta['next_step']} -> {out}", flush=True)
            return out
    raise SystemExit(f"export: no checkpoint under {workdir}/{{rl,sft}}/checkpoints")


def generate_command(config, workdir: str = ""):
    """Greedy answer of the policy to config.generate.question on config.generate.video."""
    import dataclasses

    from paravt_jax.agent.dispatch import CropDispatcher
    from paravt_jax.agent.rollout import Episode, RolloutConfig, run_rollouts
    from paravt_jax.sampling import Sampler

    model, tokenizer, _, _, eval_rows, _ = _setup(config)
    g = config.get("generate", None)
    question = g.question if g and g.question else eval_rows[0].question
    video = g.video if g and g.video else eval_rows[0].video_path
    episode = Episode("generate", question, "", "oe", video, int(g.nframes) if g else 16)
    r = config.rl
    rollout = RolloutConfig(mode=r.mode, max_turns=r.max_turns, max_new_tokens=r.max_new_tokens,
                            temperature=0.0, overview_max_pixels=r.overview_max_pixels)
    with CropDispatcher() as dispatcher:
        rollouts, skipped = run_rollouts(Sampler(model), tokenizer, [episode], 1, rollout, dispatcher)
    if skipped:
        raise SystemExit(skipped[0])
    print(rollouts[0].completion)
    return dataclasses.asdict(rollouts[0].episode)


COMMANDS = {"forward": forward_command, "run": run_command, "sft": sft_command,
            "train": train_command, "export": export_command,
            "generate": generate_command}
TAKES_WORKDIR = {"run", "sft", "train", "export"}
# Commands with their own flags live in their modules: `module.main(argv)` gets argv with the
# command word removed (argv[0] is the program name).
MODULE_COMMANDS = {"plan": "paravt_jax.plan", "sweep": "paravt_jax.sweep", "report": "paravt_jax.report",
                   "eval": "paravt_jax.eval.driver"}


def main(argv: list[str] | None = None) -> None:
    from absl import flags
    from ml_collections import config_flags

    argv = list(sys.argv if argv is None else argv)
    command = "run"
    if len(argv) > 1 and not argv[1].startswith("-"):
        command = argv.pop(1)
    from paravt_jax import compile_cache, distributed

    if command in MODULE_COMMANDS:
        import importlib

        compile_cache.enable()  # $PARAVT_JAX_CACHE_DIR, if set
        distributed.initialize()  # multi-host from the environment only: these parse their own flags
        return importlib.import_module(MODULE_COMMANDS[command]).main(argv)
    if command not in COMMANDS:
        raise SystemExit(f"unknown command {command!r}; choose from {sorted(set(COMMANDS) | set(MODULE_COMMANDS))}")
    flag_values = flags.FlagValues()
    # sys_argv lets ml_collections register the --config.* override flags of this argv.
    default = DEFAULT_CONFIG if command == "forward" else DEFAULT_CONFIG.replace("base.py", "paragrpo.py")
    config_flags.DEFINE_config_file("config", default + ":tiny", "config file[:arg]",
                                    flag_values=flag_values, sys_argv=argv)
    flags.DEFINE_string("workdir", "", "run directory (checkpoints, metrics, final model)",
                        flag_values=flag_values)
    flag_values(argv)
    compile_cache.enable(flag_values.config.get("compilation_cache_dir", ""))
    distributed.initialize(flag_values.config)  # before anything touches JAX devices
    if command in TAKES_WORKDIR:
        return COMMANDS[command](flag_values.config, flag_values.workdir)
    return COMMANDS[command](flag_values.config)


if __name__ == "__main__":
    main()
