"""Rollout logs: what the agent did, episode by episode, for reading and for `paravt-jax view`.

Each RL step writes `rl.log_episodes` of its sampled episodes to
`<rl workdir>/episodes/step_XXXXXX.jsonl`; with logging on, the periodic held-out evaluation
during RL (`rl.eval_every`) writes all of its episodes, with and without tools, to
`<rl workdir>/eval_episodes/step_XXXXXX.jsonl` (stage "periodic", the step, `tools`); and the
main job's held-out evaluations write theirs to `<workdir>/eval/episodes.jsonl`. One JSON
object per episode:

  step, stage ("rl" or the evaluation's name), episode_id, sample, group (the prompt's place
  in the step), video (the dataset row's path), question, answer, question_type, nframes (K),
  tools (whether the prompt offered them: an evaluation's setting, an RL prompt's draw),
  overview_times, truth_windows (where the data names them), turns (each assistant turn as
  the model's context shows it, cut to MAX_TEXT characters, with its well-formedness, its
  problems and its calls: the window the call asked for, the window cut, the crop's frame
  timestamps, the tool response's text), predicted (the extracted answer), rewards (by part),
  advantage (mean, min and max over the episode's generated tokens), format_compliant,
  truncated, errors, length (generated tokens).

Frames are references (timestamps into the row's video), never pixels, and every text is cut,
so a step's file is bounded: about `log_episodes` x (turns x MAX_TEXT + calls x MAX_RESPONSE).
Files are written whole and atomically; a resumed run drops the files of the steps it repeats.
Only process 0 writes.
"""
from __future__ import annotations

import json
import math
import os
import posixpath
import re
from collections.abc import Sequence

import numpy as np

from paravt_jax.episodes import rewards as R
from paravt_jax.episodes.episode_stats import format_compliant, turn_problems
from paravt_jax.infra import distributed as dist
from paravt_jax.infra import storage

MAX_TEXT = 4000  # characters kept of one assistant turn
MAX_RESPONSE = 1000  # characters kept of one tool response
MAX_PROBLEMS = 8  # problems listed per turn
MAX_LOGGED = 256  # most episodes one step may log (rl.log_episodes is checked against it)
STEP_FILE = re.compile(r"^step_(\d{6,})\.jsonl$")


def cut(text: str, limit: int) -> str:
    """`text` whole, or its first `limit` characters and a note of how many were dropped."""
    return text if len(text) <= limit else f"{text[:limit]} [... {len(text) - limit} more characters]"


def finite(x: float) -> float | None:
    """A number JSON can hold (NaN and infinities, which a model-written window can reach,
    become null)."""
    x = float(x)
    return round(x, 3) if math.isfinite(x) else None


def truth_windows(extra: dict | None) -> list[list[float]]:
    """The question's ground-truth windows from its row's `extra_info` (`windows`: [[start,
    end], ...], as the built-in events task writes them); [] where the data has none."""
    windows = (extra or {}).get("windows") or []
    try:
        return [[float(s), float(e)] for s, e in windows]
    except (TypeError, ValueError):
        return []


def episode_record(rollout, rewards: dict | None = None, advantages: np.ndarray | None = None,
                   truth: Sequence = (), **fields) -> dict:
    """One rollout as a JSON-ready dict (see the module docstring); `advantages`: the
    rollout's per-token advantages, aligned with `rollout.inputs.loss_mask`."""
    ep = rollout.episode
    calls = list(rollout.calls)
    turns = []
    for t, text in enumerate(rollout.turn_texts):
        problems = turn_problems(text)[:MAX_PROBLEMS]
        turns.append({
            "text": cut(text, MAX_TEXT), "well_formed": not problems, "problems": problems,
            "calls": [{"asked": [finite(c.asked[0]), finite(c.asked[1])],
                       "window": None if c.window is None else [finite(c.window[0]), finite(c.window[1])],
                       "frame_times": list(c.frame_times), "response": cut(c.response, MAX_RESPONSE)}
                      for c in calls if c.turn == t]})
    mask = np.asarray(rollout.inputs.loss_mask) > 0
    advantage = None
    if advantages is not None and mask.any():
        values = np.asarray(advantages, np.float32)[: len(mask)][mask]  # rows are right-padded
        advantage = {"mean": finite(values.mean()), "min": finite(values.min()), "max": finite(values.max())}
    return {
        "tools": ep.tools, **fields, "episode_id": ep.episode_id, "sample": rollout.sample,
        "video": os.path.abspath(ep.video_path),
        "question": ep.question, "answer": ep.answer, "question_type": ep.question_type,
        "nframes": ep.nframes, "overview_times": list(rollout.overview_times),
        "truth_windows": [list(w) for w in truth], "turns": turns,
        "predicted": cut(R.extract_answer(rollout.generated_text), MAX_RESPONSE),
        "rewards": {k: finite(v) for k, v in (rewards or {}).items()},
        "advantage": advantage, "format_compliant": format_compliant(rollout.turn_texts),
        "truncated": bool(rollout.truncated), "errors": [cut(e, MAX_RESPONSE) for e in rollout.errors[:MAX_PROBLEMS]],
        "length": int(mask.sum()),
    }


