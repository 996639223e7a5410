"""Config files and config sections.

A config section has the shape of the dataclass it configures (`section(RLConfig())` makes
one from the defaults; `build(RLConfig, config.rl, "rl")` turns it back, refusing keys that
are not fields), so that every field is a `--config.a.b=value` override.

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
import os
import types
import typing

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


# ----------------------------------------------------------------------------- sections
# A dataclass field whose metadata has SET_BY is not a key of its config section: the
# metadata names where its value comes from (another key, or the code that fills it).
SET_BY = "set_by"


def set_by(default, where: str):
    """A dataclass field that config sections leave out; `where` says what sets it."""
    return dataclasses.field(default=default, metadata={SET_BY: where})


def _optional(hint) -> type | None:
    """T for `T | None` (or Optional[T]); None otherwise."""
    args = typing.get_args(hint)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return typing.get_origin(rest[0]) or rest[0] if len(rest) == 1 else None
    return None


def section(instance) -> ml_collections.ConfigDict:
    """The config section shaped like the dataclass `instance`: one key per field (the
    instance's values as defaults), a nested dataclass as a subsection, a field that may be
    None as a typed placeholder (so that `--config.x.y=value` can set it). Fields marked
    `set_by` are left out."""
    hints = typing.get_type_hints(type(instance))
    out = ml_collections.ConfigDict()
    for field in dataclasses.fields(instance):
        if SET_BY in field.metadata:
            continue
        value = getattr(instance, field.name)
        if dataclasses.is_dataclass(value):
            out[field.name] = section(value)
        elif value is None:
            out[field.name] = config_dict.placeholder(_optional(hints[field.name]))
        else:
            out[field.name] = value
    return out


def build(cls, config, where: str, **given):
    """`cls(...)` from a config section shaped like it (see `section`): each key sets the
    field of that name, a subsection builds a nested dataclass; `given` sets fields the
    section does not hold (the run's seed). A key that is not a field of `cls` is an error
    naming it (`where` is the section's dotted path)."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    keys = list(config.keys())
    unknown = [k for k in keys if k not in fields]
    if unknown:
        raise ValueError(f"config key {where}.{unknown[0]}: not a field of {cls.__name__} "
                         f"(its fields: {', '.join(f for f in fields if SET_BY not in fields[f].metadata)})")
    both = sorted(set(keys) & set(given))
    if both:
        raise ValueError(f"config key {where}.{both[0]}: {cls.__name__}.{both[0]} is set by the code "
                         f"({fields[both[0]].metadata.get(SET_BY, 'the caller')}), not by the config")
    values = dict(given)
    for key in keys:
        value = config[key]
        if isinstance(value, ml_collections.ConfigDict):
            nested = typing.get_origin(hints[key]) or hints[key]
            if not (isinstance(nested, type) and dataclasses.is_dataclass(nested)):
                raise ValueError(f"config key {where}.{key}: {cls.__name__}.{key} is a value, not a section")
            value = build(nested, value, f"{where}.{key}")
        elif isinstance(value, list) and isinstance(fields[key].default, tuple):
            value = tuple(value)
        values[key] = value
    return cls(**values)


def fields_and_keys(cls, where: str) -> list[tuple[str, str | None, str]]:
    """(field "Class.name", its config key or None, where a key-less field is set) for every
    field of `cls` and of its nested dataclasses (the check that every knob is reachable)."""
    out = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        name = f"{cls.__name__}.{field.name}"
        if SET_BY in field.metadata:
            out.append((name, None, field.metadata[SET_BY]))
            continue
        kind = typing.get_origin(hints[field.name]) or hints[field.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            out += fields_and_keys(kind, f"{where}.{field.name}")
        else:
            out.append((name, f"{where}.{field.name}", ""))
    return out
