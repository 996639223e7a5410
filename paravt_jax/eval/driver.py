"""The evaluation driver: the reference protocol on local benchmark copies, batched.

    paravt-jax eval --config=configs/eval.py:synthetic --output_dir=runs/eval
    paravt-jax eval --config=configs/eval.py:paravt_8b --config.model.checkpoint=/ckpt \\
        --config.root=/data/bench --config.datasets=videomme,charades --shard_id=0 --num_shards=4

Protocol (reference `paravt/eval/driver.py`; the settings are the config's `driver` section,
eval/settings.py's DriverConfig): greedy decoding, K overview frames, agentic modes run up to
`max_turns` tool rounds of at most `max_parallel` crop_video calls through our rollout engine
in frames mode (crops are appended to the context as frames); after the last round a short
final answer is forced (64 tokens MCQ, 128 grounding). Many samples go through one sampler
call (`batch_size`).

Outputs under output_dir: `<dataset>.shard-<i>-of-<n>.jsonl` (one line per finished sample,
appended after every batch: a re-run skips finished samples), `<dataset>.json` once every
shard is done (summary + every sample), and `summary_all.json`. Every record names its
producer (the checkpoint's identity and the evaluation settings, eval/provenance.py, kept in
`<dataset>.producers.json`): a re-run resumes only its own producer's records and refuses a
directory with another's (`--overwrite` drops them). A benchmark with more missing videos than
`max_missing_videos` (a share) is refused; the summary always counts them. `--compare` runs the same
samples with parallel dispatch and with the sequential baseline (one call per turn) and
writes `compare.json` / `compare.md`.

The command itself (`evaluate_command`: the model built, one sampler for every benchmark) is
the application's, paravt_jax/cli/eval.py; this module is what it runs.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import time
from collections.abc import Callable, Sequence

import numpy as np
from absl import logging

from paravt_jax.agent.dispatch import CropDispatcher, DispatchConfig
from paravt_jax.agent.rollout import Episode, Rollout, RolloutConfig, run_rollouts
from paravt_jax.config import ConfigValueError
from paravt_jax.episodes import rewards as R
from paravt_jax.episodes.episode_stats import calls_per_tool_turn
from paravt_jax.eval import prompts, provenance, scoring
from paravt_jax.eval import records as store
from paravt_jax.eval.evaluator import Outcome
from paravt_jax.eval.settings import BenchmarkConfig, DriverConfig
from paravt_jax.infra import storage


# ----------------------------------------------------------------------------- one batch
def rollout_config(config: DriverConfig, question_type: str) -> RolloutConfig:
    """The episode of one question type: the driver's prompt format and tool protocol with what
    its prompt mode and the question type decide (system text, tool, final-answer turn),
    greedy, in frames mode (sequential: one call per round)."""
    texts = prompts.load_prompt_texts(config.prompt_file)
    mode = prompts.prompt_mode(config.prompt_mode, texts)
    answer_tokens = config.grounding_answer_tokens if question_type == "tvg" else config.mcq_answer_tokens
    return RolloutConfig(
        mode="sequential" if config.dispatch == "sequential" else "frames",
        max_turns=config.max_turns if mode.tools else 0, max_new_tokens=config.max_new_tokens, temperature=0.0,
        prompt=dataclasses.replace(config.prompt, tools=mode.tools, system_prompt=mode.system),
        protocol=dataclasses.replace(config.protocol, final_answer=mode.tools, final_answer_tokens=answer_tokens,
                                     final_answer_instruction=prompts.final_instruction(question_type, texts)))


def turn_texts(rollout: Rollout, tokenizer) -> list[str]:
    """The text of every assistant turn (runs of generated tokens), stop tokens removed."""
    generated = np.flatnonzero(rollout.inputs.loss_mask)
    if not len(generated):
        return []
    runs = np.split(generated, np.flatnonzero(np.diff(generated) > 1) + 1)
    ids = rollout.inputs.input_ids
    return [tokenizer.decode(ids[run]).replace("<|im_end|>", "").strip() for run in runs]


def score(sample, final: str) -> dict:
    """correct / score / pred of one sample: option letter (MCQ), temporal IoU (grounding),
    answer F1 (the synthetic open-ended questions)."""
    if sample.question_type == "oe":
        f1 = R.accuracy_reward(R.extract_answer(final), sample.answer, "oe")
        return {"correct": None, "score": float(f1), "pred": R.extract_answer(final)[:200]}
    gt = sample.span or (0.0, 0.0)
    correct, value, pred = scoring.score_sample(
        {"is_mcq": sample.is_mcq, "answer": sample.answer, "gt_start": gt[0], "gt_end": gt[1]}, final)
    return {"correct": correct, "score": float(value), "pred": pred}


def sample_record(index: int, sample, config: DriverConfig) -> dict:
    record = {"index": index, "id": sample.sample_id, "dataset": sample.dataset,
              "question_type": sample.question_type, "prompt_mode": config.prompt_mode,
              "dispatch": config.dispatch, "answer": sample.answer, "pred": "",
              "correct": False if sample.is_mcq else None,
              "score": 0.0, "tool_calls": 0, "calls_per_turn": [], "turns": 0, "context_tokens": 0}
    for field in ("duration", "task", "key"):
        if getattr(sample, field, ""):
            record[field] = getattr(sample, field)
    return record


def evaluate_batch(sampler, tokenizer, batch: Sequence[tuple[int, object]], config: DriverConfig,
                   dispatcher: CropDispatcher) -> list[dict]:
    """Records of one batch of (index, sample) pairs that share a question type."""
    question_type = batch[0][1].question_type
    episodes = [Episode(f"{index}", sample.question, sample.answer, sample.question_type, sample.video_path,
                        config.nframes) for index, sample in batch]
    start = time.perf_counter()
    rollouts, skipped = run_rollouts(sampler, tokenizer, episodes, 1, rollout_config(config, question_type),
                                     dispatcher)
    seconds = (time.perf_counter() - start) / len(batch)
    by_id = {r.episode.episode_id: r for r in rollouts}
    errors = {message.split(":", 1)[0]: message.split(":", 1)[1].strip() for message in skipped}
    records = []
    for index, sample in batch:
        record = sample_record(index, sample, config)
        record["seconds"] = round(seconds, 4)
        rollout = by_id.get(f"{index}")
        if rollout is None:
            record["error"] = errors.get(f"{index}", "no rollout")
            records.append(record)
            continue
        turns = turn_texts(rollout, tokenizer)
        final = turns[-1] if turns else ""
        record.update(score(sample, final))
        record.update(tool_calls=rollout.num_tool_calls, calls_per_turn=list(rollout.calls_per_turn),
                      turns=rollout.turns, context_tokens=int(rollout.inputs.length), final_text=final,
                      response=rollout.completion, tool_errors=list(rollout.errors))
        if sample.question_type == "tvg":
            record["pred_text"] = final[:500]
        records.append(record)
    return records


def crop_dispatcher(config: DriverConfig) -> CropDispatcher:
    return CropDispatcher(DispatchConfig(max_parallel=config.max_parallel, min_pixels=config.crop_min_pixels,
                                         max_pixels=config.crop_max_pixels, sizing=config.crop_sizing,
                                         arguments=config.crop_arguments))


def batches(pending: Sequence[tuple[int, object]], batch_size: int) -> list[list[tuple[int, object]]]:
    """Batches of samples with one question type each (one forced-answer budget per call)."""
    out = []
    for kind in dict.fromkeys(s.question_type for _, s in pending):
        group = [p for p in pending if p[1].question_type == kind]
        out += [group[i:i + batch_size] for i in range(0, len(group), batch_size)]
    return out


def shard_indices(total: int, shard_id: int, num_shards: int) -> list[int]:
    """Strided split: every index in exactly one shard."""
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id={shard_id} must be in [0, num_shards={num_shards})")
    return list(range(shard_id, total, num_shards))


def summarize(dataset: str, records: Sequence[dict], nframes: int) -> dict:
    """The reference's per-dataset summary, plus per-question-type metrics when a dataset
    mixes types (the synthetic benchmark), turns, context tokens and breakdowns."""
    records = sorted(records, key=lambda r: r["index"])
    kinds = sorted({r["question_type"] for r in records})
    elapsed = float(sum(r.get("seconds", 0.0) for r in records))
    summary = scoring.dataset_summary(dataset, records, is_mcq=kinds != ["tvg"], nframes=nframes,
                                      elapsed=elapsed)
    if len(kinds) > 1 or kinds == ["oe"]:
        by_kind = {}
        for kind in kinds:
            rows = [r for r in records if r["question_type"] == kind]
            ok = [r for r in rows if "error" not in r]
            if kind == "mcq":
                by_kind[kind] = {"accuracy": scoring.mcq_accuracy(rows), "count": len(rows)}
            elif kind == "tvg":
                by_kind[kind] = {**scoring.grounding_metrics_from_ious(r["score"] for r in ok), "count": len(rows)}
            else:
                by_kind[kind] = {"f1": float(np.mean([r["score"] for r in rows])) if rows else 0.0,
                                 "count": len(rows)}
        summary["by_question_type"] = by_kind
        summary["mean_score"] = float(np.mean([r["score"] for r in records])) if records else 0.0
    summary["avg_turns"] = float(np.mean([r["turns"] for r in records])) if records else 0.0
    summary["avg_context_tokens"] = float(np.mean([r["context_tokens"] for r in records])) if records else 0.0
    summary["calls_per_tool_turn"] = calls_per_tool_turn([r["calls_per_turn"] for r in records])
    summary["samples_per_minute"] = 60.0 * len(records) / elapsed if elapsed > 0 else 0.0
    summary["per_duration"] = scoring.per_duration(records)
    summary["per_task"] = scoring.per_task(records)
    return summary


class MissingVideos(ConfigValueError):
    """More of a benchmark's videos are missing than `max_missing_videos` allows."""


