"""Helpers shared by the test suite (never shipped in the package).

``tests/conftest.py`` puts ``tests/`` on ``sys.path``, so test files import
these as ``from support import DATA`` or ``from support.reference import ...``.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The checkout's root (holds pyproject.toml, examples/, benchmarks/)."""

TESTS = REPO / "tests"
"""The test suite's root: a child script puts it on ``sys.path`` to import ``support``."""

DATA = REPO.parent / "shared" / "data"
"""The small real CTR samples beside the checkout (``../shared/data``)."""
