"""The main job's commands: run (cold-start SFT, PARA-GRPO, final model, held-out evaluation),
sft and train (one phase), export, generate (one greedy episode) and forward (one timed forward
pass). Each takes the typed run config (run_config.RunConfig, built once at the command line
from configs/*.py), builds what it runs on through `paravt_jax.cli.assembly`, and returns plain
data (the tests and notebooks call them directly).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import numpy as np
import pyarrow.parquet as pq
from absl import logging

from paravt_jax.agent.dispatch import CropDispatcher
from paravt_jax.agent.rollout import Episode, run_rollouts
from paravt_jax.cli.assembly import build_model, build_rollout_mesh, check_rollout_sampler, save_export, setup
from paravt_jax.cli.workdirs import claims_workdir, record_manifest
from paravt_jax.episodes.episode_log import write_eval_episodes
from paravt_jax.episodes.rewards import extract_answer
from paravt_jax.eval import registry
from paravt_jax.eval.evaluator import evaluate
from paravt_jax.eval.held_out import EvalResult
from paravt_jax.experiments.plots import plot_run, thirds
from paravt_jax.infra import distributed, preemption, reproducibility, storage
from paravt_jax.infra.checkpointing import Checkpointer
from paravt_jax.rl.trainer import periodic_evaluators, train_rl
from paravt_jax.run_config import RunConfig, builtin_assets
from paravt_jax.sampling import Sampler
from paravt_jax.sft.objective import HEAD, sft_loss
from paravt_jax.sft.trainer import train_sft
from paravt_jax.text import chat
from paravt_jax.text.inputs import check_against_model, encode
from paravt_jax.text.tokenizer import Tokenizer
from paravt_jax.train.step import OptimizerConfig, TrainStep
from paravt_jax.video import read_frames


def run_manifest(run: RunConfig, inputs, workdir: str) -> dict:
    """The run's manifest (reproducibility.manifest: commit, packages, CPU, data, seed), stored in
    the workdir's run_config.json (a resume under another environment is logged there)."""
    manifest = reproducibility.manifest(seed=int(run.seed), data=inputs.data)
    record_manifest(workdir, manifest)
    return manifest


def first_prompt(run: RunConfig, tokenizer, data_dir: str):
    """The ParaVT prompt for the first held-out synthetic question: K overview frames as
    images, each after its `<t seconds>` text, the question, and the `<think>` prefix."""
    row = pq.read_table(os.path.join(data_dir, "rl_eval.parquet")).to_pylist()[0]
    video = os.path.join(data_dir, row["videos"][0]["video"])
    question = row["prompt"][0]["content"].replace("<video>", "").strip()
    d = run.demo
    clip = read_frames(video, nframes=d.frames, min_pixels=d.min_pixels, max_pixels=d.max_pixels)
    messages = chat.paravt_messages(question, clip.frames, clip.timestamps,
                                    video_name=os.path.basename(video))
    segments = chat.render(messages, add_generation_prompt=True, assistant_prefix="<think>\n")
    return encode(segments, tokenizer), json.loads(row["extra_info"]), video


