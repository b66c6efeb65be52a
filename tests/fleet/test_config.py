"""DistributeTranspilerConfig validation and the dense placement arithmetic."""

import json
import math
import os
import random
import subprocess
import sys
from functools import reduce

import pytest

from pyfleet.config import (
    DenseBlock,
    DistributeTranspilerConfig,
    HashName,
    RoundRobin,
    RuntimeConfig,
    block_name,
    place_dense,
    slice_variable,
    stable_hash,
)
from pyfleet.errors import ConfigError


@pytest.fixture(autouse=True)
def _no_mode_env(monkeypatch):
    monkeypatch.delenv("PYFLEET_MODE", raising=False)


# ---------------------------------------------------------------- slice_variable arithmetic

@pytest.mark.parametrize("shape, servers, min_block, sizes", [
    ((100,), 5, 8192, [100]),                       # under one block: never cut
    ((8192,), 2, 8192, [8192]),                     # exactly one block
    ((16383,), 4, 8192, [16383]),                   # floor(16383 / 8192) = 1
    ((16384,), 2, 8192, [8192, 8192]),
    ((20000,), 3, 8192, [10000, 10000]),            # 2 blocks fit, not 3
    ((100000,), 3, 8192, [33334, 33334, 33332]),    # ceil(100000 / 3)
    ((3, 10000), 2, 8192, [20000, 10000]),          # 15000 rounded up to 2 rows
    ((1000, 100), 3, 8192, [33400, 33400, 33200]),  # 33334 rounded up to 334 rows
    ((1000, 100), 4, 8192, [25000] * 4),
    ((1, 20000), 2, 8192, [20000]),                 # a single row cannot be cut
    ((13, 7, 128), 4, 1000, [3584, 3584, 3584, 896]),  # rows of 7*128 = 896
    ((10, 10), 8, 1, [20] * 5),                     # alignment leaves fewer blocks than servers
    ((7,), 3, 1, [3, 3, 1]),
    ((), 4, 1, [1]),                                # a scalar
])
def test_slice_variable_exact(shape, servers, min_block, sizes):
    assert slice_variable(shape, servers, min_block) == sizes


def _fluid_reference(shape, slice_count, min_block_size):
    """Fluid 1.5's slice_variable arithmetic, written out with floats as Fluid does."""
    split_count = slice_count
    numel = reduce(lambda x, y: x * y, shape, 1)
    max_count = math.floor(numel / float(min_block_size))
    if max_count == 0:
        max_count = 1
    if max_count < slice_count:
        split_count = max_count
    block = math.ceil(numel / float(split_count))
    if len(shape) >= 2:
        dim1 = reduce(lambda x, y: x * y, shape[1:])
        if block % dim1:
            block += dim1 - block % dim1
    split_count = math.ceil(numel / float(block))
    return [min(block, numel - i * block) for i in range(split_count)]


def test_slice_variable_matches_fluid_rule_on_random_shapes():
    rng = random.Random(7)
    for _ in range(2000):
        rank = rng.randint(1, 3)
        shape = tuple(rng.choice([1, 2, 3, 7, 64, 100, 129, 1000, 4097]) for _ in range(rank))
        servers = rng.randint(1, 9)
        min_block = rng.choice([1, 10, 100, 1000, 8192])
        got = slice_variable(shape, servers, min_block)
        assert got == _fluid_reference(shape, servers, min_block), (shape, servers, min_block)
        assert sum(got) == math.prod(shape)
        assert len(got) <= servers
        row = math.prod(shape[1:]) if len(shape) >= 2 else 1
        assert all(s % row == 0 for s in got[:-1])
        assert all(s == got[0] for s in got[:-1])


# ---------------------------------------------------------------- place_dense

PARAMS = [("fc_0.w_0", (1000, 100)), ("fc_0.b_0", (100,)), ("fc_1.w_0", (100, 200)),
          ("fc_1.b_0", (200,)), ("emb_proj", (40000,))]


def _check_cover(blocks, params, servers):
    for name, shape in params:
        mine = [b for b in blocks if b.name == name]
        assert mine, name
        assert mine[0].start == 0 and mine[-1].end == math.prod(shape)
        for a, b in zip(mine, mine[1:]):
            assert a.end == b.start  # contiguous, no gap, no overlap
        assert all(b.size > 0 for b in mine)
        assert all(0 <= b.server_index < servers for b in mine)


