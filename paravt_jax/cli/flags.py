"""Command-line plumbing shared by every `paravt-jax` command: `--help`, usage errors, exit
statuses. Each command defines its absl flags on its own FlagValues and parses them with
`parse_flags`, which prints the command's help for --help / -h and turns a bad flag into a
`UsageError` (exit status 2) that names it."""
from __future__ import annotations

import os
from collections.abc import Sequence

HELP_FLAGS = ("--help", "-h", "-help", "--helpfull", "--helpshort")

EXIT_OK = 0
EXIT_ERROR = 1  # the command failed (a traceback or a message says why)
EXIT_USAGE = 2  # a bad command line or config value, refused before any work


class UsageError(ValueError):
    """A bad command line: unknown command or flag, or a flag value out of range."""


class HelpShown(Exception):
    """--help was given and the help was printed: the command stops with status 0."""


def short_message(error: Exception) -> str:
    """The error's message on one line: without the traceback ml_collections embeds in a
    config-file error (its first line, then the exception's own last line), without the quotes
    and escapes of a KeyError's repr."""
    text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    text = str(text).strip()
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    if "Traceback (most recent call last)" in text:
        lines = [line for line in text.splitlines() if line.strip()]
        text = f"{lines[0].rstrip(':')}: {lines[-1].strip()}"
    return " ".join(text.split())


def edit_distance(a: str, b: str) -> int:
    """Damerau-Levenshtein distance (adjacent transpositions count once)."""
    previous2, previous = None, list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            cost = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y))
            if previous2 is not None and i > 1 and j > 1 and x == b[j - 2] and a[i - 2] == y:
                cost = min(cost, previous2[j - 2] + 1)
            current.append(cost)
        previous2, previous = previous, current
    return previous[-1]


def closest(word: str, choices) -> str | None:
    """The choice a typo most likely meant: the fewest edits (at most a third of the word, and at
    least one allowed), ties to the one of the same length (`stepz` -> `steps`, not `step`)."""
    ranked = sorted((edit_distance(word, c), len(c) != len(word), c) for c in choices)
    if ranked and ranked[0][0] <= max(1, len(word) // 3):
        return ranked[0][2]
    return None


def override_paths(argv: Sequence[str]) -> list[str]:
    """The dotted field paths of argv's `--config.FIELD=VALUE` (or `--config.FIELD VALUE`) overrides."""
    prefix = "--config."
    return [a[len(prefix):].split("=", 1)[0] for a in argv if a.startswith(prefix)]


def unknown_field(config, path: str) -> str | None:
    """A one-line message if `path` names no field of `config` (with the closest field), else None."""
    from paravt_jax.config import moved_to

    node, done = config, []
    for part in path.split("."):
        keys = list(node.keys()) if hasattr(node, "keys") else []
        if part not in keys:
            if moved_to(path):
                return f"--config.{path}: moved; it is --config.{moved_to(path)}"
            where = ".".join(done)
            hint = closest(part, keys)
            message = f"--config.{path}: {'the config' if not where else where!r} has no field {part!r}"
            if hint:
                message += f"; did you mean --config.{'.'.join([*done, hint])}?"
            return message
        node, done = node[part], [*done, part]
    return None


def config_error(argv: Sequence[str], error: Exception, default: str | None = None) -> str:
    """One line saying what is wrong with argv's --config file (else `default`, FILE[:ARG]) or
    its --config.* overrides, for an error ml_collections raised loading or overriding it."""
    from paravt_jax.config import config_file

    given = [a[len("--config="):] for a in argv if a.startswith("--config=")]
    argument = given[-1] if given else default
    if argument:
        path, _, arg = argument.partition(":")
        if not os.path.isfile(path):
            return f"--config={argument}: config file {path!r} does not exist"
        try:
            config = config_file(path).get_config(*([arg] if arg else []))
        except Exception as e:  # noqa: BLE001 - any failure of the user's config file is reported
            return f"--config={argument}: {short_message(e)}"
        for field in override_paths(argv):
            message = unknown_field(config, field)
            if message:
                return message
    return short_message(error)


def define_config(values, default: str | None, argv: Sequence[str], help_text: str = "config file[:arg]") -> None:
    """DEFINE_config_file on `values` for argv (whose --config.* overrides it registers); a
    missing or broken config file, or an override of no field, is a UsageError of one line."""
    from ml_collections import config_flags

    try:
        config_flags.DEFINE_config_file("config", default, help_text, flag_values=values, sys_argv=list(argv))
    except Exception as e:  # noqa: BLE001 - ml_collections raises many kinds; each is a bad command line
        raise UsageError(config_error(argv, e, default)) from None


def wants_help(argv: Sequence[str]) -> bool:
    return any(a in HELP_FLAGS for a in argv[1:])


def without_help(argv: Sequence[str]) -> list[str]:
    return [a for a in argv if a not in HELP_FLAGS]


def config_fields(config, prefix: str = "") -> list[str]:
    """`field = value` lines of a (nested) ml_collections config, in definition order."""
    lines = []
    for key, value in config.items():
        if hasattr(value, "items"):
            lines += config_fields(value, f"{prefix}{key}.")
        else:
            lines.append(f"{prefix}{key} = {value!r}")
    return lines


def flag_help(values) -> str:
    """The flags defined on `values`, one block per flag (absl's own formatting)."""
    lines = values.get_help(include_special_flags=False).splitlines()
    return "\n".join(line for line in lines if line.startswith(" "))  # not absl's per-module headers


def parse_flags(values, argv: Sequence[str], usage: str, show_config: bool = False) -> None:
    """Parses argv into `values`. With a help flag: prints `usage`, the flags and (show_config)
    every field of the parsed config with its value, then raises HelpShown."""

    help_requested = wants_help(argv)
    problem = None
    try:
        values(without_help(argv) if help_requested else list(argv))
        config = values["config"].value if "config" in values else None
        if config is not None:
            config.keys()  # ml_collections defers a config file's load error to the first read
    # flags and config files fail with many kinds: a bad flag (flags.Error), a missing file
    # (OSError), an unknown preset (ValueError), an unknown field (AttributeError / KeyError), a
    # value of the wrong type (TypeError), or whatever the config file's own code raises
    except Exception as e:  # noqa: BLE001
        default = (values["config"].default_as_str or "").strip("'\"") if "config" in values else None
        problem = config_error(argv, e, default)
        if not help_requested:
            raise UsageError(problem) from None
    if not help_requested:
        return
    text = [usage.strip(), "", "flags:", flag_help(values)]
    if show_config and problem:
        text += ["", f"config fields: not shown ({problem})"]
    elif show_config and "config" in values and values["config"].value is not None:
        text += ["", "config fields (set any with --config.FIELD=VALUE; another file's with "
                 "--config=FILE[:ARG] --help):"]
        text += ["  " + line for line in config_fields(values.config)]
    print("\n".join(text), flush=True)
    raise HelpShown()