def forward_command(run: RunConfig) -> dict:
    t0 = time.perf_counter()
    assets = builtin_assets(run)
    setup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = build_model(run, default_dir=assets.model_dir)
    load_s = time.perf_counter() - t0
    tokenizer = Tokenizer.from_directory(run.model.checkpoint or assets.model_dir)
    check_against_model(tokenizer, model.config)
    inputs, info, video = first_prompt(run, tokenizer, assets.data_dir)
    kwargs = inputs.model_kwargs()
    times = []
    for _ in range(max(2, run.demo.repeats)):
        start = time.perf_counter()
        out = model(**kwargs)
        jax.block_until_ready(out.logits)
        times.append(time.perf_counter() - start)
    logits = np.asarray(out.logits)
    summary = {
        "devices": f"{jax.device_count()} x {jax.devices()[0].platform}",
        "model": run.model.checkpoint or f"built-in tiny ({assets.model_dir})",
        "video": f"{video} ({run.demo.frames} overview frames)",
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


def evaluation_context(run: RunConfig, eval_rows, workdir: str = "", data_dir: str = "") -> registry.Context:
    """What the main job's evaluations are built from (eval/registry.py): the held-out rows, the
    run's episode (rl.rollout, rl.dispatch: a held-out evaluation's, with its own budget), and
    for a benchmark entry `<workdir>/eval/<name>` for its records, keyed by the run (workdir and
    step counts: the model they evaluate)."""
    rl = run.rl
    identity = {"run": storage.absolute(workdir) if workdir else "",
                "steps": {"sft": int(run.sft.steps), "rl": int(run.rl.steps)}}
    return registry.Context(tuple(eval_rows), rl.rollout, rl.dispatch, storage.join(workdir, "eval") if workdir else "",
                            data_dir, identity)


def evaluate_all(run: RunConfig, model, tokenizer, eval_rows, stage: str = "final", episodes: str = "",
                 workdir: str = "", data_dir: str = "") -> list:
    """The outcomes of the `evals` section's evaluators at `stage` ("final": after the last
    phase; "after_sft": the cold start, each held-out entry at its after_sft K), on one sampler.
    A held-out outcome's result row is one per (tools no/yes) x K, tools-major. episodes: the
    evaluation's episode log (`<workdir>/eval/episodes.jsonl`; "" = none), where every held-out
    episode is kept under `stage` and its setting (episodes/episode_log.py)."""
    evaluators = registry.evaluators(run.evals, evaluation_context(run, eval_rows, workdir, data_dir),
                                     stage)
    outcomes = []
    t0 = time.perf_counter()
    for outcome in evaluate(evaluators, model, tokenizer):
        outcomes.append(outcome)
        if episodes and outcome.records:
            write_eval_episodes(episodes, stage, outcome.records, outcome.setting)
        logging.info(f"[run] evaluation {outcome.name} ({', '.join(f'{k} {v}' for k, v in outcome.setting.items())}) "
                     f"in {time.perf_counter() - t0:.0f} s")
        t0 = time.perf_counter()
    return outcomes


def result_rows(outcomes) -> list[dict]:
    """The held-out outcomes' result rows (the tables and summary.json's `eval`)."""
    return [outcome.result.row() for outcome in outcomes if isinstance(outcome.result, EvalResult)]


def benchmark_metrics(outcomes) -> dict:
    """The other outcomes' metrics by name (summary.json's `benchmarks`)."""
    return {outcome.name: outcome.metrics for outcome in outcomes if not isinstance(outcome.result, EvalResult)}


def eval_episodes_path(workdir: str) -> str:
    """The main job's held-out evaluation episodes (`paravt-jax view` reads them)."""
    return storage.join(workdir, "eval", "episodes.jsonl")


def cold_start_evaluated(run: RunConfig) -> bool:
    """Whether an entry of `evals` evaluates the cold start (a held-out one with after_sft K)."""
    return any(getattr(settings, "after_sft", ()) for settings in run.evals.values())


def print_results(results: list[dict], title: str = "") -> str:
    header = "| tools | K | accuracy | format compliance | kappa | calls per tool turn | valid calls | samples |"
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {'yes' if r['tools'] else 'no'} | {r['nframes']} | {r['accuracy']:.3f} | "
                     f"{r['format_compliance']:.3f} | {r['kappa']:.3f} | {r['calls_per_turn']:.2f} | "
                     f"{r['call_validity']:.3f} | {r['samples']} |")
    text = "\n".join(lines)
    print((f"{title}\n" if title else "") + text, flush=True)
    return text


