"""Generic machinery for run configs: YAML files with ``base:``, ``a.b.c=value`` overrides, and
nested frozen dataclasses built from plain values with type coercion and bound checks.

A schema dataclass declares ``_bounds`` (field -> ">= 1", "[0, 1)", "finite", ...: every int and
float field needs one), may declare ``_shorthand`` (the field a bare YAML string stands for) and
``check(self, at)`` (cross-field rules raising `ConfigError`). It imports only the standard
library, PyYAML and two foundation modules, so anything may import it."""
from __future__ import annotations

import copy
import dataclasses
import functools
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union
from collections.abc import Mapping, Sequence

import yaml

from clarifyjax.core.ranges import finite, within  # noqa: F401  (within: part of this module's API)
from clarifyjax.files.textfiles import atomic_write_bytes, read_text_file


class ConfigError(ValueError):
    """A configuration that cannot be read as asked; the message names the key and the source.

    `key`: the key path the error is about, when a section's ``check`` knows it (`build_root`
    uses it to name the override that set the key rather than only the file)."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


# --------------------------------------------------------------------------- public entry points


def read_yaml(path: str | os.PathLike) -> dict:
    """The mapping in a YAML file, with its ``base:`` chain merged in (paths relative to the file).

    Raises:
      ConfigError: missing file, YAML syntax error (with line and column), a top level that is not
        a mapping, a ``base`` that is not a file name, or ``base`` files that form a cycle.
    """
    return _read_yaml_with_bases(Path(path), ())


def build_root(cls, raw: Mapping[str, Any], overrides: Sequence[str] = (), *,
               source: str = "<dict>"):
    """Dataclass `cls` from nested plain values plus ``a.b.c=value`` overrides, coerced and checked.

    Raises:
      ConfigError: an unknown key (naming it, `source` and the valid keys at that level), a bad
        value (naming the key, the value and the expected type), or a failed bound / ``check``.
    """
    raw = copy.deepcopy(dict(raw))
    # Overrides composed in code apply in order (a later one wins: a helper's defaults, then a
    # caller's); a key repeated on a command line is refused earlier, by `parse_overrides`.
    for item in overrides:
        _apply_override(raw, cls, item, source)
    where = _source_of(overrides, source)
    try:
        cfg = _build(cls, raw, "", source)
    except ConfigError as e:  # a section that checks itself (`Sampling`): name the override
        if e.key is None or where(e.key) == source or not str(e).startswith(source):
            raise
        raise ConfigError(where(e.key) + str(e)[len(source):], key=e.key) from None
    check_tree(cfg, "", where)
    return cfg


def _source_of(overrides: Sequence[str], source: str):
    """key -> what set it: the last override on that key (or on a section above or below it),
    else the file; bound and cross-field errors then name the override a user actually typed."""
    def where(key: str) -> str:
        for item in reversed(overrides):
            k = item.partition("=")[0].strip()
            if k == key or key.startswith(k + ".") or k.startswith(key + "."):
                return f"override '{item}' (config {source})"
        return source
    return where


def parse_overrides(args: Sequence[str]) -> list[str]:
    """Keep the ``key=value`` items of a command line (validated later by `load_config`); a key
    given twice is refused (`refuse_repeated`)."""
    bad = [a for a in args if "=" not in a or a.startswith("=")]
    if bad:
        raise ConfigError(f"overrides must look like key=value (e.g. ppo.batch_size=8), got {bad}")
    refuse_repeated(args, "the command line")
    return list(args)


def refuse_repeated(overrides: Sequence[str], where: str) -> None:
    """ConfigError naming a key that two ``key=value`` items set (one of them would be dropped
    without a word: a typo or a copied command line)."""
    first: dict[str, str] = {}
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key in first:
            raise ConfigError(f"{where}: override key {key!r} is given twice ({first[key]!r}, "
                              f"then {item!r}); give it once", key=key)
        first[key] = item


def config_to_dict(cfg) -> dict:
    """Nested plain dicts/lists/scalars (tuples become lists); `build_root` (and
    `clarifyjax.config.config_from_dict`) invert it."""
    def convert(value):
        if dataclasses.is_dataclass(value):
            return {f.name: convert(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, (tuple, list)):
            return [convert(v) for v in value]
        return value

    return convert(cfg)


def dump_config(cfg) -> str:
    """The config as YAML text that `load_config` reads back to an equal config."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False)


def save_config(cfg, path: str | os.PathLike) -> Path:
    """Write `dump_config(cfg)` to `path` atomically (temporary file + rename)."""
    atomic_write_bytes(Path(path), dump_config(cfg).encode())
    return Path(path)


