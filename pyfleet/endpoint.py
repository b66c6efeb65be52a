"""Endpoints (``host:port``) and names that become file names: parsed and checked in one place.

Used by the role makers, the launcher and the server, so every one of them
accepts and refuses the same strings with the same message.
"""

from __future__ import annotations

import os

from pyfleet.errors import ConfigError

__all__ = ["check_endpoint", "check_file_name", "parse_endpoints", "split_endpoint"]


def split_endpoint(ep, what: str = "endpoint", allow_zero: bool = False) -> tuple[str, int]:
    """``"host:port"`` (or ``"tcp://host:port"``) as ``(host, port)``.

    Port 0 ("any free port") is accepted only with ``allow_zero``: a server may
    bind it, but nobody can be told to connect to it. Raises ConfigError (a
    ValueError) naming ``what`` and the bad string.
    """
    if not isinstance(ep, str):
        raise ConfigError(f"{what}: an endpoint must be a 'host:port' string, got {ep!r}")
    s = ep.strip().removeprefix("tcp://")
    host, sep, port = s.rpartition(":")
    if not sep or not host or not port:
        raise ConfigError(f"{what}: {ep!r} is not of the form host:port (e.g. 10.0.0.1:6000)")
    if host.startswith("[") != host.endswith("]") or any(c.isspace() for c in host):
        raise ConfigError(f"{what}: {ep!r} has a malformed host")
    low = 0 if allow_zero else 1
    if not port.isdigit() or not low <= int(port) <= 65535:
        raise ConfigError(f"{what}: {ep!r} has a port that is not an integer in {low}..65535")
    return host, int(port)


def check_endpoint(ep, what: str = "endpoint") -> str:
    """The canonical ``"host:port"`` form of ``ep``; ConfigError if malformed."""
    host, port = split_endpoint(ep, what)
    return f"{host}:{port}"


def parse_endpoints(value, what: str) -> tuple[str, ...]:
    """Validate server endpoints given as ``"h:p,h:p"`` or a list of ``"h:p"``.

    Returns them as a tuple in the given order (the order defines server indices). Raises
    ConfigError naming ``what`` for an empty list, an empty item, a malformed endpoint or a
    duplicate.
    """
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise ConfigError(f"{what} must be a list of 'host:port' strings, got {value!r}")
    if not items or items == [""]:
        raise ConfigError(f"{what} is empty: give at least one server endpoint host:port")
    eps = []
    for i, item in enumerate(items):
        if isinstance(item, str) and not item.strip():
            raise ConfigError(f"{what}: item {i} is empty (a stray comma?) in {value!r}")
        eps.append(check_endpoint(item, what))
    dup = sorted({e for e in eps if eps.count(e) > 1})
    if dup:
        raise ConfigError(f"{what}: endpoint(s) listed more than once: {', '.join(dup)}")
    return tuple(eps)


def check_file_name(name, what: str = "name") -> str:
    """``name`` if it can be used as one file name inside a directory, else ValueError.

    Refused: empty, leading dot (hidden files, ``.`` and ``..``), a path
    separator, a NUL byte.
    """
    if (not isinstance(name, str) or not name or name.startswith(".") or "/" in name
            or os.sep in name or "\0" in name):
        raise ValueError(f"{what} {name!r} cannot be used as a file name")
    return name
