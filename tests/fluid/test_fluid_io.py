"""fluid.io: persistables and inference models round-trip through files
(JSON program + numpy/table files, nothing pickled)."""

import json

import numpy as np
import pytest

import pyfleet.fluid as fluid  # noqa: PLR0402 (the line Fluid users write)
from pyfleet import models
from pyfleet.fluid import inference
from pyfleet.optimizer import Adam


def _feed(rng, b=16, num_slots=26):
    feed = {"dense_input": rng.random((b, 13), dtype=np.float32),
            "label": rng.integers(0, 2, (b, 1))}
    for i in range(1, num_slots + 1):
        lens = rng.integers(0, 3, b)
        feed[f"C{i}"] = (rng.integers(0, 500, lens.sum()).astype(np.int64),
                         np.concatenate([[0], np.cumsum(lens)]))
    return feed


def _trained(name="deepfm", steps=3):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        m = models.build(name)
        Adam(0.01).minimize(m.avg_cost)
    exe = fluid.Executor()
    exe.run(startup)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        exe.run(main, feed=_feed(rng), fetch_list=[m.avg_cost])
    return main, startup, m, exe


@pytest.mark.parametrize("name", ["dnn", "deepfm"])
def test_inference_model_round_trip_predicts_the_same(tmp_path, name):
    main, _startup, m, exe = _trained(name)
    feed = _feed(np.random.default_rng(5))
    feed_names = [v.name for v in m.inputs if v.name != "label"]
    want = exe.run(main.clone(for_test=True), feed=feed, fetch_list=[m.predict])[0]
    names = fluid.io.save_inference_model(str(tmp_path), feed_names, [m.predict], exe, main)
    assert names == [m.predict.name]
    desc = json.loads((tmp_path / "__model__.json").read_text())
    assert {op["type"] for op in desc["ops"]}.isdisjoint({"auc", "cross_entropy",
                                                          "sigmoid_cross_entropy_with_logits"})
    program, feeds, fetches = fluid.io.load_inference_model(str(tmp_path), exe)
    assert feeds == feed_names and [v.name for v in fetches] == [m.predict.name]
    del feed["label"]
    got = exe.run(program, feed=feed, fetch_list=fetches)[0]
    np.testing.assert_array_equal(got, want)


def test_persistables_round_trip_restores_parameters_and_auc_state(tmp_path):
    main, _startup, m, exe = _trained("wide_deep")
    feed = _feed(np.random.default_rng(6))
    fluid.io.save_persistables(exe, str(tmp_path), main)
    want = exe.run(main.clone(for_test=True), feed=feed, fetch_list=[m.predict, m.auc])

    main2, startup2 = fluid.Program(), fluid.Program()
    with fluid.program_guard(main2, startup2), fluid.unique_name.guard():
        m2 = models.build("wide_deep")
        Adam(0.01).minimize(m2.avg_cost)
    with fluid.scope_guard(fluid.Scope()):
        exe.run(startup2)
        rng = np.random.default_rng(7)
        for _ in range(2):               # diverge first: loading must overwrite all of it
            exe.run(main2, feed=_feed(rng), fetch_list=[m2.avg_cost])
        fluid.io.load_persistables(exe, str(tmp_path), main2)
        got = exe.run(main2.clone(for_test=True), feed=feed, fetch_list=[m2.predict, m2.auc])
        np.testing.assert_array_equal(got[0], want[0])
        assert got[1][0] == pytest.approx(want[1][0])   # same counters + same batch
        exe.run(main2, feed=feed, fetch_list=[m2.avg_cost])   # training continues


def test_load_refuses_bad_files(tmp_path):
    with pytest.raises(ValueError, match="no inference model"):
        fluid.io.load_inference_model(str(tmp_path), fluid.Executor())
    (tmp_path / "__model__.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="carries no checksums"):  # before anything else
        fluid.io.load_inference_model(str(tmp_path), fluid.Executor())
    with pytest.raises(ValueError, match="not a pyfleet.fluid program"):
        inference.load_program(str(tmp_path), unchecked_ok=True)
    main, _startup, _m, exe = _trained("lr", steps=1)
    fluid.io.save_persistables(exe, str(tmp_path / "p"), main)
    np.save(tmp_path / "p" / "fc_0.w_0.npy", np.zeros((3, 3), np.float32))
    with pytest.raises(ValueError, match="shape"):
        fluid.io.load_persistables(exe, str(tmp_path / "p"), main)


def test_program_only_model_loads_the_persistables_saved_beside_it(tmp_path):
    """The other form fluid.io wrote before the one format: __model__.json without
    its parameters section, the parameters as save_persistables files."""
    main, _startup, m, exe = _trained("dnn")
    feed = _feed(np.random.default_rng(8))
    feed_names = [v.name for v in m.inputs if v.name != "label"]
    want = exe.run(main.clone(for_test=True), feed=feed, fetch_list=[m.predict])[0]
    fluid.io.save_inference_model(str(tmp_path), feed_names, [m.predict], exe, main,
                                  program_only=True)
    assert "inference" not in json.loads((tmp_path / "__model__.json").read_text())
    fluid.io.save_persistables(exe, str(tmp_path), main)
    program, feeds, fetches = fluid.io.load_inference_model(str(tmp_path), exe)
    assert feeds == feed_names
    del feed["label"]
    np.testing.assert_array_equal(exe.run(program, feed=feed, fetch_list=fetches)[0], want)
