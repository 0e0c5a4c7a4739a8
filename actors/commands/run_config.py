"""``kfoundry run --config FILE``: any ``run`` option from a TOML file, the command line's over it.

The file names options as the command line does, without the dashes (``eval-timeout`` or
``eval_timeout``), at its top level or in a ``[run]`` table::

    islands = 4
    seconds = 900
    experts = "template,llm"
    precision = "exact"
    no-migration = true
    seed-candidate = ["seeds/a.py", "seeds/b.py"]

Every value goes through the option's own parsing (its type and choices), so a wrong one is the
same one-line error as on the command line, naming the file. A flag given on the command line
wins over the file. Paths in the file are relative to the file's folder. The task stays on the
command line.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

from actors.runtime.errors import ConfigError


def apply_config(parser: argparse.ArgumentParser, argv: list[str], args: argparse.Namespace) -> None:
    """Set on ``args`` every option ``args.config`` names (none without a file) that ``argv`` (the
    subcommand's own arguments) does not give; raises :class:`ConfigError` for a file that cannot be read, an
    unknown option or a value the option refuses."""
    path: Path | None = args.config
    if path is None:
        return
    values = _load(path)
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest not in ("help", "config")}
    given = _given(parser, argv)
    for key, value in values.items():
        dest = key.replace("-", "_")
        action = actions.get(dest)
        if action is None:
            known = ", ".join(sorted(d.replace("_", "-") for d in actions))
            raise ConfigError(f"--config {path}: {key!r} is not a `kfoundry run` option (options: {known})")
        if dest in given:
            continue  # the command line's flag wins
        setattr(args, dest, _value(path, key, action, value))


def _load(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc.strerror or exc})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: not a TOML file ({exc})") from None
    table = data.pop("run", {})
    if not isinstance(table, dict):
        raise ConfigError(f"--config {path}: 'run' must be a table ([run]), not a {type(table).__name__}")
    top = {k.replace("-", "_") for k in data}
    for key in table:
        if key.replace("-", "_") in top:
            raise ConfigError(f"--config {path}: {key!r} is set both at the top level and in [run]")
    merged = {**data, **table}
    for key in merged:
        if isinstance(merged[key], dict):
            raise ConfigError(f"--config {path}: [{key}] is not a section this file may have (only [run])")
    return merged


def _given(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The destinations of the options ``argv`` gives (parsed once more with no defaults)."""
    saved = [(a, a.default) for a in parser._actions]
    try:
        for action, _ in saved:
            action.default = argparse.SUPPRESS
        namespace, _ = parser.parse_known_args(argv)
    finally:
        for action, default in saved:
            action.default = default
    return set(vars(namespace))


def _value(path: Path, key: str, action: argparse.Action, value: Any) -> Any:
    """``value`` as the option would have parsed it from the command line."""
    where = f"--config {path}: {key} = {value!r}"
    if isinstance(action, argparse._StoreConstAction):  # store_true / store_false
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: a switch takes true or false")
        return action.const if value else action.default
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [_one(path, where, action, item) for item in items]
    if isinstance(value, list | dict):
        raise ConfigError(f"{where}: one value, not a {type(value).__name__}")
    return _one(path, where, action, value)


def _one(path: Path, where: str, action: argparse.Action, value: Any) -> Any:
    if isinstance(value, bool):  # TOML's true/false where a number or a word is wanted
        raise ConfigError(f"{where}: {action.option_strings[-1]} takes a value, not true or false")
    text = str(value)
    kind = action.type
    try:
        parsed = kind(text) if callable(kind) else text
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        name = getattr(kind, "__name__", "value")
        raise ConfigError(f"{where}: not a valid {name} ({exc})") from None
    if action.choices is not None and parsed not in action.choices:
        raise ConfigError(f"{where}: choose one of {', '.join(map(str, action.choices))}")
    if isinstance(parsed, Path) and not parsed.is_absolute():
        parsed = path.parent / parsed  # relative to the file, not to where kfoundry runs
    return parsed
