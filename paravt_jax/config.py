"""Config files and config sections.

A config section has the shape of the dataclass it configures (`section(RLConfig())` makes
one from the defaults; `build(RLConfig, config.rl, "rl")` turns it back, refusing keys that
are not fields), so that every field is a `--config.a.b=value` override.

Validation lives on the dataclasses: a field made with `checked(default, rule)` names the
values it allows, the dataclass's `__post_init__` calls `validate(self)` (and raises `refuse(...)`
for checks across its fields), and `build` prefixes every problem with the section's dotted
path (`rl.rollout.max_turns=-1: must be an integer >= 0`). A config section is thus refused
with every bad value named before any work starts (run_config.build_run builds them all).
A field made with `subsection(default, {name: what sets it})` leaves those fields of its nested
dataclass out of the subsection (the evaluation driver's prompt format leaves out the system
text its prompt mode decides); a key given one level above its dataclass is refused with its
place (`rl.rollout.think_prefix: ...; it is rl.rollout.prompt.think_prefix`). A field made with
`entries(default, types)` holds named entries whose `type` key picks the dataclass of the rest
(big_vision's evaluations: `rl.evals.<name>.type`); a key that moved (MOVED_KEYS) is refused
with its new place.

The config files ship with the package as `paravt_jax.configs` (the repository's configs/
folder; `from paravt_jax.configs import paragrpo`). `--config=FILE.py:ARG` names a config file by
path, as ml_collections does: `configs/paragrpo.py` in the repository, or `config_path("paragrpo")`
(the shipped one, found from any directory). `config_file(path)` is the one place that turns such
a path into its module (a file of the package is imported as `paravt_jax.configs.FILE`, a file
elsewhere is loaded from its path).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections
from ml_collections import config_dict

from paravt_jax import configs as shipped_configs


def configs_dir() -> str:
    """The folder of the shipped config files (the checkout's configs/ in a source checkout)."""
    return os.path.realpath(shipped_configs.__path__[0])


def config_path(name: str) -> str:
    """The path of the shipped config file NAME.py (what `--config=` takes)."""
    return os.path.join(configs_dir(), f"{name}.py")


def config_file(path: str) -> types.ModuleType:
    """The module of a config file given by path (a shipped config file or any other file)."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file {path!r} does not exist")
    directory, filename = os.path.split(os.path.realpath(path))
    if directory == configs_dir():
        return importlib.import_module(f"{shipped_configs.__name__}.{os.path.splitext(filename)[0]}")
    name = "paravt_config_" + os.path.splitext(filename)[0] + f"_{abs(hash(path)):x}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- validation
class ConfigValueError(ValueError):
    """Config values a command refuses before any work starts; the message names each field
    and what it allows. `problems` holds one `Problem` per bad field (empty when the error is
    about no one field, e.g. an output directory of another evaluation)."""

    def __init__(self, message: str = "", problems: Sequence[Problem] = ()):
        self.problems = tuple(problems)
        super().__init__(message or describe(self.problems))

    def within(self, where: str) -> ConfigValueError:
        """The same problems, their fields under the section `where` (`max_turns` ->
        `rl.rollout.max_turns`); a message about no one field is put under `where` itself."""
        return ConfigValueError(problems=[p.within(where) for p in self.problems] or [Problem(where, f": {self}")])


@dataclasses.dataclass(frozen=True)
class Problem:
    """One refused value: `field` (a dotted path) and what is wrong (`detail`, after the
    field: "=0: must be an integer >= 1", or ": <a dataclass's own message>")."""
    field: str
    detail: str

    def within(self, where: str) -> Problem:
        return Problem(f"{where}.{self.field}" if self.field else where, self.detail)

    def __str__(self) -> str:
        return f"{self.field}{self.detail}"


def describe(problems: Sequence[Problem]) -> str:
    if len(problems) == 1:
        return f"invalid config value: {problems[0]}"
    return "invalid config values:\n  " + "\n  ".join(str(p) for p in problems)


def refuse(field: str, value, reason: str) -> ConfigValueError:
    """The error of one field whose value breaks a check across fields (raise it)."""
    return ConfigValueError(problems=[Problem(field, f"={value!r}: {reason}")])


@dataclasses.dataclass(frozen=True)
class Rule:
    """The values a field allows: `allowed` is shown to the user ("an integer >= 1")."""
    allowed: str
    check: Callable[[Any], bool]


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(low: int) -> Rule:
    return Rule(f"an integer >= {low}", lambda v: _integer(v) and v >= low)


def integer_between(low: int, high: int) -> Rule:
    return Rule(f"an integer in [{low}, {high}]", lambda v: _integer(v) and low <= v <= high)


def positive() -> Rule:
    return Rule("a finite number > 0", lambda v: _number(v) and v > 0)


def non_negative() -> Rule:
    return Rule("a finite number >= 0", lambda v: _number(v) and v >= 0)


def share() -> Rule:
    return Rule("a number in [0, 1]", lambda v: _number(v) and 0 <= v <= 1)


def one_of(choices) -> Rule:
    choices = tuple(choices)
    return Rule(f"one of {choices}", lambda v: v in choices)


def integers(low: int, empty: bool = False) -> Rule:
    """A list of integers >= low; `empty` allows an empty list (e.g. no evaluation setting)."""
    kind = "a list" if empty else "a non-empty list"
    return Rule(f"{kind} of integers >= {low}",
                lambda v: isinstance(v, (list, tuple)) and (empty or len(v) > 0) and all(_integer(x) and x >= low
                                                                                         for x in v))


def strings() -> Rule:
    """A list of non-empty strings (may be empty)."""
    return Rule("a list of non-empty strings",
                lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, str) and x for x in v))


def optional(rule: Rule) -> Rule:
    """`rule`, or None (unset)."""
    return Rule(f"{rule.allowed}, or None", lambda v: v is None or rule.check(v))


RULE = "rule"


def checked(default, rule: Rule, **field_options):
    """A dataclass field whose values `rule` allows (checked by `validate`)."""
    return dataclasses.field(default=default, metadata={RULE: rule}, **field_options)


def rule_problems(cls, values: dict) -> list[Problem]:
    """The problems of `values` (field name -> value) under the rules of `cls`'s fields."""
    problems = []
    for field in dataclasses.fields(cls):
        rule = field.metadata.get(RULE)
        if rule is not None and field.name in values and not rule.check(values[field.name]):
            problems.append(Problem(field.name, f"={values[field.name]!r}: must be {rule.allowed}"))
    return problems


def validate(instance) -> None:
    """Raises ConfigValueError naming every field of the dataclass `instance` outside its rule
    (call it first in `__post_init__`)."""
    problems = rule_problems(type(instance), {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)})
    if problems:
        raise ConfigValueError(problems=problems)


