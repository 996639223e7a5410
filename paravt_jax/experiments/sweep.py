"""`paravt-jax sweep`: run every arm of a config's `sweep()` grid, one workdir per arm.

    paravt-jax sweep --config=configs/ablations.py:tiny --workdir=runs/ablations --shared_sft
    paravt-jax sweep --config=configs/ablations.py:qwen3vl_8b --workdir=gs://... --dry_run

A config file defines `sweep()` (or `sweep(arg)`, which receives the preset after ':') next
to `get_config(arg)`, as in big_vision. It returns a list of arms; an arm is a dict of
overrides keyed by dotted config field (`{"rl.advantage.anchor_weight": 0.0, "seed": 1}`). An entry
whose value is itself a dict is a named group of overrides: `{"arm": {"name": "vanilla",
"rl.advantage.anchor_weight": 0.0, ...}, "seed": 1}`; the group's name stands for its overrides in the
arm's directory name (`vanilla,seed=1`). `product(arm=[...], seed=[0, 1, 2])` builds the
cartesian product of such axes (`product(**{"rl.advantage.anchor_mode": ["token", "sequence"]})` for a
dotted field).

Each arm runs the main job (`paravt_jax.cli.jobs.run_command`: SFT -> RL -> eval) in
`<workdir>/<arm name>`, one after another in this process; `--dry_run` prints instead one
`python -m paravt_jax.cli run ...` command per arm, for launch scripts to fan out. Arms whose
workdir holds a finished run are skipped, so a sweep is resumed by running it again.
`--shared_sft` runs the cold-start SFT once (into `<workdir>/_sft`, with RL off) and starts
every arm's RL from its exported model; arms that override SFT-shaping fields (under
SHARED_SFT_PREFIXES: `sft.steps` for a shorter cold start) share one SFT run per distinct set
of such overrides (`<workdir>/_sft,steps=200`). Every override is checked against the config before
any arm starts. At the end the comparison report (`paravt_jax.experiments.report`) is written to
`<workdir>/report.*`.
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import hashlib
import inspect
import itertools
import json
import os
import re
import shlex
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from absl import logging

from paravt_jax.config import config_file, moved_to
from paravt_jax.experiments import report
from paravt_jax.experiments.report import SHARED_SFT_DIR
from paravt_jax.infra.storage import write_json_atomic

RunJob = Callable[[Any, str], Any]  # (config, workdir) -> the main job's summary

ARM_RECORD = "sweep_arm.json"  # written when an arm starts: its name, group and overrides
DONE_MARKER = "sweep_done.json"  # written atomically when an arm's main job has returned
PLAN_FILE = "sweep.json"  # the sweep root's list of arms, in order
SEED_KEY = "seed"
NAME_KEY = "name"
MAX_NAME_LENGTH = 96
_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]")
# Fields that shape the shared SFT run: under --shared_sft, arms that set the same values of
# them share one SFT run.
SHARED_SFT_PREFIXES = ("sft.", "model.", "data.", "mesh.")


class SweepError(ValueError):
    """A sweep that cannot run as written; the message names the file, arm and field."""


@dataclasses.dataclass(frozen=True)
class Arm:
    """One run of a sweep.

    name: its directory name under the sweep root; group: the name without the seed part
    (arms of one group differ only by seed); overrides: ((dotted field, typed value), ...)
    in the order they are applied; labels: names of the override groups it was built from.
    """
    name: str
    group: str
    overrides: tuple[tuple[str, Any], ...]
    labels: tuple[str, ...] = ()

    def override_dict(self) -> dict[str, Any]:
        return dict(self.overrides)


# ----------------------------------------------------------------------------- building arms
def product(**axes: Sequence) -> list[dict]:
    """Cartesian product of axes, the first axis varying slowest.

    An axis named after a config field takes plain values (`seed=[0, 1, 2]`); an axis whose
    values are dicts (`arm=[{"name": "vanilla", "rl.advantage.anchor_weight": 0.0}, ...]`) is a set of
    override groups and its name is only a label. Returns one entry per combination, in the
    format `sweep()` returns.
    """
    if not axes:
        raise SweepError("product() needs at least one axis")
    for axis, values in axes.items():
        if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence) or not values:
            raise SweepError(f"product(): axis {axis!r} must be a non-empty list of values, got {values!r}")
    names = list(axes)
    return [dict(zip(names, combination)) for combination in itertools.product(*(axes[n] for n in names))]


def _render_value(value: Any) -> str:
    """A value as it appears in an arm name: short, and free of the ',' separator."""
    if isinstance(value, (tuple, list)):
        return "+".join(_render_value(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _short_keys(keys: Sequence[str]) -> dict[str, str]:
    """Each dotted key shown by its last part, unless two keys share that last part."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (short if last.count(short) == 1 else k) for k, short in zip(keys, last)}


