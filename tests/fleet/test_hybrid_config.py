"""Hybrid mode's configuration: ``mode = "hybrid"`` keeps the mode it had as the
servers' (sparse) side, ``sync_mode``/``geo_sgd_mode``/``sparse_mode`` set that side,
and every bad value or misplaced setting is refused by name."""

import pytest

from pyfleet.config import JOB_MODES, MODES, DistributeTranspilerConfig
from pyfleet.distributed import hybrid
from pyfleet.errors import ConfigError


def test_hybrid_keeps_the_mode_it_had_as_the_sparse_side():
    c = DistributeTranspilerConfig()
    assert (c.mode, c.sparse_mode, c.hybrid) == ("sync", "sync", False)
    c.mode = "hybrid"
    assert (c.mode, c.sparse_mode, c.sync_mode, c.hybrid) == ("hybrid", "sync", True, True)
    c = DistributeTranspilerConfig()
    c.sync_mode = False
    c.mode = "hybrid"
    assert (c.sparse_mode, c.sync_mode) == ("async", False)


def test_sync_and_geo_switches_set_the_sparse_side_in_hybrid():
    c = DistributeTranspilerConfig()
    c.mode = "hybrid"
    c.sync_mode = False
    assert (c.mode, c.sparse_mode) == ("hybrid", "async")
    c.geo_sgd_mode = True
    assert (c.mode, c.sparse_mode, c.geo_sgd_mode) == ("hybrid", "geo", True)
    c.sync_mode = True
    assert (c.mode, c.sparse_mode) == ("hybrid", "sync")
    c.sparse_mode = "async"
    assert c.sparse_mode == "async" and not c.sync_mode
    c.mode = "async"       # leaving hybrid: a plain parameter-server job
    assert (c.mode, c.sparse_mode, c.hybrid) == ("async", "async", False)


def test_hybrid_round_trips_through_its_dict():
    c = DistributeTranspilerConfig()
    c.mode = "hybrid"
    c.sparse_mode = "geo"
    d = c.to_dict()
    assert d["mode"] == "hybrid" and d["sparse_mode"] == "geo"
    back = DistributeTranspilerConfig.from_dict(d)
    assert back == c and back.sparse_mode == "geo"
    assert "sparse_mode" not in DistributeTranspilerConfig().to_dict()


def test_bad_hybrid_settings_are_refused_by_name(monkeypatch):
    c = DistributeTranspilerConfig()
    with pytest.raises(ConfigError, match="set mode = 'hybrid' first"):
        c.sparse_mode = "async"
    c.mode = "hybrid"
    with pytest.raises(ConfigError, match="sparse_mode must be one of sync, async, geo"):
        c.sparse_mode = "hybrid"
    with pytest.raises(ConfigError, match="mode must be one of sync, async, geo, hybrid"):
        c.mode = "allreduce"
    assert MODES == ("sync", "async", "geo") and JOB_MODES[-1] == "hybrid"
    monkeypatch.setenv("PYFLEET_MODE", "hybrid")
    assert DistributeTranspilerConfig().mode == "hybrid"
    monkeypatch.setenv("PYFLEET_MODE", "hybird")
    with pytest.raises(ConfigError, match="PYFLEET_MODE must be one of .*hybrid"):
        DistributeTranspilerConfig()


class _Role:
    def worker_index(self):
        return 0

    def worker_num(self):
        return 2


def test_a_hybrid_worker_outside_mpi_is_told_how_to_start(monkeypatch):
    for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(ConfigError, match="--mode hybrid --servers S --workers W"):
        hybrid.open_group(_Role())


def test_the_servers_of_a_hybrid_job_get_the_sparse_tables_only():
    tables = [{"kind": "sparse", "name": "emb"}, {"kind": "dense", "name": "w"}]
    assert hybrid.sparse_only(tables) == [{"kind": "sparse", "name": "emb"}]