# ----------------------------------------------------------------------------- sections
# A dataclass field whose metadata has SET_BY is not a key of its config section: the
# metadata names where its value comes from (another key, or the code that fills it).
SET_BY = "set_by"


def set_by(default, where: str, rule: Rule | None = None):
    """A dataclass field that config sections leave out; `where` says what sets it (and
    `rule`, if given, which values it allows, as `checked`)."""
    return dataclasses.field(default=default, metadata={SET_BY: where, **({RULE: rule} if rule else {})})


# A nested-dataclass field whose metadata has SET_INSIDE leaves some of that dataclass's fields
# out of its subsection: the metadata maps each to what sets it (the evaluation driver's prompt
# mode sets its prompt format's system text).
SET_INSIDE = "set_inside"


def subsection(default, set_by: dict[str, str]):
    """A field holding the dataclass `default` whose config subsection leaves out the fields
    named in `set_by` (name -> what sets it), as `set_by` leaves out a whole field."""
    return dataclasses.field(default=default, metadata={SET_INSIDE: dict(set_by)})


def _left_out(field: dataclasses.Field) -> dict[str, str]:
    return field.metadata.get(SET_INSIDE, {})


# A field whose metadata has TYPES holds named entries, each a dataclass chosen by the entry's
# `type` key (big_vision's evaluations): its config section maps each name to a subsection
# holding `type` beside the fields of that type's dataclass.
TYPES = "types"
TYPE_KEY = "type"


def entries(default: dict, types: dict[str, type]):
    """A field holding the mapping `default` (name -> an instance of one of `types`' classes),
    whose config section is the mapping `entries_section` makes and `build` turns back."""
    return dataclasses.field(default_factory=lambda: dict(default), metadata={TYPES: dict(types)})


def type_name(types: dict[str, type], entry) -> str:
    """The name under which `entry`'s class is one of `types`."""
    for name, cls in types.items():
        if type(entry) is cls:
            return name
    raise TypeError(f"{type(entry).__name__} is none of the types {', '.join(types)}")