def evaluate_after_sft(run: RunConfig, model, tokenizer, eval_rows, workdir: str,
                       manifest: dict | None = None) -> list[dict] | None:
    """The cold start's held-out table (the after_sft K of `evals`' held-out entries, with and without tools),
    evaluated once between SFT and RL and kept in sft/eval.json with the settings it was made
    under (the SFT step count and the evaluation's), so a resumed run reads it back and a run
    with other settings evaluates again. Process 0 reads, evaluates and returns it, and the
    others follow its decision and get None. Collective: every process must call it."""
    rl = run.rl
    cold_start = {name: {k: v for k, v in dataclasses.asdict(settings).items()
                         if k not in getattr(settings, "SPEED_ONLY", ())}  # not what the table holds
                  for name, settings in run.evals.items() if getattr(settings, "after_sft", ())}
    settings = json.loads(json.dumps({"sft_steps": int(run.sft.steps), "evals": cold_start,
                                      "rollout": dataclasses.asdict(rl.rollout),
                                      "dispatch": dataclasses.asdict(rl.dispatch)}))
    path = storage.join(workdir, "sft", "eval.json")
    results = None
    if distributed.is_primary():
        try:
            stored = json.loads(storage.read_bytes(path))
            if stored.get("settings") == settings:
                logging.info(f"[run] the cold start's evaluation, from {path}")
                results = stored["results"]
        except (OSError, ValueError):
            pass
    if distributed.allgather_objects(results is not None)[0]:  # process 0's stored table
        return results
    local = distributed.local_model(model)
    if distributed.is_primary():
        logging.info("[run] evaluation of the cold start (SFT) on held-out synthetic videos (greedy)")
        results = result_rows(evaluate_all(run, local, tokenizer, eval_rows, "after_sft",
                                           episodes=eval_episodes_path(workdir)))
        storage.makedirs(storage.join(workdir, "sft"))
        with preemption.deferred():
            storage.write_json_atomic(path, {"settings": settings, "results": results, "manifest": manifest or {}})
    distributed.barrier("after-sft-eval")
    return results


def phase_histories(workdir: str) -> dict:
    """The whole run's per-step histories from sft/ and rl/ metrics.jsonl (every segment of a
    resumed run; the loop drops repeated steps on resume)."""
    def lines(phase):
        path = storage.join(workdir, phase, "metrics.jsonl")
        if not storage.isfile(path):
            return []
        out = []
        for line in storage.read_bytes(path).splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # torn by a kill; the next resume drops it
        return out

    sft, rl = lines("sft"), lines("rl")
    rl_keys = ("reward", "format_compliance", "kappa", "loss")
    return {  # at full precision: two runs' histories compare bit for bit
        "sft_loss": [line["sft/loss"] for line in sft if "sft/loss" in line],
        "rl": [{k: float(line[f"rl/{k}"]) for k in rl_keys} for line in rl if "rl/reward" in line],
        "training_minutes": round(sum(line.get(f"{phase}/step_s", 0.0)
                                      for phase, phase_lines in (("sft", sft), ("rl", rl))
                                      for line in phase_lines) / 60, 2),
    }


def reward_trend(rewards) -> dict | None:
    """The mean RL reward over the first and the last third of the steps (None under 3 steps):
    whether PARA-GRPO moved the reward, and by how much, with the step counts behind it."""
    means = thirds([float(r) for r in rewards])
    if means is None:
        return None
    first, last = means
    return {"steps": len(rewards), "per_third": len(rewards) // 3, "first": round(first, 4),
            "last": round(last, 4), "change": round(last - first, 4)}


def finished_summary(run: RunConfig, workdir: str) -> dict | None:
    """A finished run's summary.json, if it is complete (it has the evaluation) and every
    phase's checkpoint is at its configured step count; else None."""
    try:
        summary = json.loads(storage.read_bytes(storage.join(workdir, "summary.json")))
    except (OSError, ValueError):
        return None
    if "eval" not in summary:
        return None
    for phase, steps in (("sft", run.sft.steps), ("rl", run.rl.steps)):
        directory = storage.join(workdir, phase, "checkpoints")
        if steps and (not storage.isdir(directory) or (Checkpointer(directory).latest_step() or 0) < steps):
            return None
    return summary