def check_missing_videos(benchmark, max_share: float) -> None:
    """Refuses a benchmark whose missing videos exceed `max_share` of its annotated samples
    (a mistyped video_dir must not score 0.000 and pass as complete)."""
    missing, total = len(benchmark.missing_videos), len(benchmark.samples) + len(benchmark.missing_videos)
    if total and missing / total > max_share:
        raise MissingVideos(f"{benchmark.name}: {missing} of {total} videos are missing ({missing / total:.1%} > "
                            f"max_missing_videos={max_share:g}); first: {benchmark.missing_videos[0]}; check "
                            f"config.benchmarks.{benchmark.name}.video_dir and config.root")
    if not total:
        raise MissingVideos(f"{benchmark.name}: its annotations hold no samples")


def run_dataset(sampler, tokenizer, benchmark, config: DriverConfig, output_dir: str, *, shard_id: int = 0,
                num_shards: int = 1, log: Callable[[str], None] = logging.info, identity: dict | None = None,
                overwrite: bool = False, manifest: dict | None = None) -> dict:
    """Evaluates this shard's unfinished samples of one loaded benchmark; returns the
    dataset's summary (complete=False while other shards are missing). `identity` names the
    model (provenance.model_identity); with the settings it keys every record, and records of
    another key in output_dir are refused (store.ForeignRecords), or dropped with `overwrite`."""
    storage.makedirs(output_dir)
    name = benchmark.name
    samples = list(benchmark.samples)
    key = provenance.producer(identity or {}, config)
    producer_id = store.claim_output(output_dir, name, key, overwrite, log)
    if manifest:  # the environment these records are written in (reproducibility.manifest)
        store.record_manifest(output_dir, name, producer_id, manifest, log)
    mine = store.shard_path(output_dir, name, shard_id, num_shards)
    done = store.read_records([mine])
    if storage.isfile(mine) and not store.ends_with_newline(mine):
        # an interrupted write left a torn last line: drop it so appended records start clean
        storage.write_atomic(mine, "".join(json.dumps(done[i], default=str) + "\n" for i in sorted(done)))
    pending = [(i, samples[i]) for i in shard_indices(len(samples), shard_id, num_shards) if i not in done]
    log(f"[eval] {name}: {len(samples)} samples, shard {shard_id}/{num_shards}: {len(pending)} to run, "
        f"{len(done)} already done; {len(benchmark.missing_videos)} missing videos skipped")
    started, finished = time.perf_counter(), 0
    shard = storage.Appender(mine)
    with crop_dispatcher(config) as dispatcher:
        for batch in batches(pending, config.batch_size):
            records = evaluate_batch(sampler, tokenizer, batch, config, dispatcher)
            shard.write("".join(json.dumps({**record, "producer": producer_id}, default=str) + "\n"
                                for record in records))
            shard.sync()
            finished += len(batch)
            log(f"[eval] {name}: {finished}/{len(pending)} samples ({time.perf_counter() - started:.0f} s)")
    shard.close()
    pattern = f"{name}.shard-*-of-{num_shards:05d}.jsonl"
    all_records = store.read_records([storage.join(output_dir, n) for n in storage.listdir(output_dir)
                                if fnmatch.fnmatch(n, pattern)])
    records = [all_records[i] for i in sorted(all_records) if i < len(samples)]
    summary = summarize(name, records, config.nframes)
    summary.update(complete=len(records) == len(samples), samples=len(samples),
                   missing_videos=len(benchmark.missing_videos), prompt_mode=config.prompt_mode,
                   dispatch=config.dispatch, producer_id=producer_id, producer=key, manifest=manifest or {})
    if summary["complete"]:
        is_mcq = all(r["question_type"] == "mcq" for r in records)
        output = scoring.dataset_output(name, records, is_mcq=is_mcq, nframes=config.nframes,
                                        elapsed=summary["elapsed"])
        output["summary"] = summary
        output["missing_videos"] = list(benchmark.missing_videos)
        storage.write_json_atomic(storage.join(output_dir, f"{name}.json"), output)
    return summary