def entries_section(value: dict, types: dict[str, type]) -> ml_collections.ConfigDict:
    """The config section of named entries: name -> {type: its type name, its fields...}."""
    out = ml_collections.ConfigDict()
    for name, entry in value.items():
        out[name] = section(entry, first={TYPE_KEY: type_name(types, entry)})
    return out


def build_entries(types: dict[str, type], config, where: str) -> dict:
    """The entries of a config section made by `entries_section` (name -> the dataclass its
    `type` names, built from the entry's other keys); refused with one ConfigValueError naming
    every problem under its dotted path (`rl.evals.eval.type='x': must be one of (...)`,
    `rl.evals.eval.limit=-1: ...`)."""
    out, problems = {}, []
    for name in config.keys():
        entry = config[name]
        if not hasattr(entry, "keys"):
            problems.append(Problem(f"{where}.{name}", f"={entry!r}: must be a section with a {TYPE_KEY!r} key "
                                    f"(one of {tuple(types)}) and that type's fields"))
            continue
        kind = entry[TYPE_KEY] if TYPE_KEY in entry else None
        if kind not in types:
            problems.append(Problem(f"{where}.{name}.{TYPE_KEY}", f"={kind!r}: must be one of {tuple(types)}"))
            continue
        try:
            out[name] = _build(types[kind], {key: entry[key] for key in entry.keys() if key != TYPE_KEY},
                               f"{where}.{name}", {}, {}, {})
        except ConfigValueError as e:  # named under where.name already
            problems += e.problems
    if problems:
        raise ConfigValueError(problems=problems)
    return out


# Config keys that moved: the old dotted path -> the new one (a key under an old path moves
# with it: `eval.limit` -> `evals.held_out.limit`). An old key is refused naming its new place.
MOVED_KEYS = {
    "rl.eval_nframes": "rl.evals.eval.nframes",
    "rl.eval_limit": "rl.evals.eval.limit",
    "eval": "evals.held_out",
}


