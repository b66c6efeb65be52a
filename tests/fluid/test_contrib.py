"""fluid.contrib: what CTR scripts of the era import works or is refused by name."""

import numpy as np
import pytest
from support.fluid import check_gradients

from pyfleet import fluid
from pyfleet.errors import ConfigError
from pyfleet.optimizer import SGD

L = fluid.layers


def test_fused_embedding_seq_pool_is_lookup_then_sum():
    ids = [[1, 2, 2], [0], [], [3, 1]]
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        s = L.data("ids", [1], dtype="int64", lod_level=1)
        fused = fluid.contrib.layers.fused_embedding_seq_pool(s, [5, 3], param_attr="emb",
                                                              padding_idx=0)
        ref = L.sequence_pool(L.embedding(s, [5, 3], param_attr="emb", padding_idx=0), "sum")
        assert fluid.contrib.fused_embedding_seq_pool is \
            fluid.contrib.layers.fused_embedding_seq_pool
        with pytest.raises(ValueError, match="combiner"):
            fluid.contrib.layers.fused_embedding_seq_pool(s, [5, 3], combiner="mean")
    exe = fluid.Executor()
    exe.run(startup)
    a, b = exe.run(main, feed={"ids": ids}, fetch_list=[fused, ref])
    np.testing.assert_array_equal(a, b)
    w = main.backend.pull_dense("emb")
    w[0] = 0
    np.testing.assert_allclose(a, [w[1] + 2 * w[2], w[0], np.zeros(3), w[3] + w[1]],
                               rtol=1e-6)


def test_fused_embedding_seq_pool_gradients():
    ids = [[1, 2, 2], [0, 3], [4]]

    def build():
        s = L.data("ids", [1], dtype="int64", lod_level=1)
        p = fluid.contrib.layers.fused_embedding_seq_pool(s, [5, 3], dtype="float64")
        return L.mean(L.tanh(L.fc(p, 2)))
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        loss = build()
        SGD(0.1).minimize(loss)
    assert check_gradients(main, startup, loss, {"ids": ids}) > 0


def test_mixed_precision_imports_and_refuses_decorate():
    from pyfleet.fluid.contrib.mixed_precision import decorate
    with pytest.raises(ConfigError, match="mixed_precision.decorate.*GPU"):
        decorate(SGD(0.1))
    with pytest.raises(ConfigError, match="GPU"):
        fluid.contrib.mixed_precision.AutoMixedPrecisionLists()


@pytest.mark.parametrize("name", ["BasicLSTMUnit", "basic_gru", "QuantizeTranspiler",
                                  "memory_usage", "extend_with_decoupled_weight_decay",
                                  "slim", "reader"])
def test_other_contrib_names_refused_by_name(name):
    with pytest.raises(ConfigError, match=f"fluid.contrib.{name} is not supported"):
        getattr(fluid.contrib, name)()


def test_from_import_of_a_refused_name_carries_the_reason():
    from pyfleet.fluid.contrib import BasicLSTMUnit  # importable; refused when used
    with pytest.raises(ConfigError, match="BasicLSTMUnit.*recurrent"):
        BasicLSTMUnit(hidden_size=4)
    with pytest.raises(ConfigError, match="contrib.layers.tdm_sampler"):
        fluid.contrib.layers.tdm_sampler(None)


def test_unknown_names_are_attribute_errors():
    assert not hasattr(fluid.contrib, "no_such_thing")
    assert not hasattr(fluid.contrib.layers, "no_such_layer")


def _ctr(main, startup):
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        dense = L.data("dense", [2])
        s = L.data("s", [1], dtype="int64", lod_level=1)
        label = L.data("label", [1], dtype="int64")
        e = L.embedding(s, [1_000_001, 4], is_sparse=True, param_attr="SparseFeatFactors")
        h = L.fc([dense, L.sequence_pool(e, "sum")], 2, act="softmax")
        return L.mean(L.cross_entropy(h, label)), h


def test_lookup_table_utils_load_a_checkpoint_into_a_local_program(tmp_path):
    rng = np.random.default_rng(0)
    feed = {"dense": rng.normal(size=(8, 2)).astype(np.float32),
            "s": [[int(k)] for k in rng.integers(0, 10**9, 8)],
            "label": rng.integers(0, 2, (8, 1))}
    main, startup = fluid.Program(), fluid.Program()
    loss, pred = _ctr(main, startup)
    with fluid.program_guard(main, startup):
        SGD(0.5).minimize(loss)
    exe = fluid.Executor()
    exe.run(startup)
    for _ in range(3):
        exe.run(main, feed=feed, fetch_list=[loss])
    want = exe.run(main.clone(for_test=True), feed=feed, fetch_list=[pred])[0]
    fluid.io.save_persistables(exe, str(tmp_path), main)

    from pyfleet.fluid.contrib.utils import lookup_table_utils as ltu
    infer, infer_startup = fluid.Program(), fluid.Program()
    _loss, ipred = _ctr(infer, infer_startup)
    exe.run(infer_startup)
    assert ltu.convert_dist_to_sparse_program(infer) is infer
    got_prog = ltu.load_persistables_for_inference(str(tmp_path), exe, infer,
                                                   "SparseFeatFactors")
    got = exe.run(got_prog, feed=feed, fetch_list=[ipred])[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    with pytest.raises(ValueError, match="not a sparse table"):
        ltu.load_persistables_for_inference(str(tmp_path), exe, infer, "fc_0.w_0")
    with pytest.raises(ValueError, match="outside"):
        ltu.load_persistables_for_increment(str(tmp_path), exe, infer, "SparseFeatFactors",
                                            str(tmp_path.parent / "elsewhere"))
    ltu.load_persistables_for_increment(str(tmp_path), exe, infer, "SparseFeatFactors",
                                        str(tmp_path))
    np.testing.assert_allclose(exe.run(infer, feed=feed, fetch_list=[ipred])[0], want,
                               rtol=1e-6)