@dataclasses.dataclass(frozen=True)
class BenchmarkEval:
    """One loaded benchmark under the driver's protocol `config`, an Evaluator
    (eval/evaluator.py): `run` evaluates this shard's unfinished samples into `output_dir`
    (run_dataset; a periodic evaluation at step s into `output_dir/step_00000s`, with
    `policy: {step: s}` in the records' producer) and yields one Outcome named after the
    benchmark: its headline score, mean tool calls, turns and context tokens, and the whole
    summary as the result."""
    benchmark: object  # datasets.LoadedBenchmark
    config: DriverConfig
    output_dir: str
    identity: dict = dataclasses.field(default_factory=dict)  # provenance.model_identity
    shard_id: int = 0
    num_shards: int = 1
    overwrite: bool = False
    manifest: dict = dataclasses.field(default_factory=dict)  # reproducibility.manifest

    def run(self, sampler, tokenizer, step: int | None = None):
        directory, identity = self.output_dir, self.identity
        if step is not None:
            directory, identity = storage.join(directory, f"step_{step:06d}"), {**identity, "policy": {"step": step}}
        summary = run_dataset(sampler, tokenizer, self.benchmark, self.config, directory, shard_id=self.shard_id,
                              num_shards=self.num_shards, identity=identity, overwrite=self.overwrite,
                              manifest=self.manifest)
        store.write_summary_all(directory, {self.benchmark.name: summary})
        metrics = {"score": headline(summary), "complete": float(summary["complete"])}
        metrics.update({key: float(summary[key]) for key in ("avg_tool_calls", "avg_turns", "avg_context_tokens",
                                                             "calls_per_tool_turn")
                        if isinstance(summary.get(key), (int, float))})
        yield Outcome(self.benchmark.name, metrics, {"dataset": self.benchmark.name,
                                                     "dispatch": self.config.dispatch}, summary)


