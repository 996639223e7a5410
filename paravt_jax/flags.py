"""Command-line plumbing shared by every `paravt-jax` command: `--help`, usage errors, exit
statuses. Each command defines its absl flags on its own FlagValues and parses them with
`parse_flags`, which prints the command's help for --help / -h and turns a bad flag into a
`UsageError` (exit status 2) that names it."""
from __future__ import annotations

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
    """The error's message without the traceback ml_collections embeds in a config-file error
    (its first line, then the exception's own last line)."""
    text = str(error).strip().strip("'\"")
    if "Traceback (most recent call last)" not in text:
        return text
    lines = [line for line in text.splitlines() if line.strip()]
    return f"{lines[0].rstrip(':')}: {lines[-1].strip()}"


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
    from absl import flags

    help_requested = wants_help(argv)
    try:
        values(without_help(argv) if help_requested else list(argv))
    # config files and --config.FIELD overrides fail with these: an unknown preset (ValueError),
    # an unknown field (AttributeError / KeyError), a value of the wrong type (TypeError)
    except (flags.Error, AttributeError, KeyError, ValueError, TypeError) as e:
        if not help_requested:
            raise UsageError(short_message(e)) from None
    if not help_requested:
        return
    text = [usage.strip(), "", "flags:", flag_help(values)]
    if show_config and "config" in values and values["config"].value is not None:
        text += ["", "config fields (set any with --config.FIELD=VALUE; another file's with "
                 "--config=FILE[:ARG] --help):"]
        text += ["  " + line for line in config_fields(values.config)]
    print("\n".join(text), flush=True)
    raise HelpShown()