def choose(count: int, total: int, group_size: int) -> list[int]:
    """`count` of `total` prompt-major rows, spread over the prompts: the first sample of each
    prompt, then the second, ... (a step's log shows every prompt and K before a second look
    at any one), in row order."""
    groups = max(1, -(-total // group_size))
    order = [g * group_size + s for s in range(group_size) for g in range(groups) if g * group_size + s < total]
    return sorted(order[:count])


def dumps(records: Sequence[dict]) -> bytes:
    return "".join(json.dumps(r, allow_nan=False) + "\n" for r in records).encode()


def step_path(directory: str, step: int) -> str:
    return storage.join(directory, f"step_{step:06d}.jsonl")


def step_files(directory: str) -> dict[int, str]:
    """{step: path} of the step logs in `directory` (empty when it does not exist)."""
    out = {}
    for name in storage.listdir(directory):  # empty when the directory does not exist
        match = STEP_FILE.match(name)
        if match:
            out[int(match.group(1))] = storage.join(directory, name)
    return dict(sorted(out.items()))


def read_jsonl(path: str) -> list[dict]:
    """The records of one log file; a clear error naming the file and line when one is bad."""
    out = []
    for number, line in enumerate(storage.read_text(path).splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError as e:
                raise ValueError(f"{path}: line {number} is not JSON ({e})") from None
    return out


class EpisodeLog:
    """The RL trainer's step logs under `directory` (`<rl workdir>/episodes`). `rows`: the
    dataset rows, for the ground-truth windows of their `extra` (episode ids `row{index}`)."""

    def __init__(self, directory: str, count: int, group_size: int, rows: Sequence = ()):
        self.directory = directory
        self.count = count
        self.group_size = group_size
        self.truth = {f"row{r.index}": truth_windows(getattr(r, "extra", None)) for r in rows}
        self._first = True

    def write(self, step: int, rollouts: Sequence, rewards: Sequence[dict], advantages: np.ndarray) -> str | None:
        """Logs `count` of the step's rollouts (with their reward parts and per-token
        advantages [N, T], rows as the rollouts); returns the file written (None when off or
        not process 0). The first write of a run also removes the files of steps >= `step`,
        which an interrupted run wrote past its last checkpoint."""
        if not self.count or not dist.is_primary():
            return None
        chosen = choose(self.count, len(rollouts), self.group_size)
        return self.write_records(step, [episode_record(rollouts[i], rewards[i], advantages[i],
                                                        self.truth.get(rollouts[i].episode.episode_id, ()),
                                                        step=step, stage="rl", group=i // self.group_size)
                                         for i in chosen])

    def write_records(self, step: int, records: Sequence[dict]) -> str | None:
        """Writes `records` as step `step`'s file, whole and atomically (None when off or not
        process 0); the first write of a run first removes the files of steps >= `step`."""
        if not self.count or not dist.is_primary():
            return None
        storage.makedirs(self.directory)
        if self._first:
            for later, path in step_files(self.directory).items():
                if later >= step:
                    storage.remove(path)
            self._first = False
        path = step_path(self.directory, step)
        storage.write_atomic(path, dumps(records))
        return path


def write_eval_episodes(path: str, stage: str, records: Sequence[dict], settings: dict) -> None:
    """Adds one evaluation setting's episode records (eval_records; `settings`, e.g. tools and
    K, on each) to the evaluation log at `path` under `stage` (e.g. "final"), replacing that
    stage and setting's earlier records (a rerun evaluates again), atomically."""
    kept = [r for r in read_jsonl(path)
            if not (r.get("stage") == stage and all(r.get(k) == v for k, v in settings.items()))] \
        if storage.isfile(path) else []
    storage.makedirs(posixpath.dirname(path) or ".")
    storage.write_atomic(path, dumps(kept + [{"step": None, "stage": stage, **r} for r in records]))


def eval_records(rollouts: Sequence, rows: Sequence = (), **fields) -> list[dict]:
    """Held-out episodes (ids `eval{index}`) as records, scored by accuracy, with `fields`
    (step, stage, the setting) on each; `rows`: the held-out rows, for their truth windows."""
    truth = {f"eval{r.index}": truth_windows(getattr(r, "extra", None)) for r in rows}
    out = []
    for rollout in rollouts:
        acc = R.accuracy_reward(R.extract_answer(rollout.generated_text), rollout.episode.answer,
                                rollout.episode.question_type)
        out.append(episode_record(rollout, {"acc_reward": acc}, None, truth.get(rollout.episode.episode_id, ()),
                                  **fields))
    return out