def moved_to(path: str) -> str | None:
    """The new place of the config key `path` if it (or a section above it) moved, else None."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        old = ".".join(parts[:end])
        if old in MOVED_KEYS:
            return ".".join([MOVED_KEYS[old], *parts[end:]])
    return None


def _optional(hint) -> type | None:
    """T for `T | None` (or Optional[T]); None otherwise."""
    args = typing.get_args(hint)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return typing.get_origin(rest[0]) or rest[0] if len(rest) == 1 else None
    return None


def section(instance, left_out: Sequence[str] = (), first: dict | None = None) -> ml_collections.ConfigDict:
    """The config section shaped like the dataclass `instance`: one key per field (the
    instance's values as defaults), a nested dataclass as a subsection, a field that may be
    None as a typed placeholder (so that `--config.x.y=value` can set it). Fields marked
    `set_by`, and those named in `left_out` (a `subsection`'s), are left out; `first`'s keys
    come before the fields (an entry's `type`)."""
    hints = typing.get_type_hints(type(instance))
    out = ml_collections.ConfigDict(first or {})
    for field in dataclasses.fields(instance):
        if SET_BY in field.metadata or field.name in left_out:
            continue
        value = getattr(instance, field.name)
        if TYPES in field.metadata:
            out[field.name] = entries_section(value, field.metadata[TYPES])
        elif dataclasses.is_dataclass(value):
            out[field.name] = section(value, tuple(_left_out(field)))
        elif value is None:
            out[field.name] = config_dict.placeholder(_optional(hints[field.name]))
        else:
            out[field.name] = value
    return out


def build(cls, config, where: str, **given):
    """`cls(...)` from a config section shaped like it (see `section`): each key sets the
    field of that name, a subsection builds a nested dataclass; `given` sets fields the
    section does not hold (the run's seed). Refused with one ConfigValueError naming each under
    its dotted path (`where` is the section's): every key that is not a field of `cls` or names
    a field set by the code, and every value a field's rule or the dataclass's own checks
    refuse (the nested sections' too)."""
    return _build(cls, config, where, given, {}, {})


def _build(cls, config, where: str, given: dict, left_out: dict[str, str], unset: dict):
    """`build`, with `left_out` (field -> what sets it) the fields a `subsection` leaves out and
    `unset` the values of the fields the section does not hold (a subsection's default's)."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    keys = list(config.keys())
    setters = {**{name: "the caller" for name in given},
               **{name: f.metadata[SET_BY] for name, f in fields.items() if SET_BY in f.metadata}, **left_out}
    settable = [name for name in fields if name not in setters]
    problems = [_not_a_field(cls, settable, hints, fields, key, where) for key in keys if key not in fields]
    problems += [Problem(f"{where}.{key}", f": {cls.__name__}.{key} is set by the code ({setters[key]}), not by "
                         "the config") for key in keys if key in fields and key in setters]
    values = {**unset, **given}
    for key in keys:
        if key not in fields or key in setters:
            continue
        value = config[key]
        if TYPES in fields[key].metadata:
            try:
                value = build_entries(fields[key].metadata[TYPES], value, f"{where}.{key}")
            except ConfigValueError as e:
                problems += e.problems
                continue
        elif isinstance(value, ml_collections.ConfigDict):
            nested = typing.get_origin(hints[key]) or hints[key]
            if not (isinstance(nested, type) and dataclasses.is_dataclass(nested)):
                problems.append(Problem(f"{where}.{key}", f": {cls.__name__}.{key} is a value, not a section"))
                continue
            try:
                value = _build(nested, value, f"{where}.{key}", {}, _left_out(fields[key]), _unset(fields[key], value))
            except ConfigValueError as e:  # its problems are named under where.key already
                problems += e.problems
                continue
        elif isinstance(value, list) and isinstance(fields[key].default, tuple):
            value = tuple(value)
        values[key] = value
    problems += [p.within(where) for p in rule_problems(cls, values)]
    if problems:
        raise ConfigValueError(problems=problems)
    try:
        return cls(**values)
    except ConfigValueError as e:
        raise e.within(where) from None
    except ValueError as e:  # a check of a dataclass that names no field
        raise ConfigValueError(problems=[Problem(where, f": {e}")]) from None


def _unset(field: dataclasses.Field, config) -> dict:
    """The values of the nested dataclass's fields the subsection `config` does not set: its
    default's (`driver.prompt` without a key keeps the preset's value, not the class's)."""
    default = field.default
    if not dataclasses.is_dataclass(default):
        return {}
    return {f.name: getattr(default, f.name) for f in dataclasses.fields(default)
            if f.name not in config and SET_BY not in f.metadata}


def _not_a_field(cls, settable: list[str], hints: dict, fields: dict, key: str, where: str) -> Problem:
    """The problem of a key that is no field of `cls`: where it moved (MOVED_KEYS), else the
    fields and, for a field of a nested dataclass, its place there."""
    new = moved_to(f"{where}.{key}")
    if new:
        return Problem(f"{where}.{key}", f": moved; it is {new}")
    return Problem(f"{where}.{key}", f": not a field of {cls.__name__} (its fields: {', '.join(settable)})"
                   + _moved(hints, fields, key, where))


def _moved(hints: dict, fields: dict, key: str, where: str) -> str:
    """"; it is WHERE.SUB.KEY" when `key` is a field of one of the nested dataclasses (a key of
    a config written before that subsection)."""
    for name in (name for name, field in fields.items() if SET_BY not in field.metadata):
        kind = typing.get_origin(hints[name]) or hints[name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind) and key in {f.name for f in
                                                                               dataclasses.fields(kind)}:
            return f"; it is {where}.{name}.{key}"
    return ""


def fields_and_keys(cls, where: str, left_out: dict[str, str] | None = None) -> list[tuple[str, str | None, str]]:
    """(field "Class.name", its config key or None, where a key-less field is set) for every
    field of `cls` and of its nested dataclasses, and of the default entries of its `entries`
    fields (the check that every knob is reachable)."""
    out = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        name = f"{cls.__name__}.{field.name}"
        if SET_BY in field.metadata or field.name in (left_out or {}):
            out.append((name, None, field.metadata.get(SET_BY) or left_out[field.name]))
            continue
        kind = typing.get_origin(hints[field.name]) or hints[field.name]
        if TYPES in field.metadata:  # the fields of each default entry, under its name
            for entry_name, entry in field.default_factory().items():
                out += fields_and_keys(type(entry), f"{where}.{field.name}.{entry_name}")
        elif isinstance(kind, type) and dataclasses.is_dataclass(kind):
            out += fields_and_keys(kind, f"{where}.{field.name}", _left_out(field))
        else:
            out.append((name, f"{where}.{field.name}", ""))
    return out
