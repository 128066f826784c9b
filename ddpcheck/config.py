"""Option defaults from ``[tool.ddpcheck]`` in pyproject.toml and ``DDPCHECK_*`` variables, as in ruff, mypy.

Precedence, lowest first: built-in default, the nearest ``pyproject.toml`` (searching upward from the
working directory) that has a ``[tool.ddpcheck]`` table, ``DDPCHECK_<OPTION>`` environment variables,
the command line. Keys are the long option names (``world-sizes = [1, 2]``, ``epochs = 3``,
``allow = ["reshuffle"]``); every value goes through the same converter as its command-line flag, so a
bad value is the same one-line error, naming the file and key (or the variable). Paths in the file are
relative to the file's directory. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ENV_PREFIX = "DDPCHECK_"
TABLE = "ddpcheck"
PATH_KEYS = ("report-dir", "junit")
# Flags that describe one process of a launch, or act at once: never read from a file or the environment.
NOT_CONFIGURABLE = ("help", "version", "rank", "world-size", "master-addr", "master-port")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class ConfigError(ValueError):
    """A ``[tool.ddpcheck]`` key or ``DDPCHECK_*`` variable that cannot be used; one line naming it."""


@dataclass
class Layered:
    """Values found in the file and the environment, by argparse ``dest``, and where each came from."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    file: Path | None = None


def find_pyproject(start: Path) -> tuple[Path, dict[str, Any]] | None:
    """The nearest ``pyproject.toml`` at or above ``start`` with a ``[tool.ddpcheck]`` table, and the table.

    Files without the table are passed over (as ruff does), so a sub-package's own pyproject.toml does
    not hide the project's settings.
    """
    for directory in (start, *start.parents):
        candidate = directory / "pyproject.toml"
        try:
            if not candidate.is_file() or f"tool.{TABLE}" not in candidate.read_text(encoding="utf-8"):
                continue  # cheap filter: only a file that mentions the table is parsed
        except (OSError, UnicodeDecodeError):
            continue
        table = _table(candidate)
        if table is not None:
            return candidate, table
    return None


def configurable(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Long option name (without ``--``) -> its action, for every option a file or variable may set."""
    found: dict[str, argparse.Action] = {}
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--") and option[2:] not in NOT_CONFIGURABLE:
                found[option[2:]] = action
    return found


def load(
    parser: argparse.ArgumentParser, cwd: Path | None = None, environ: Mapping[str, str] | None = None
) -> Layered:
    """Read the file, then the environment (which wins); raise :class:`ConfigError` on the first bad value."""
    actions = configurable(parser)
    layered = Layered()
    found = find_pyproject((cwd or Path.cwd()).resolve())
    if found is not None:
        path, table = found
        layered.file = path
        for key, value in table.items():
            where = f"{path}: [tool.{TABLE}] {key}"
            action = actions.get(key)
            if action is None:
                raise ConfigError(f"{where}: unknown key; known keys: {', '.join(sorted(actions))}")
            converted = _from_toml(action, value, where)
            if key in PATH_KEYS and converted is not None:
                converted = path.parent / converted
            _put(layered, action, converted, "pyproject.toml")
    env = os.environ if environ is None else environ
    for key, action in actions.items():
        name = ENV_PREFIX + key.upper().replace("-", "_")
        if name in env:
            _put(layered, action, _from_env(action, env[name], name), f"env {name}")
    return layered


def _put(layered: Layered, action: argparse.Action, value: Any, source: str) -> None:
    if isinstance(action, (argparse._StoreConstAction, argparse._StoreTrueAction)) and value is _UNSET:
        return
    layered.values[action.dest] = value
    layered.sources[action.dest] = source


_UNSET: Any = object()


def _table(path: Path) -> dict[str, Any] | None:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    except (RecursionError, MemoryError):
        raise ConfigError(f"cannot read {path}: nested too deeply") from None
    tool = data.get("tool", {})
    table = tool.get(TABLE) if isinstance(tool, dict) else None
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: tool.{TABLE} must be a table, got {type(table).__name__}")
    return table


def _convert(action: argparse.Action, text: str, where: str) -> Any:
    """One string through the option's own argparse type and choices."""
    convert = action.type if callable(action.type) else str
    try:
        value = convert(text)
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: invalid value {text!r}") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise ConfigError(f"{where}: invalid choice {text!r} (choose from {choices})")
    return value


def _flag(action: argparse.Action, value: bool) -> Any:
    """``true`` sets a flag (its constant); ``false`` leaves the built-in default."""
    return action.const if value else _UNSET


def _from_toml(action: argparse.Action, value: Any, where: str) -> Any:
    if action.nargs == 0:  # store_true / store_const
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return _flag(action, value)
    if action.dest == "meshes":  # one table or spec is one mesh; a list of them several
        items = value if isinstance(value, list) else [value]
        return [_mesh(action, item, where) for item in items]
    if _is_list_option(action):
        if isinstance(value, dict):  # factory-arg = {key = value}
            return [_convert(action, f"{k}={v!r}", where) for k, v in value.items()]
        items = value if isinstance(value, list) else [value]
        return _flat(action, [_convert(action, _scalar(v, where), where) for v in items])
    if isinstance(value, list) and action.dest == "world_sizes":
        return _convert(action, ",".join(_scalar(v, where) for v in value), where)
    return _convert(action, _scalar(value, where), where)


def _mesh(action: argparse.Action, value: Any, where: str) -> Any:
    """``meshes = {dp_replicate = 2, dp_shard = 2}`` or ``"dp=2,tp=2"``: through the one mesh parser."""
    if isinstance(value, dict):
        from ddpcheck.layout import LayoutError, parse_mesh

        try:
            return parse_mesh(value, need_data=False)
        except LayoutError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return _convert(action, _scalar(value, where), where)


def _scalar(value: Any, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f"{where}: expected a string or number, got {value!r}")
    return str(value)


def _from_env(action: argparse.Action, text: str, name: str) -> Any:
    if action.nargs == 0:
        lowered = text.strip().lower()
        if lowered not in _TRUE + _FALSE:
            raise ConfigError(f"{name}: expected 1/0, true/false, yes/no or on/off, got {text!r}")
        return _flag(action, lowered in _TRUE)
    if _is_list_option(action):  # several values: comma-separated (factory arguments: ';'-separated)
        sep = ";" if action.dest in ("factory_args", "meshes") else ","  # a mesh spec holds commas
        return _flat(
            action, [_convert(action, part.strip(), name) for part in text.split(sep) if part.strip()]
        )
    return _convert(action, text, name)


def _flat(action: argparse.Action, values: list[Any]) -> list[Any]:
    """An ``extend`` option's values (each a list: ``--allow a,b``) as one list, as argparse keeps them."""
    if isinstance(action, argparse._ExtendAction):
        return [item for value in values for item in value]
    return values


def _is_list_option(action: argparse.Action) -> bool:
    return isinstance(action, argparse._AppendAction)
