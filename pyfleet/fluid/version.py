"""Which Fluid version ``pyfleet.fluid`` answers to, and ``fluid.require_version``.

``pyfleet.fluid`` follows the Python API of PaddlePaddle Fluid 1.5 to 1.7 (the
subset ``docs/layers.md`` and ``docs/fleet.md`` list) and reports itself as
Fluid :data:`FLUID_VERSION` to scripts that check. ``require_version`` appeared
in Fluid 1.7, so a script calling it was written for 1.7 or later; reporting
the last version of that era lets it run, and a script that demands a version
outside the era (``require_version("1.8")``, or ``max_version="1.6.3"``) gets
Fluid's VersionError instead of running on an API it did not ask for.
"""

import re

__all__ = ["FLUID_VERSION", "VersionError", "require_version"]

FLUID_VERSION = "1.7.2"



class VersionError(Exception):
    """The emulated Fluid version is outside a script's ``require_version``
    range (Fluid raises a bare Exception whose text starts ``VersionError:``;
    this subclass keeps that text and ``except Exception`` catching it)."""


_FORMAT = re.compile(r"\d+(\.\d+){0,3}")


def _parts(version, what):
    if not isinstance(version, str):
        raise TypeError(f"require_version: {what} must be a str like '1.6.0', got "
                        f"{type(version).__name__}")
    if _FORMAT.fullmatch(version) is None:
        raise ValueError(f"require_version: {what} {version!r} is not a version: expected "
                         "1 to 4 dot-separated numbers, like '1.6' or '1.6.0'")
    nums = [int(p) for p in version.split(".")]
    return nums + [0] * (4 - len(nums))


def require_version(min_version, max_version=None):
    """Fluid's ``require_version``: raise unless the emulated Fluid version
    (:data:`FLUID_VERSION`) lies in ``[min_version, max_version]``.

    Versions are compared as 4 numbers, missing ones 0 (``"1.7"`` is
    ``1.7.0.0``), as Fluid does; a non-string argument is a TypeError, a
    malformed one a ValueError naming it, a version outside the range a
    :class:`VersionError` (its text starts ``VersionError:``, as Fluid's)."""
    low = _parts(min_version, "min_version")
    high = None if max_version is None else _parts(max_version, "max_version")
    have = _parts(FLUID_VERSION, "the emulated version")
    if high is not None and high < low:
        raise ValueError(f"require_version: max_version {max_version!r} is below "
                         f"min_version {min_version!r}")
    if high is not None and not low <= have <= high:
        raise VersionError(f"VersionError: PaddlePaddle version in [{min_version}, "
                        f"{max_version}] required, but pyfleet.fluid emulates Fluid "
                        f"{FLUID_VERSION}.")
    if have < low:
        raise VersionError(f"VersionError: PaddlePaddle version {min_version} or higher is "
                        f"required, but pyfleet.fluid emulates Fluid {FLUID_VERSION}.")