def render_name(labels: Sequence[str], overrides: Mapping[str, Any], exclude: Sequence[str] = ()) -> str:
    """`label,...,key=value,...` with keys in sorted order (stable whatever the dict order)."""
    keys = [k for k in overrides if k not in exclude]
    short = _short_keys(keys)
    parts = list(labels) + [f"{short[k]}={_render_value(overrides[k])}" for k in sorted(keys, key=short.get)]
    return ",".join(parts)


def safe_name(name: str) -> str:
    """Filesystem-safe and bounded: unsafe characters become '_'; a long name keeps its
    start and gains a hash of the whole name, so distinct names stay distinct."""
    safe = _UNSAFE.sub("_", name) or "base"
    if safe[0] in "._":  # '_' prefixes are the sweep's own directories (e.g. _sft)
        safe = "arm" + safe
    if len(safe) > MAX_NAME_LENGTH:
        digest = hashlib.sha1(name.encode()).hexdigest()[:10]
        safe = f"{safe[:MAX_NAME_LENGTH - 11]}-{digest}"
    return safe


def _flatten_entry(entry: Any, index: int, where: str) -> tuple[list[str], list[tuple[str, Any]], set[str]]:
    """(group labels, raw (key, value) overrides, keys that came from named groups)."""
    if not isinstance(entry, Mapping):
        raise SweepError(f"{where}: arm #{index} is {entry!r}, not a dict of overrides")
    labels, overrides, labelled = [], [], set()
    seen: dict[str, Any] = {}

    def add(key, value, origin):
        if not isinstance(key, str) or not key:
            raise SweepError(f"{where}: arm #{index} has the override key {key!r}; keys are dotted field names")
        if key in seen and seen[key] != value:
            raise SweepError(f"{where}: arm #{index} sets {key!r} twice ({seen[key]!r} and {value!r}, {origin})")
        seen[key] = value
        overrides.append((key, value))

    for key, value in entry.items():
        if isinstance(value, Mapping):
            group = dict(value)
            label = group.pop(NAME_KEY, None)
            if label is not None:
                labels.append(str(label))
            for inner_key, inner_value in group.items():
                if isinstance(inner_value, Mapping):
                    raise SweepError(f"{where}: arm #{index}, group {key!r}: {inner_key!r} holds a dict; "
                                     "groups are one level deep")
                add(inner_key, inner_value, f"group {key!r}")
                if label is not None:
                    labelled.add(inner_key)
        elif key == NAME_KEY:
            raise SweepError(f"{where}: arm #{index} has a top-level {NAME_KEY!r}; to name overrides, nest them: "
                             f"{{'arm': {{'name': {value!r}, 'rl.x': ...}}}}")
        else:
            add(key, value, "top level")
    return labels, overrides, labelled


def _lookup(config, key: str, arm: str):
    """(parent ConfigDict, leaf name) of a dotted key, or SweepError naming arm and field."""
    from ml_collections import ConfigDict

    moved = moved_to(key)
    if moved is not None:
        raise SweepError(f"sweep arm {arm!r}: override {key!r} names a key that moved; it is {moved!r}")
    parts = key.split(".")
    node, path = config, []
    for part in parts[:-1]:
        path.append(part)
        if not isinstance(node, ConfigDict) or part not in node:
            raise SweepError(f"sweep arm {arm!r}: override {key!r} names no config field "
                             f"(no {'.'.join(path)!r})")
        node = node[part]
    if not isinstance(node, ConfigDict) or parts[-1] not in node:
        raise SweepError(f"sweep arm {arm!r}: override {key!r} names no config field")
    if isinstance(node[parts[-1]], ConfigDict):
        raise SweepError(f"sweep arm {arm!r}: override {key!r} names a group of fields, not one field")
    return node, parts[-1]


class _Misfit(ValueError):
    """A value that does not fit a field's type (args: a hint to append, if any)."""


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise _Misfit()