@claims_workdir("run")
def run_command(run: RunConfig, workdir: str = "") -> dict:
    """The main job: SFT, then PARA-GRPO, then evaluation with and without tools.

    One run per workdir, under one config (workdirs.claims_workdir: a second run is refused, and
    so is a rerun with a config that differs in more than its length, unless
    `config_changed="ok"`). Resumable: each phase continues from its latest checkpoint. On SIGTERM/SIGINT a phase
    checkpoints and `preemption.Preempted` propagates: nothing after it runs and no
    summary.json is written (a previous one is removed before any training), so only a
    completed run has one. A completed run is left alone when run again."""
    summary_path = storage.join(workdir, "summary.json")
    finished = finished_summary(run, workdir)
    if finished is not None:
        logging.info(f"[run] {storage.absolute(workdir)} has finished every phase; its summary {summary_path} is "
                     f"kept (delete it to evaluate again)")
        return finished
    t0 = time.perf_counter()
    inputs = setup(run)
    model, tokenizer, eval_rows = inputs.model, inputs.tokenizer, inputs.eval_rows  # model: each phase's output
    rollout_mesh = build_rollout_mesh(run) if run.rl.steps else None
    if run.rl.steps:
        check_rollout_sampler(run, model, rollout_mesh)  # before SFT, not after it
    manifest = run_manifest(run, inputs, workdir)
    logging.info(f"[run] workdir {storage.absolute(workdir)}; {len(inputs.sft.rows)} SFT rows, "
                 f"{len(inputs.rl_rows)} RL rows, {len(eval_rows)} held-out rows")
    if distributed.is_primary() and storage.exists(summary_path):
        storage.remove(summary_path)  # stale from an earlier, shorter run: it must not claim completion
    after_sft = None
    if run.sft.steps:
        model, _ = train_sft(model, tokenizer, inputs.sft.rows, inputs.video_root, storage.join(workdir, "sft"),
                             run.sft, kinds=inputs.sft.kinds)
        if run.rl.steps and cold_start_evaluated(run):  # without RL the final table is this one
            after_sft = evaluate_after_sft(run, model, tokenizer, eval_rows, workdir, manifest)
            if after_sft is not None:
                print_results(after_sft, "[run] after SFT:")
    if run.rl.steps:
        model, _ = train_rl(model, tokenizer, inputs.rl_rows, storage.join(workdir, "rl"), run.rl,
                            evaluators=periodic_evaluators(run.rl, eval_rows,
                                                           output_dir=storage.join(workdir, "rl", "eval"),
                                                           data_dir=inputs.data_dir),
                            rollout_mesh=rollout_mesh)
    model = distributed.local_model(model)  # multi-process: a whole copy on this process's devices
    summary = {"workdir": storage.absolute(workdir), "manifest": manifest, **phase_histories(workdir)}
    if not distributed.is_primary():  # process 0 alone saves, evaluates and writes the summary
        return summary
    final = storage.join(workdir, "final")
    with preemption.deferred():  # the final model is written whole
        save_export(model, tokenizer, final)
    preemption.raise_if_requested("[run] stopped after saving the final model, before evaluation; "
                                  "rerun to evaluate")
    logging.info("[run] evaluation on held-out synthetic videos (greedy)")
    outcomes = evaluate_all(run, model, tokenizer, eval_rows, "final", episodes=eval_episodes_path(workdir),
                            workdir=workdir, data_dir=inputs.data_dir)
    summary["eval"] = result_rows(outcomes)
    if benchmark_metrics(outcomes):
        summary["benchmarks"] = benchmark_metrics(outcomes)
    if after_sft is not None:
        summary["eval_after_sft"] = after_sft
        summary["table_after_sft"] = print_results(after_sft, "[run] after SFT:")
    summary["table"] = print_results(summary["eval"], "[run] after RL:" if run.rl.steps else "")
    trend = reward_trend([line["reward"] for line in summary["rl"]])
    if trend:
        summary["reward_trend"] = trend
        logging.info(f"[run] PARA-GRPO reward: {trend['first']:.3f} over the first {trend['per_third']} of "
                     f"{trend['steps']} steps, {trend['last']:.3f} over the last {trend['per_third']} "
                     f"({trend['change']:+.3f})")
    summary["minutes"] = round((time.perf_counter() - t0) / 60, 2)

    summary["curves"] = plot_run({p: storage.join(workdir, p, "metrics.jsonl") for p in ("sft", "rl")},
                                 storage.join(workdir, "curves.png"))
    with preemption.deferred():
        storage.write_json_atomic(summary_path, summary)
    logging.info(f"[run] done in {summary['minutes']} min; final model {final}; curves {summary['curves']}; "
                 f"metrics {storage.join(workdir, 'rl', 'metrics.jsonl')}")
    return summary


