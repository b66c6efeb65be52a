"""Shared fixtures of the whole suite.

This file's folder (``tests/``) is on ``sys.path`` while the suite runs
(pytest's default import mode puts a rootdir conftest's folder there), so the
helpers in ``tests/support/`` import as ``support``.
"""

import os

import pytest
from support import DATA, REPO


@pytest.fixture
def repo():
    """The checkout's root."""
    return REPO


@pytest.fixture
def shared_data():
    """``../shared/data``; the test is skipped, loudly, only if the samples are absent."""
    if not DATA.is_dir():
        pytest.fail(f"the shared CTR samples are missing: {DATA}")
    return DATA


@pytest.fixture
def one_blas_thread(monkeypatch):
    """Child processes use one BLAS thread each (many share two cores)."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return os.environ