# ----------------------------------------------------------------------------- comparison
COMPARE_COLUMNS = (("accuracy", "score"), ("avg_tool_calls", "tool calls"), ("avg_turns", "turns"),
                   ("avg_context_tokens", "context tokens"), ("elapsed", "wall s"),
                   ("samples_per_minute", "samples/min"), ("missing_videos", "missing videos"))


def headline(summary: dict) -> float:
    for key in ("mean_score", "accuracy", "mIoU"):
        if key in summary:
            return float(summary[key])
    return 0.0


def comparison_table(results: dict[str, dict[str, dict]]) -> str:
    """Markdown: one row per (dataset, dispatch)."""
    lines = ["| dataset | dispatch | " + " | ".join(c for _, c in COMPARE_COLUMNS) + " |",
             "|---|---|" + "---|" * len(COMPARE_COLUMNS)]
    for dataset, by_dispatch in results.items():
        for dispatch, s in by_dispatch.items():
            values = [headline(s) if key == "accuracy" else s.get(key, 0.0) for key, _ in COMPARE_COLUMNS]
            lines.append(f"| {dataset} | {dispatch} | " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v)
                                                                     for v in values) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the command's parts
def driver_config(c, benchmark: str | None = None, **override) -> DriverConfig:
    """The `driver` section of the eval command's typed config `c` (run_config.RunConfig, built
    and checked at the command line), with `override`'s values (one dispatch of --compare) and
    the protocol of `benchmark` (`benchmark_protocol`), if named."""
    config = dataclasses.replace(c.driver, **override)
    return config if benchmark is None else benchmark_protocol(config, c, benchmark)


def benchmark_prompt_mode(c, name: str) -> str:
    """Charades-STA has its own prompt mode (`grounding_prompt_mode`); the others use `driver.prompt_mode`."""
    return c.grounding_prompt_mode if name == "charades" else c.driver.prompt_mode


def benchmark_protocol(config: DriverConfig, c, name: str) -> DriverConfig:
    """`config` for one benchmark: its prompt mode (`benchmark_prompt_mode`) and overview visual
    (Charades-STA: `grounding_visual`; the others: images)."""
    visual = c.grounding_visual if name == "charades" else "images"
    return dataclasses.replace(config, prompt_mode=benchmark_prompt_mode(c, name),
                               prompt=dataclasses.replace(config.prompt, overview_visual=visual))


