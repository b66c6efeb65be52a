"""``pyfleet train --config FILE -o key=value``: a job's settings in a file.

The keys are the options' names as Python names (``embedding_dim``, ``layers``,
``batch_size``; ``embedding-dim`` is read the same), the values as typed on the
command line or in the file's own types (``layers = [256, 128, 64]`` or
``"256,128,64"``, ``keep_best = true``). The file and its ``-o`` overrides become
command-line options placed before the ones typed (the later wins, so a flag on
the command line wins over ``-o``, and ``-o`` over the file), then checked as
typed ones are: argparse parses them, and ``--resume`` counts them as given.

TOML is read with :mod:`tomllib` (Python >= 3.11) or ``tomli``; YAML with PyYAML
(both optional: a file that needs a missing one is refused by name); JSON always.
"""

import argparse
import difflib
import json
import os

# Options that make no sense in a config file.
NOT_IN_FILE = ("help", "config", "overrides")


def _load_toml(path):
    try:
        import tomllib as toml  # Python >= 3.11
    except ImportError:
        try:
            import tomli as toml
        except ImportError:
            raise SystemExit(f"pyfleet train: --config {path}: reading TOML needs Python >= "
                             f"3.11 (tomllib) or the tomli package (pip install tomli); or "
                             f"write the file as JSON") from None
    with open(path, "rb") as f:
        try:
            return toml.load(f)
        except toml.TOMLDecodeError as e:
            raise SystemExit(f"pyfleet train: --config {path}: not valid TOML: {e}") from None


def _load_yaml(path):
    try:
        import yaml
    except ImportError:
        raise SystemExit(f"pyfleet train: --config {path}: reading YAML needs PyYAML (pip "
                         f"install pyyaml); or write the file as TOML or JSON") from None
    with open(path, encoding="utf-8") as f:
        try:
            return yaml.safe_load(f)
        except yaml.YAMLError as e:
            text = " ".join(str(e).split())
            raise SystemExit(f"pyfleet train: --config {path}: not valid YAML: {text}") \
                from None


def load_config(path):
    """The mapping of a ``.toml``, ``.yaml``/``.yml`` or ``.json`` file."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".toml", ".yaml", ".yml", ".json"):
        raise SystemExit(f"pyfleet train: --config {path}: unknown file type {ext or '(none)'}"
                         f"; give a .toml, .yaml, .yml or .json file")
    if not os.path.isfile(path):
        raise SystemExit(f"pyfleet train: --config: no such file: {path}")
    if ext == ".toml":
        data = _load_toml(path)
    elif ext == ".json":
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise SystemExit(f"pyfleet train: --config {path}: not valid JSON: {e}") \
                    from None
    else:
        data = _load_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SystemExit(f"pyfleet train: --config {path}: expected a mapping of option names "
                         f"to values, got {type(data).__name__}")
    return data


def _actions(parser):
    return {a.dest: a for a in parser._actions if a.dest not in NOT_IN_FILE
            and a.option_strings}


def _tokens(key, value, action, where):
    """The command-line tokens of one setting (refused by name when its value cannot be)."""
    flag = max(action.option_strings, key=len)  # --embedding-dim, not -q
    if isinstance(action, argparse._StoreTrueAction):
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            value = value.lower() in ("true", "1", "yes")
        if not isinstance(value, bool):
            raise SystemExit(f"pyfleet train: {where}: {key} is true or false, got {value!r}")
        return [flag] if value else []
    if isinstance(value, dict):
        raise SystemExit(f"pyfleet train: {where}: {key} takes a value, not a table {value!r}")
    if isinstance(value, list):
        if key != "layers":
            raise SystemExit(f"pyfleet train: {where}: {key} takes one value, not a list")
        value = ",".join(str(v) for v in value)
    if isinstance(value, bool) or value is None:
        raise SystemExit(f"pyfleet train: {where}: {key} takes a value, got {value!r}")
    text = str(value)
    if action.choices is not None and text not in action.choices:
        raise SystemExit(f"pyfleet train: {where}: {key} must be one of "
                         f"{', '.join(action.choices)}, got {text!r}")
    if action.type is not None:
        try:
            action.type(text)
        except (TypeError, ValueError):
            raise SystemExit(f"pyfleet train: {where}: {key} expects "
                             f"{getattr(action.type, '__name__', 'a value')}, got {value!r}") \
                from None
    return [flag, text]


def _key(raw, actions, where):
    key = str(raw).replace("-", "_")
    if key not in actions:
        close = difflib.get_close_matches(key, list(actions), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise SystemExit(f"pyfleet train: {where}: unknown key {raw!r}{hint}; the keys are "
                         f"the options of pyfleet train --help, e.g. embedding_dim, layers")
    return key


def config_argv(parser, path, overrides):
    """``(tokens, record)``: the command-line tokens of ``path``'s settings and the
    ``-o key=value`` ``overrides`` (in that order), and what job.json records."""
    actions = _actions(parser)
    values, tokens = {}, []
    if path is not None:
        where = f"--config {path}"
        for raw, value in load_config(path).items():
            key = _key(raw, actions, where)
            values[key] = value if isinstance(value, (str, int, float, list)) else str(value)
            tokens += _tokens(key, value, actions[key], where)
    for item in overrides or ():
        if "=" not in item:
            raise SystemExit(f"pyfleet train: -o {item}: expected key=value, e.g. "
                             f"-o embedding_dim=8")
        raw, value = item.split("=", 1)
        key = _key(raw.strip(), actions, f"-o {item}")
        values[key] = value
        tokens += _tokens(key, value, actions[key], f"-o {item}")
    record = {"file": None if path is None else os.path.abspath(path),
              "overrides": list(overrides or ()), "values": values}
    return tokens, record


class AppendOverride(argparse.Action):
    """``-o KEY=VALUE``, repeatable (argparse's "append", which also tolerates the
    sentinel namespace ``--resume`` parses the command line into)."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, (list(items) if isinstance(items, list) else [])
                + [values])