# --------------------------------------------------------------------------- internals


def _read_yaml_with_bases(path: Path, seen: tuple[Path, ...]) -> dict:
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    resolved = path.resolve()
    if resolved in seen:
        chain = " -> ".join(str(p) for p in seen + (resolved,))
        raise ConfigError(f"{path}: 'base' files form a cycle: {chain}")
    try:
        # UTF-8 whatever the locale, an optional BOM dropped; a directory or other bytes: one line
        data = yaml.safe_load(read_text_file(path, error=ConfigError))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise ConfigError(f"{path}: YAML syntax error at {where}: {e.problem}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: YAML error: {e}") from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError(f"{path}: 'base' must be a file name, got {base!r}")
    parent = _read_yaml_with_bases(path.parent / base, seen + (resolved,))
    return _merge(parent, data)


def _merge(base: dict, top: Mapping) -> dict:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


@functools.cache  # evaluating string annotations is most of a load's time
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _field_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _dataclass_in(tp) -> type | None:
    """The dataclass inside ``X`` or ``Optional[X]``, else None."""
    if dataclasses.is_dataclass(tp):
        return tp
    if _is_union(tp):
        for arg in typing.get_args(tp):
            if dataclasses.is_dataclass(arg):
                return arg
    return None


def _is_union(tp) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _unknown_key(cls, key: str, at: str, source: str) -> ConfigError:
    """A key `cls` does not have; one its ``_moved: ClassVar`` (old key -> new key under the same
    section) names is reported as moved."""
    moved = getattr(cls, "_moved", {}).get(key)
    if moved is not None:
        return ConfigError(f"{source}: {_join(at, key)}: moved to {_join(at, moved)}",
                           key=_join(at, key))
    level = f"under '{at}'" if at else "at the top level"
    return ConfigError(f"{source}: unknown key '{_join(at, key)}'; valid keys {level}: "
                       f"{', '.join(_field_names(cls))}")


