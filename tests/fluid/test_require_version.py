"""fluid.require_version: Fluid 1.7's check against the emulated Fluid version."""

import pytest

from pyfleet import fluid
from pyfleet.fluid.version import FLUID_VERSION


def test_emulated_version_is_the_last_of_the_era():
    assert FLUID_VERSION == "1.7.2"


@pytest.mark.parametrize("args", [("1.5",), ("1.6.0",), ("1.7.2",), ("1.5.0", "1.7.2"),
                                  ("1.7", "1.7.2.0"), ("0.1.0.0", "2")])
def test_versions_covering_the_emulated_one_pass(args):
    assert fluid.require_version(*args) is None


@pytest.mark.parametrize("args", [("1.8",), ("1.7.3",), ("2.0.0",), ("1.5", "1.6.3"),
                                  ("1.5", "1.7")])
def test_versions_outside_raise_version_error(args):
    # "1.7" as a maximum is 1.7.0.0, below 1.7.2, as in Fluid.
    with pytest.raises(Exception, match="VersionError.*1.7.2"):
        fluid.require_version(*args)


@pytest.mark.parametrize("bad", ["1.6.x", "v1.6", "1.6.0.0.0", "", "1..6", " 1.6"])
def test_malformed_version_refused_by_name(bad):
    with pytest.raises(ValueError, match="min_version"):
        fluid.require_version(bad)
    with pytest.raises(ValueError, match="max_version"):
        fluid.require_version("1.5", bad)


def test_non_string_refused():
    with pytest.raises(TypeError, match="min_version"):
        fluid.require_version(1.6)
    with pytest.raises(TypeError, match="max_version"):
        fluid.require_version("1.5", 1.7)


def test_max_below_min_refused():
    with pytest.raises(ValueError, match="below"):
        fluid.require_version("1.7", "1.6")