def dataset_names(c) -> list[str]:
    """The benchmarks of `config.datasets` (comma-separated); an empty list or a name without an
    entry in `config.benchmarks` is a ConfigValueError (refused before any work)."""
    names = [d.strip() for d in str(c.datasets).split(",") if d.strip()]
    unknown = [n for n in names if n not in c.benchmarks]
    if unknown or not names:
        problem = f"unknown dataset {unknown[0]!r}" if unknown else "empty"
        raise ConfigValueError(f"datasets={c.datasets!r}: {problem}; choose from {', '.join(sorted(c.benchmarks))} "
                               "(comma-separated)")
    return names


def benchmark_settings(c, name: str, limit: int = 0, **override) -> BenchmarkConfig:
    """The BenchmarkConfig of benchmark `name` under the eval command's typed config `c`: its paths
    (`benchmarks.<name>`, relative ones under `root`; synthetic's empty ones stay empty: the
    built-in held-out set), `limit` (0: `c.limit`), its protocol (driver_config, with
    `override`) and overview visual (Charades-STA: `grounding_visual`)."""
    paths = dict(c.benchmarks.get(name, {}))
    if name != "synthetic":
        for key in ("annotations", "video_dir", "subtitle_dir"):
            if paths.get(key) and not os.path.isabs(paths[key]):
                paths[key] = os.path.join(c.root, paths[key])
    visual = c.grounding_visual if name == "charades" else "images"
    driver = dataclasses.replace(driver_config(c, **override), prompt_mode=benchmark_prompt_mode(c, name))
    return BenchmarkConfig(dataset=name, annotations=paths.get("annotations", ""), video_dir=paths.get("video_dir", ""),
                           subtitle_dir=paths.get("subtitle_dir", ""), limit=limit or c.limit,
                           max_missing_videos=c.max_missing_videos, visual=visual, driver=driver)


def load_benchmark(settings: BenchmarkConfig, default_data_dir: str, where: str = ""):
    """The benchmark `settings` names, loaded (the synthetic one from `default_data_dir`, the
    built-in data, where its paths are empty); a path that does not exist is a ConfigValueError
    (`where`: the config keys of the paths, named in its message)."""
    from paravt_jax.eval import datasets

    annotations, video_dir = settings.annotations, settings.video_dir
    if settings.dataset == "synthetic":
        annotations = annotations or os.path.join(default_data_dir, "rl_eval.parquet")
        video_dir = video_dir or default_data_dir
    try:
        return datasets.load_benchmark(settings.dataset, annotations, video_dir,
                                       prompt_mode=settings.driver.prompt_mode, subtitle_dir=settings.subtitle_dir,
                                       limit=settings.limit)
    except FileNotFoundError as e:  # a mistyped path in config.benchmarks / config.root
        raise ConfigValueError(f"{e} ({where or f'the paths of benchmark {settings.dataset}'})") from None


def load_benchmarks(c, limit: int, default_data_dir: str):
    """Every benchmark of `c.datasets`, loaded under the eval command's typed config `c`."""
    return [load_benchmark(benchmark_settings(c, name, limit), default_data_dir,
                           f"config.benchmarks.{name}, config.root={c.root!r}") for name in dataset_names(c)]


def warm_up(sampler, tokenizer, benchmark, drivers: Sequence[DriverConfig]) -> None:
    """Runs one batch per question type of `benchmark` under each driver config, unrecorded,
    so that the timed runs of --compare do not pay for compiling."""
    warm = {}
    for batch in batches(list(enumerate(benchmark.samples)), drivers[0].batch_size):
        warm.setdefault(batch[0][1].question_type, batch)
    for driver in drivers:
        with crop_dispatcher(driver) as dispatcher:
            for batch in warm.values():
                evaluate_batch(sampler, tokenizer, batch, driver, dispatcher)


@dataclasses.dataclass(frozen=True)
class WarmUp:
    """An Evaluator that records nothing and yields no outcome: for each benchmark of
    `evaluators` (BenchmarkEvals), one batch per question type under each of their settings
    (warm_up), so that the timed runs after it (--compare) do not pay for compiling."""
    evaluators: tuple

    def run(self, sampler, tokenizer, step: int | None = None):
        arms: dict[str, list] = {}
        for evaluator in self.evaluators:
            arms.setdefault(evaluator.benchmark.name, []).append(evaluator)
        for group in arms.values():
            warm_up(sampler, tokenizer, group[0].benchmark, [e.config for e in group])
        yield from ()