def _build(cls, data, at: str, source: str):
    """Dataclass `cls` from a mapping, coercing every value; errors name `at` and `source`."""
    if isinstance(data, str) and getattr(cls, "_shorthand", None):
        data = {cls._shorthand: data}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: '{at or '<top>'}' must be a mapping of "
                          f"{', '.join(_field_names(cls))}; got {data!r}")
    hints = _hints(cls)
    names = _field_names(cls)
    for key in data:
        if key not in names:
            raise _unknown_key(cls, str(key), at, source)
    kwargs = {key: _coerce(value, hints[key], _join(at, key), source)
              for key, value in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as e:  # a section that checks itself on construction (`Sampling`)
        field = getattr(e, "field", None)  # the field it names, if it does
        if field in names:
            key = _join(at, field)
            raise ConfigError(f"{source}: {key}: {getattr(e, 'reason', e)}", key=key) from None
        raise ConfigError(f"{source}: '{at or '<top>'}': {e}", key=at or None) from None


def _type_name(tp) -> str:
    if _is_union(tp):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is tuple:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return f"a mapping ({tp.__name__})"
    return getattr(tp, "__name__", str(tp))


def _bad_value(key: str, value, tp, source: str) -> ConfigError:
    return ConfigError(f"{source}: bad value for '{key}': {value!r} is not {_type_name(tp)}")


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_NULL = {"null", "none", "~", ""}


def _coerce(value, tp, key: str, source: str):
    """`value` (a YAML value or an override string) as type `tp`."""
    if _is_union(tp):
        args = typing.get_args(tp)
        if type(None) in args and (value is None or (isinstance(value, str)
                                                     and value.strip().lower() in _NULL)):
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, source)
            except ConfigError as e:
                errors.append(e)
        if len(errors) == 1:
            raise errors[0]
        raise _bad_value(key, value, tp, source)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        return _build(tp, value, key, source)
    origin = typing.get_origin(tp)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value in allowed:
            return value
        raise _bad_value(key, value, tp, source)
    if origin is tuple:
        (item_tp, *_rest) = typing.get_args(tp)
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    value = yaml.safe_load(text)
                except yaml.YAMLError:
                    raise _bad_value(key, value, tp, source) from None
            else:
                value = [v.strip() for v in text.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise _bad_value(key, value, tp, source)
        return tuple(_coerce(v, item_tp, f"{key}[{i}]", source) for i, v in enumerate(value))
    if tp in (bool, int, float, str):
        return _scalar(value, tp, key, source)
    raise ConfigError(f"{source}: '{key}' has an unsupported field type {tp!r}")


def _scalar(value, tp, key: str, source: str):
    """A bool / int / float / str field; numbers never come from booleans."""
    text = value.strip() if isinstance(value, str) else None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            if text is not None and text.lower() in _TRUE | _FALSE:
                return text.lower() in _TRUE
        elif tp is str and (text is not None or number):
            return value if text is not None else str(value)  # a name such as 123
        elif tp is float and (text is not None or number):
            return float(value)
        elif tp is int and (text is not None or number):
            parsed = float(text.replace("_", "")) if text is not None else value
            if float(parsed).is_integer():
                return int(parsed)
    except ValueError:
        pass
    raise _bad_value(key, value, tp, source)


def _apply_override(raw: dict, cls, item: str, source: str) -> None:
    """Set ``a.b.c=value`` in the nested dict `raw`, checking the key path against `cls`."""
    key, sep, text = item.partition("=")
    key = key.strip()
    where = f"override '{item}' (config {source})"
    if not sep or not key:
        raise ConfigError(f"{where}: an override must look like key=value")
    parts = key.split(".")
    node, node_cls, at = raw, cls, ""
    for i, part in enumerate(parts):
        names = _field_names(node_cls)
        if part not in names:
            raise _unknown_key(node_cls, part, at, where)
        tp = _hints(node_cls)[part]
        full = _join(at, part)
        if i == len(parts) - 1:
            node[part] = _coerce(text, tp, full, where)
            return
        inner = _dataclass_in(tp)
        if inner is None:
            raise ConfigError(f"{where}: '{full}' is {_type_name(tp)}, not a section; "
                              f"set it as {full}=value")
        child = node.get(part)
        if isinstance(child, str) and getattr(inner, "_shorthand", None):
            child = {inner._shorthand: child}
        elif dataclasses.is_dataclass(child):  # set by an earlier override
            child = config_to_dict(child)
        elif not isinstance(child, dict):
            child = {}  # absent or null: start from the section's defaults
        node[part] = child
        node, node_cls, at = child, inner, full


def check_tree(cfg, at: str = "", where=None) -> None:
    """Check every section's `_bounds` (and finiteness of floats) and ``check(at)`` (cross-field
    rules), depth first. `where(key)` names the source of a key (default: nothing)."""
    where = where or (lambda key: "<config>")
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            check_tree(value, _join(at, f.name), where)
    bounds = getattr(cfg, "_bounds", {})
    for name in numeric_fields(type(cfg)):
        if name not in bounds:  # a schema bug: caught by any load, so no field ships without one
            raise TypeError(f"{type(cfg).__name__}.{name}: numeric field without a _bounds entry")
    for name, bound in bounds.items():
        value, key = getattr(cfg, name), _join(at, name)
        if value is not None and not within(value, bound):
            raise ConfigError(f"{where(key)}: {key} = {value}: must be {bound}"
                              + ("" if finite(value) else " and finite"), key=key)
    if hasattr(cfg, "check"):
        try:
            cfg.check(at)  # "" at the root
        except ValueError as e:  # ConfigError, or a ValueError of a section a pure module declares
            key = getattr(e, "key", None) or at
            raise ConfigError(f"{where(key)}: {e}", key=key) from None


def _text(value) -> str:
    """A value as an override would spell it."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(
        value)


def numeric_fields(cls) -> list[str]:
    """The int / float (or Optional int / float) fields of dataclass `cls`."""
    out = []
    for name, tp in _hints(cls).items():
        if name.startswith("_") or name not in _field_names(cls):
            continue
        args = typing.get_args(tp) if _is_union(tp) else (tp,)
        if any(a in (int, float) for a in args):
            out.append(name)
    return out


def refuse_changed(section, at: str, reasons: Mapping[str, str]) -> None:
    """Keys that this context does not read: a value other than the field's default would be
    ignored silently, so it is refused, naming the key and why (`reasons`: field -> reason)."""
    defaults = {f.name: f.default for f in dataclasses.fields(section)}
    for name, reason in reasons.items():
        value = getattr(section, name)
        if value != defaults[name]:  # (a value inherited from a base file counts too)
            key = _join(at, name)
            raise ConfigError(f"{key} = {value!r} is not used: {reason}; remove it or set it to "
                              f"its default {_text(defaults[name])}", key=key)


def check_increasing(buckets: Sequence[int], key: str) -> None:
    """Length buckets: strictly increasing positive integers (empty is fine)."""
    if any(b <= 0 for b in buckets) or list(buckets) != sorted(set(buckets)):
        raise ConfigError(f"{key} = {list(buckets)}: must be increasing positive lengths")
