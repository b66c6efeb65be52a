"""Every `pyfleet train` a CLI test starts caches its generated data under the
session's temporary directory, never in the user's ~/.cache."""

import pytest


@pytest.fixture(autouse=True)
def _private_data_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PYFLEET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