def _as_int(value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _Misfit()
    try:
        return int(value)
    except ValueError:
        raise _Misfit() from None


def _as_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _Misfit()
    try:
        return float(value)
    except ValueError:
        raise _Misfit() from None


def _as_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise _Misfit()


def _as_sequence(value: Any) -> tuple | list:
    """A tuple or list, a string holding a literal one, or a string holding one literal."""
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise _Misfit(": write a tuple such as (4, 64)") from None
        value = value if isinstance(value, (tuple, list)) else (value,)
    if not isinstance(value, (tuple, list)):
        raise _Misfit()
    return value


SCALARS = ((bool, _as_bool), (int, _as_int), (float, _as_float), (str, _as_str))  # bool before int


def coerce(value: Any, current: Any, key: str, arm: str) -> Any:
    """value typed like the config field's current value (bool, int, float, str, tuple; a
    tuple's elements like its current first element)."""
    if current is None:
        return value
    try:
        if isinstance(current, tuple):
            items = _as_sequence(value)
            if current:
                return tuple(coerce(v, current[0], f"{key}[{i}]", arm) for i, v in enumerate(items))
            return tuple(items)
        for kind, convert in SCALARS:
            if isinstance(current, kind):
                return convert(value)
        if isinstance(value, type(current)):
            return value
        raise _Misfit()
    except _Misfit as e:
        raise SweepError(f"sweep arm {arm!r}: {key}={value!r} does not fit the field's type "
                         f"{type(current).__name__} (current value {current!r}){''.join(e.args)}") from None


def apply_overrides(config, overrides: Sequence[tuple[str, Any]], arm: str = "?"):
    """A copy of config with the (already typed) overrides set."""
    config = copy.deepcopy(config)
    for key, value in overrides:
        parent, leaf = _lookup(config, key, arm)
        parent[leaf] = value
    return config


def build_arms(config, entries: Sequence, where: str) -> list[Arm]:
    """Validates every entry against config (fields exist, values fit their types, names are
    unique) and returns the arms. Raises SweepError before anything runs."""
    if isinstance(entries, Mapping) or not isinstance(entries, Sequence) or not entries:
        raise SweepError(f"{where}: sweep() must return a non-empty list of override dicts, got {entries!r}")
    arms, names = [], {}
    for index, entry in enumerate(entries):
        labels, raw, labelled = _flatten_entry(entry, index, where)
        provisional = render_name(labels, {k: v for k, v in raw if k not in labelled}) or f"#{index}"
        typed = []
        for key, value in raw:
            parent, leaf = _lookup(config, key, provisional)
            typed.append((key, coerce(value, parent[leaf], key, provisional)))
        shown = {k: v for k, v in typed if k not in labelled}
        name = safe_name(render_name(labels, shown))
        group = safe_name(render_name(labels, shown, exclude=(SEED_KEY,)))
        if name in names:
            raise SweepError(f"{where}: arms #{names[name]} and #{index} both get the directory name {name!r}; "
                             "give their groups distinct names")
        names[name] = index
        arms.append(Arm(name, group, tuple(typed), tuple(labels)))
    return arms


def sft_key(arm: Arm) -> tuple[tuple[str, Any], ...]:
    """The arm's overrides that shape its cold-start SFT (fields under SHARED_SFT_PREFIXES)."""
    return tuple((k, v) for k, v in arm.overrides if k.startswith(SHARED_SFT_PREFIXES))


def sft_dir_name(key: Sequence[tuple[str, Any]]) -> str:
    """`_sft` for the config's own SFT; `_sft,<overrides>` (`_sft,steps=200`) for another."""
    if not key:
        return SHARED_SFT_DIR
    return SHARED_SFT_DIR + "," + safe_name(render_name((), dict(key)))


def shared_sft_runs(arms: Sequence[Arm], root: str) -> tuple[list[Arm], list[Arm]]:
    """(the SFT runs, the arms starting from their exports). Arms with the same SFT-shaping
    overrides share one SFT run (RL off) in `root/<sft_dir_name>`; every arm keeps its
    overrides (but model.checkpoint and sft.steps) and adds its SFT run's export as
    model.checkpoint with its own SFT off."""
    runs: dict[tuple, Arm] = {}
    out = []
    for arm in arms:
        key = sft_key(arm)
        if key not in runs:
            name = sft_dir_name(key)
            runs[key] = Arm(name, name, key + (("rl.steps", 0),), ("sft only",))
        kept = tuple((k, v) for k, v in arm.overrides if k not in ("model.checkpoint", "sft.steps"))
        out.append(dataclasses.replace(arm, overrides=kept + (
            ("model.checkpoint", os.path.join(root, runs[key].name, "final")), ("sft.steps", 0))))
    return list(runs.values()), out


# ----------------------------------------------------------------------------- config files
def split_config_argument(text: str) -> tuple[str, str | None]:
    """'FILE:ARG' -> (FILE, ARG); 'FILE' -> (FILE, None)."""
    path, sep, arg = text.rpartition(":")
    if not sep or not path.endswith(".py"):
        return text, None
    return path, arg


def load_sweep_entries(path: str, arg: str | None) -> list:
    """Calls the config file's sweep() (with the preset when it takes a parameter)."""
    if not os.path.isfile(path):
        raise SweepError(f"config file {path!r} does not exist")
    module = config_file(path)
    sweep = getattr(module, "sweep", None)
    if not callable(sweep):
        raise SweepError(f"config file {path!r} defines no sweep(); add `def sweep(arg=None)` returning a "
                         "list of override dicts (see paravt_jax/experiments/sweep.py)")
    parameters = [p for p in inspect.signature(sweep).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    # sweep(arg) gets the preset after ':' (None without one); sweep() is a fixed grid.
    return sweep(arg) if parameters else sweep()


def flag_value(value: Any) -> str:
    """A typed value as ml_collections parses it back from `--config.x=...`."""
    if isinstance(value, (tuple, list)):
        return repr(tuple(value))
    if isinstance(value, float):
        return repr(value)
    return str(value)


def run_args(config_argument: str, workdir: str, common: Mapping[str, Any], arm: Arm) -> list[str]:
    """The argv (after `python -m paravt_jax.cli`) that runs this arm on its own. A common
    override that the arm sets too (sft.steps under --shared_sft) is left to the arm."""
    mine = arm.override_dict()
    args = ["run", f"--config={config_argument}", f"--workdir={workdir}"]
    args += [f"--config.{k}={flag_value(v)}" for k, v in common.items() if k not in mine]
    args += [f"--config.{k}={flag_value(v)}" for k, v in arm.overrides]
    return args


# ----------------------------------------------------------------------------- running
def is_finished(workdir: str) -> bool:
    """The sweep's marker, or (for arms launched by hand from --dry_run) a summary.json
    that the main job completed (it writes it last, with the eval table)."""
    if os.path.isfile(os.path.join(workdir, DONE_MARKER)):
        return True
    try:
        with open(os.path.join(workdir, "summary.json")) as f:
            return "eval" in json.load(f)
    except (OSError, ValueError):
        return False


def _record(arm: Arm, config_argument: str, common: Mapping[str, Any], shared: str | None) -> dict:
    return {"name": arm.name, "group": arm.group, "labels": list(arm.labels),
            "overrides": {k: (list(v) if isinstance(v, tuple) else v) for k, v in arm.overrides},
            "config": config_argument, "common_overrides": {k: flag_value(v) for k, v in common.items()},
            "shared_sft": shared}


def _changed(workdir: str, record: dict) -> bool:
    """Whether a finished arm's recorded settings differ from this sweep's (a finished arm is
    kept either way; re-running it is the user's call)."""
    try:
        with open(os.path.join(workdir, ARM_RECORD)) as f:
            return json.load(f) != json.loads(json.dumps(record, default=str))
    except (OSError, ValueError):
        return False


def run_arm(config, arm: Arm, workdir: str, record: dict, run: RunJob) -> dict:
    """Runs one arm's main job (`run(config, workdir)`) in this process and marks it finished."""
    os.makedirs(workdir, exist_ok=True)
    write_json_atomic(os.path.join(workdir, ARM_RECORD), record)
    start = time.perf_counter()
    run(apply_overrides(config, arm.overrides, arm.name), workdir)
    seconds = time.perf_counter() - start
    write_json_atomic(os.path.join(workdir, DONE_MARKER),
                      {"name": arm.name, "seconds": round(seconds, 2), "finished": time.strftime("%Y-%m-%d %H:%M:%S")})
    return {"name": arm.name, "status": "ran", "seconds": round(seconds, 2)}


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """What a sweep will do: the arms (in order) and, with --shared_sft, the SFT runs first."""
    config_argument: str
    root: str
    common: tuple[tuple[str, Any], ...]
    arms: tuple[Arm, ...]
    shared_sfts: tuple[Arm, ...] = ()  # --shared_sft: the SFT runs, before any arm

    def shared_dir(self, arm: Arm) -> str | None:
        """The SFT run an arm starts from (None without --shared_sft, and for the SFT runs)."""
        if arm in self.shared_sfts or not self.shared_sfts:
            return None
        return os.path.dirname(arm.override_dict()["model.checkpoint"])

    def runs(self) -> list[Arm]:
        return list(self.shared_sfts) + list(self.arms)


def make_plan(config, config_argument: str, root: str, common: Mapping[str, Any], shared_sft: bool = False,
              only: str = "") -> SweepPlan:
    path, arg = split_config_argument(config_argument)
    arms = build_arms(config, load_sweep_entries(path, arg), f"{path}: sweep()")
    if only:
        pattern = re.compile(only)
        arms = [a for a in arms if pattern.search(a.name)]
        if not arms:
            raise SweepError(f"--only={only!r} selects none of the arms of {path}")
    for arm in arms:
        clash = sorted(set(common) & set(arm.override_dict()))
        if clash:
            raise SweepError(f"--config.{clash[0]} is given on the command line, and arm {arm.name!r} of "
                             f"{path} sets it too; drop one of them")
    # an SFT run's overrides are its arms' SFT fields (checked against `common` above) and
    # rl.steps=0, which wins over a command-line rl.steps (run_args)
    sft_runs, arms = shared_sft_runs(arms, root) if shared_sft else ([], arms)
    return SweepPlan(config_argument, root, tuple(common.items()), tuple(arms), tuple(sft_runs))


def commands(plan: SweepPlan, config_changed: str = "refuse") -> list[str]:
    """One shell command per run; the shared SFT runs (if any) come first and must finish
    before the others start. `config_changed="ok"` adds `--config_changed=ok` to each."""
    extra = ["--config_changed=ok"] if config_changed == "ok" else []
    return [shlex.join(["python", "-m", "paravt_jax.cli",
                        *run_args(plan.config_argument, os.path.join(plan.root, arm.name), dict(plan.common), arm),
                        *extra])
            for arm in plan.runs()]


def run_plan(config, plan: SweepPlan, run: RunJob, write_report: bool = True) -> list[dict]:
    """Runs the plan's arms one after another through `run` (the main job: the application
    layer passes `paravt_jax.cli.jobs.run_command`), skipping finished ones. A failing arm is
    recorded and the others still run; SweepError at the end names the failures."""
    os.makedirs(plan.root, exist_ok=True)
    common = dict(plan.common)
    write_json_atomic(os.path.join(plan.root, PLAN_FILE), {
        "config": plan.config_argument, "common_overrides": {k: flag_value(v) for k, v in common.items()},
        "shared_sft": [a.name for a in plan.shared_sfts] or None,
        "arms": [{"name": a.name, "group": a.group} for a in plan.arms]})
    statuses = []
    runs = plan.runs()
    for number, arm in enumerate(runs, 1):
        workdir = os.path.join(plan.root, arm.name)
        record = _record(arm, plan.config_argument, common, plan.shared_dir(arm))
        if is_finished(workdir):
            logging.info(f"[sweep] {number}/{len(runs)} {arm.name}: finished before, skipped")
            if _changed(workdir, record):
                logging.warning(f"[sweep] {workdir} ran with other settings than this sweep's "
                                f"(see {ARM_RECORD}); delete it to run the arm again")
            statuses.append({"name": arm.name, "status": "skipped"})
            continue
        logging.info(f"[sweep] {number}/{len(runs)} {arm.name}: "
                     + " ".join(f"{k}={flag_value(v)}" for k, v in arm.overrides))
        try:
            statuses.append(run_arm(config, arm, workdir, record, run))
        except Exception as e:  # noqa: BLE001 - one arm's failure must not lose the others
            if arm in plan.shared_sfts:
                raise
            with open(os.path.join(workdir, "sweep_error.txt"), "w") as f:
                f.write(traceback.format_exc())
            logging.error(f"[sweep] {arm.name} FAILED: {type(e).__name__}: {e} "
                          f"(traceback in {workdir}/sweep_error.txt)")
            statuses.append({"name": arm.name, "status": "failed", "error": f"{type(e).__name__}: {e}"})
    for s in statuses:
        logging.info(f"[sweep] {s['status']:>7}  {s['name']}" + (f"  ({s['seconds']:.0f} s)" if "seconds" in s else ""))
    if write_report:
        report.write_report([plan.root], os.path.join(plan.root, "report"))
    failed = [s["name"] for s in statuses if s["status"] == "failed"]
    if failed:
        raise SweepError(f"sweep {plan.root}: {len(failed)} arm(s) failed: {', '.join(failed)}")
    return statuses