@pytest.mark.parametrize("servers", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("method", [RoundRobin, HashName])
def test_blocks_cover_every_element_once(servers, method):
    config = DistributeTranspilerConfig()
    config.split_method = method
    blocks = place_dense(PARAMS, servers, config)
    _check_cover(blocks, PARAMS, servers)
    sizes = {}
    for name, _ in PARAMS:
        sizes[name] = [b.size for b in blocks if b.name == name]
    for name, shape in PARAMS:
        assert sizes[name] == slice_variable(shape, servers, 8192)


def test_exact_blocks_round_robin_three_servers():
    assert place_dense(PARAMS, 3) == [
        DenseBlock("fc_0.w_0", 0, 33400, 0, "fc_0.w_0.block0"),
        DenseBlock("fc_0.w_0", 33400, 66800, 1, "fc_0.w_0.block1"),
        DenseBlock("fc_0.w_0", 66800, 100000, 2, "fc_0.w_0.block2"),
        DenseBlock("fc_0.b_0", 0, 100, 0, "fc_0.b_0"),
        DenseBlock("fc_1.w_0", 0, 10000, 1, "fc_1.w_0.block0"),
        DenseBlock("fc_1.w_0", 10000, 20000, 2, "fc_1.w_0.block1"),
        DenseBlock("fc_1.b_0", 0, 200, 0, "fc_1.b_0"),
        DenseBlock("emb_proj", 0, 13334, 1, "emb_proj.block0"),
        DenseBlock("emb_proj", 13334, 26668, 2, "emb_proj.block1"),
        DenseBlock("emb_proj", 26668, 40000, 0, "emb_proj.block2"),
    ]


@pytest.mark.parametrize("servers", [2, 3, 5, 8])
def test_round_robin_counts_over_all_blocks_and_balances(servers):
    params = [(f"p{i}", (1 + 37 * i, 300)) for i in range(20)]
    blocks = place_dense(params, servers)
    assert [b.server_index for b in blocks] == [k % servers for k in range(len(blocks))]
    counts = [sum(b.server_index == s for b in blocks) for s in range(servers)]
    assert max(counts) - min(counts) <= 1


def test_hash_name_uses_the_block_name_and_ignores_order():
    config = DistributeTranspilerConfig()
    config.split_method = HashName
    blocks = place_dense(PARAMS, 4, config)
    for b in blocks:
        assert b.server_index == stable_hash(b.var_name) % 4
    reordered = place_dense(list(reversed(PARAMS)), 4, config)
    assert {b.var_name: b.server_index for b in reordered} == \
        {b.var_name: b.server_index for b in blocks}
    # Many names spread over every server (a stuck hash would put them all on one).
    many = place_dense([(f"layer_{i}.w", (10,)) for i in range(200)], 4, config)
    assert {b.server_index for b in many} == {0, 1, 2, 3}


_PLACEMENT_SCRIPT = """
import json
from pyfleet.config import DistributeTranspilerConfig, HashName, place_dense
c = DistributeTranspilerConfig(); c.split_method = HashName
params = [(f"layer_{i}.w_0", (64 * i + 1, 129)) for i in range(30)]
print(json.dumps([list(b) for b in place_dense(params, 5, c)]))
"""


def test_hash_name_is_stable_across_processes_with_different_hash_seeds():
    outs = []
    for seed in ("1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        env.pop("PYFLEET_MODE", None)
        res = subprocess.run([sys.executable, "-c", _PLACEMENT_SCRIPT], env=env, check=False,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        outs.append(json.loads(res.stdout))
    assert outs[0] == outs[1]
    c = DistributeTranspilerConfig()
    c.split_method = HashName
    here = place_dense([(f"layer_{i}.w_0", (64 * i + 1, 129)) for i in range(30)], 5, c)
    assert outs[0] == [list(b) for b in here]
    assert len({b[3] for b in outs[0]}) > 1


def test_stable_hash_is_fnv1a_64():
    # Published FNV-1a 64-bit test vectors.
    assert stable_hash("") == 0xCBF29CE484222325
    assert stable_hash("a") == 0xAF63DC4C8601EC8C
    assert stable_hash("foobar") == 0x85944171F73967E8
    with pytest.raises(TypeError):
        stable_hash(b"a")


def test_no_slicing_keeps_parameters_whole():
    config = DistributeTranspilerConfig()
    config.slice_var_up = False
    blocks = place_dense(PARAMS, 3, config)
    assert [(b.name, b.start, b.end, b.var_name) for b in blocks] == \
        [(n, 0, math.prod(s), n) for n, s in PARAMS]
    assert [b.server_index for b in blocks] == [0, 1, 2, 0, 1]


def test_min_block_size_controls_cutting():
    config = DistributeTranspilerConfig()
    config.min_block_size = 10
    blocks = place_dense([("w", (8, 5))], 4, config)
    assert [(b.start, b.end, b.server_index) for b in blocks] == \
        [(0, 10, 0), (10, 20, 1), (20, 30, 2), (30, 40, 3)]
    assert [b.var_name for b in blocks] == [block_name("w", i) for i in range(4)]
    assert block_name("fc_0.w_0", 3) == "fc_0.w_0.block3"


def test_one_server_gets_everything_whole():
    blocks = place_dense(PARAMS, 1)
    assert all(b.server_index == 0 and b.var_name == b.name for b in blocks)
    assert len(blocks) == len(PARAMS)


@pytest.mark.parametrize("params, servers, match", [
    ([("w", (10,))], 0, "server_num"),
    ([("w", (10,))], True, "server_num"),
    ([("w", (10,)), ("w", (3,))], 2, "listed twice"),
    ([("", (10,))], 2, "non-empty"),
    ([("w", (0, 10))], 2, "positive"),
    ([("w", (-1,))], 2, "positive"),
    ([("w", (2.0,))], 2, "positive"),
    ([("w", (True,))], 2, "positive"),
    ([("w", None)], 2, "shape"),
    (["w"], 2, "pairs"),
])
def test_place_dense_rejects_bad_input(params, servers, match):
    with pytest.raises(ValueError, match=match):
        place_dense(params, servers)


def test_place_dense_ignores_pyfleet_mode_env(monkeypatch):
    monkeypatch.setenv("PYFLEET_MODE", "nonsense")
    assert len(place_dense([("w", (3,))], 2)) == 1


# ---------------------------------------------------------------- dispatchers (Fluid interface)

def test_dispatchers_have_fluids_interface():
    eps = ["127.0.0.1:6000", "127.0.0.1:6001", "127.0.0.1:6002"]
    rr = RoundRobin(eps)
    assert rr.dispatch(["a", "b", "c", "d"]) == [eps[0], eps[1], eps[2], eps[0]]
    assert rr.dispatch(["e"]) == [eps[1]]  # the counter carries on between calls
    rr.reset()
    assert rr.dispatch(["f"]) == [eps[0]]

    class Var:
        def __init__(self, name):
            self.name = name

    hn = HashName(eps)
    assert hn.dispatch([Var("x.block0"), "y"]) == [eps[stable_hash("x.block0") % 3],
                                                   eps[stable_hash("y") % 3]]
    with pytest.raises(ValueError):
        RoundRobin([])
    with pytest.raises(ValueError):
        RoundRobin("127.0.0.1:6000")


# ---------------------------------------------------------------- the config object

def test_defaults_are_fluids():
    c = DistributeTranspilerConfig()
    assert c.sync_mode is True and c.mode == "sync" and not c.geo_sgd_mode
    assert c.split_method is RoundRobin
    assert c.slice_var_up is True
    assert c.min_block_size == 8192
    assert c.geo_k_steps == 100 == c.geo_sgd_need_push_nums
    assert c.runtime == RuntimeConfig()
    assert c.wait_port is True


def test_sync_mode_and_mode_stay_consistent():
    c = DistributeTranspilerConfig()
    c.sync_mode = False
    assert c.mode == "async"
    c.mode = "sync"
    assert c.sync_mode is True
    c.mode = "geo"
    assert c.sync_mode is False and c.geo_sgd_mode is True
    c.sync_mode = False
    assert c.mode == "geo"  # async-style switch leaves geo alone
    c.geo_sgd_mode = False
    assert c.mode == "async"
    c.geo_sgd_mode = True
    assert c.mode == "geo"
    c.sync_mode = True
    assert c.mode == "sync" and not c.geo_sgd_mode
    c.mode = "pserver"  # Fluid's only PS mode: accepted, changes nothing
    assert c.mode == "sync"
    c.geo_sgd_need_push_nums = 7
    assert c.geo_k_steps == 7


@pytest.mark.parametrize("field, value, match", [
    ("mode", "nccl2", "mode"),
    ("mode", 1, "mode"),
    ("sync_mode", "yes", "sync_mode"),
    ("sync_mode", 2, "sync_mode"),
    ("slice_var_up", None, "slice_var_up"),
    ("min_block_size", 0, "min_block_size"),
    ("min_block_size", 10.5, "min_block_size"),
    ("min_block_size", True, "min_block_size"),
    ("geo_k_steps", 0, "geo_k_steps"),
    ("geo_sgd_need_push_nums", -1, "geo_sgd_need_push_nums"),
    ("split_method", "Random", "split_method"),
    ("split_method", dict, "split_method"),
    ("enable_dc_asgd", True, "enable_dc_asgd"),
    ("runtime", {"request_timeout": 1}, "runtime"),
])
def test_bad_values_name_the_field(field, value, match):
    c = DistributeTranspilerConfig()
    with pytest.raises(ConfigError, match=match):
        setattr(c, field, value)


def test_split_method_accepts_class_name_or_instance():
    c = DistributeTranspilerConfig()
    c.split_method = HashName
    assert c.split_method is HashName
    c.split_method = "RoundRobin"
    assert c.split_method is RoundRobin
    c.split_method = HashName(["h:1"])
    assert c.split_method is HashName
    c.split_method = None
    assert c.split_method is RoundRobin


def test_misspelt_setting_is_an_error_with_a_suggestion():
    c = DistributeTranspilerConfig()
    with pytest.raises(AttributeError, match="sync_mode"):
        c.sync_mdoe = False
    with pytest.raises(AttributeError, match="request_timeout"):
        c.runtime.request_timeot = 3


def test_runtime_timeouts_are_validated():
    r = RuntimeConfig()
    r.request_timeout = 2.5
    assert r.request_timeout == 2.5
    for bad in (0, -1, float("inf"), float("nan"), "3", True):
        with pytest.raises(ConfigError, match="request_timeout"):
            r.request_timeout = bad


def test_fluid_rpc_deadline_sets_the_request_timeout_by_default(monkeypatch):
    assert DistributeTranspilerConfig().runtime.request_timeout == 60.0
    monkeypatch.setenv("FLAGS_rpc_deadline", "5000")   # Fluid's, in ms (Paddle's tests set it)
    assert DistributeTranspilerConfig().runtime.request_timeout == 5.0
    assert RuntimeConfig(request_timeout=7.0).request_timeout == 7.0   # given: it wins
    for bad in ("soon", "0", "-5", "1.5"):
        monkeypatch.setenv("FLAGS_rpc_deadline", bad)
        with pytest.raises(ConfigError, match="FLAGS_rpc_deadline"):
            DistributeTranspilerConfig()


def test_pyfleet_mode_env_sets_the_default_only(monkeypatch):
    monkeypatch.setenv("PYFLEET_MODE", "async")
    c = DistributeTranspilerConfig()
    assert c.mode == "async" and c.sync_mode is False
    c.sync_mode = True  # the script's explicit choice wins
    assert c.mode == "sync"
    monkeypatch.setenv("PYFLEET_MODE", "fast")
    with pytest.raises(ConfigError, match="PYFLEET_MODE"):
        DistributeTranspilerConfig()


def test_dict_round_trip_is_json_safe(monkeypatch):
    c = DistributeTranspilerConfig()
    c.mode = "geo"
    c.geo_k_steps = 12
    c.split_method = HashName
    c.slice_var_up = False
    c.min_block_size = 64
    c.runtime.barrier_timeout = 9.0
    d = json.loads(json.dumps(c.to_dict()))
    monkeypatch.setenv("PYFLEET_MODE", "sync")
    back = DistributeTranspilerConfig.from_dict(d)
    assert back == c and back.mode == "geo" and back.split_method is HashName
    assert back.runtime.barrier_timeout == 9.0
    assert DistributeTranspilerConfig.from_dict({}).mode == "sync"
    with pytest.raises(ConfigError, match="unknown"):
        DistributeTranspilerConfig.from_dict({"sync_mdoe": True})
    with pytest.raises(ConfigError, match="min_block_size"):
        DistributeTranspilerConfig.from_dict({"min_block_size": -3})