@claims_workdir("sft")
def sft_command(run: RunConfig, workdir: str = ""):
    inputs = setup(run)
    run_manifest(run, inputs, workdir)
    return train_sft(inputs.model, inputs.tokenizer, inputs.sft.rows, inputs.video_root, workdir, run.sft,
                     kinds=inputs.sft.kinds)


@claims_workdir("train")
def train_command(run: RunConfig, workdir: str = ""):
    inputs = setup(run)
    rollout_mesh = build_rollout_mesh(run)
    check_rollout_sampler(run, inputs.model, rollout_mesh)
    run_manifest(run, inputs, workdir)
    return train_rl(inputs.model, inputs.tokenizer, inputs.rl_rows, workdir, run.rl,
                    evaluators=periodic_evaluators(run.rl, inputs.eval_rows,
                                                   output_dir=storage.join(workdir, "eval"), data_dir=inputs.data_dir),
                    rollout_mesh=rollout_mesh)


def export_command(run: RunConfig, workdir: str = ""):
    """The latest checkpoint under workdir (rl/ preferred, else sft/) -> an HF checkpoint in
    workdir/export that transformers loads."""
    inputs = setup(run)
    model, tokenizer = inputs.model, inputs.tokenizer
    # the phase's optimizer (frozen parameters change its state's layout); only the layout is used
    optimizers = {"rl": run.rl.optimizer, "sft": run.sft.optimizer, "": OptimizerConfig()}
    for phase in ("rl", "sft", ""):
        directory = storage.join(workdir, phase, "checkpoints")
        if storage.isdir(directory) and Checkpointer(directory).latest_step() is not None:
            step = TrainStep(model, optimizers[phase], sft_loss, HEAD)
            state, meta = Checkpointer(directory).restore_latest(step.init_state())
            out = storage.join(workdir, "export")
            save_export(step.model(state), tokenizer, out)
            logging.info(f"[export] {directory} step {meta['next_step']} -> {out}")
            return out
    raise SystemExit(f"export: no checkpoint under {workdir}/{{rl,sft}}/checkpoints")


def generate_episode(run: RunConfig):
    """(RolloutConfig, DispatchConfig) of `generate`: the run's RL episode (rl.rollout, rl.dispatch),
    decoded greedily."""
    rl = run.rl
    return dataclasses.replace(rl.rollout, temperature=0.0), rl.dispatch


def generate_command(run: RunConfig, workdir: str = ""):
    """Greedy episode of the policy on config.generate.question and .video (default: the first
    held-out row), as the run's RL episode runs; prints the question, the video, the completion
    and the parsed answer (beside the expected one for a held-out row)."""
    inputs = setup(run)
    model, tokenizer, eval_rows = inputs.model, inputs.tokenizer, inputs.eval_rows
    g = run.generate
    row = eval_rows[0] if eval_rows else None
    question = g.question if g and g.question else row.question
    video = g.video if g and g.video else row.video_path
    expected = row.answer if row is not None and not (g and (g.question or g.video)) else ""
    episode = Episode("generate", question, expected, row.question_type if expected else "oe", video,
                      int(g.nframes) if g else 16)
    rollout, dispatch = generate_episode(run)
    with CropDispatcher(dispatch) as dispatcher:
        rollouts, skipped = run_rollouts(Sampler(model), tokenizer, [episode], 1, rollout, dispatcher)
    if skipped:
        raise SystemExit(skipped[0])
    result = rollouts[0]
    answer = extract_answer(result.generated_text)
    print(f"[generate] question: {question}\n[generate] video: {video} (K = {episode.nframes} overview frames; "
          f"{rollout.mode} mode, up to {rollout.max_turns} tool rounds of {dispatch.max_parallel} calls, crops of at "
          f"most {dispatch.max_frames} frames of {dispatch.max_pixels} pixels, summaries of at most "
          f"{rollout.subagent_max_tokens} tokens)\n[generate] completion:\n{result.completion}\n"
          f"[generate] answer: {answer!r}" + (f" (expected {expected!r})" if expected else "")
          + f"; {result.num_tool_calls} tool calls over {result.turns} turns", flush=True)
    return {**dataclasses.asdict(result.episode), "completion": result.completion, "parsed_answer": answer,
            "tool_calls": result.num_tool_calls, "turns": result.turns}
