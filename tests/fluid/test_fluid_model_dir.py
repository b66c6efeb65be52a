"""Fluid's model directory: ``__model__`` (a ProgramDesc protobuf) and tensor files.

The fixture ``data/fluid18_fc`` was written by Paddle 1.8.5 itself
(``fluid18/make_fc_model.py``, run under Python 3.7 with the paddlepaddle==1.8.5
wheel), with the prediction Fluid computed for a fixed input. Other tests pin
the byte layout from Fluid's documented format, built here by hand, not with
pyfleet's encoder. ``test_real_fluid_opens_a_pyfleet_model`` runs Paddle 1.8.5
on a directory pyfleet wrote when ``PYFLEET_FLUID18_PYTHON`` names such an
interpreter (docs/dev/fluid-model-format.md).
"""

import contextlib
import json
import logging
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyfleet import fluid
from pyfleet.errors import UncheckedModelWarning
from pyfleet.fluid import fluid_model, fluid_proto, inference

HERE = Path(__file__).parent
FIXTURE = HERE / "data" / "fluid18_fc"


# ------------------------------------------------------------ hand-built protobuf bytes
def _v(n):
    n = n + (1 << 64) if n < 0 else n
    out = b""
    while n > 0x7F:
        out += bytes([(n & 0x7F) | 0x80])
        n >>= 7
    return out + bytes([n])


def _fld(field, wire, payload):
    if wire == 2:
        return _v(field << 3 | 2) + _v(len(payload)) + payload
    if wire == 5:
        return _v(field << 3 | 5) + payload
    return _v(field << 3) + _v(payload)


def _s(field, text):
    return _fld(field, 2, text.encode())


def _tensor_var(name, dtype_code, dims, persistable=False, lod_level=0):
    tdesc = _fld(1, 0, dtype_code) + b"".join(_fld(2, 0, d) for d in dims)
    vtype = _fld(1, 0, 7) + _fld(3, 2, _fld(1, 2, tdesc) + _fld(2, 0, lod_level))
    return _s(1, name) + _fld(2, 2, vtype) + (_fld(3, 0, 1) if persistable else b"")


def _holder(name, vtype):
    return _s(1, name) + _fld(2, 2, _fld(1, 0, vtype)) + _fld(3, 0, 1)


def _op(op_type, inputs, outputs, attrs=b""):
    body = _s(3, op_type)
    for slot, names in inputs:
        body += _fld(1, 2, _s(1, slot) + b"".join(_s(2, n) for n in names))
    for slot, names in outputs:
        body += _fld(2, 2, _s(1, slot) + b"".join(_s(2, n) for n in names))
    return body + attrs


def _attr_int(name, value):
    return _fld(4, 2, _s(1, name) + _fld(2, 0, 0) + _fld(3, 0, value))


def _attr_float(name, value):
    return _fld(4, 2, _s(1, name) + _fld(2, 0, 1) + _fld(4, 5, struct.pack("<f", value)))


def _attr_strings(name, values):
    return _fld(4, 2, _s(1, name) + _fld(2, 0, 5) + b"".join(_s(8, x) for x in values))


def _tensor_bytes(value):
    """Fluid's LoDTensor file of ``value`` (float32), by hand."""
    tdesc = _fld(1, 0, 5) + b"".join(_fld(2, 0, d) for d in value.shape)
    return (struct.pack("<I", 0) + struct.pack("<Q", 0) + struct.pack("<I", 0)
            + struct.pack("<i", len(tdesc)) + tdesc + value.astype("<f4").tobytes())


def _hand_built_fc(where, combined=False):
    """An fc network x[-1,3] -> fc(2) -> softmax in Fluid 1.8's layout, with the
    bookkeeping Fluid writes (op_role, op_callstack, an unknown-to-us field, the
    version and op_compatible_map messages). Returns (w, b)."""
    rng = np.random.default_rng(4)
    w = rng.normal(size=(3, 2)).astype(np.float32)
    b = rng.normal(size=(2,)).astype(np.float32)
    block = _fld(1, 0, 0) + _fld(2, 0, -1)   # idx 0, parent_idx -1 (ten-byte varint)
    for var in (_holder("feed", 9), _holder("fetch", 10),
                _tensor_var("x", 5, [-1, 3]), _tensor_var("fc.w", 5, [3, 2], True),
                _tensor_var("fc.b", 5, [2], True), _tensor_var("h", 5, [-1, 2]),
                _tensor_var("h2", 5, [-1, 2]), _tensor_var("prob", 5, [-1, 2])):
        block += _fld(3, 2, var)
    bookkeeping = _attr_int("op_role", 0) + _attr_strings("op_callstack", ["  File x.py"])
    ops = [_op("feed", [("X", ["feed"])], [("Out", ["x"])], _attr_int("col", 0)),
           _op("mul", [("X", ["x"]), ("Y", ["fc.w"])], [("Out", ["h"])],
               _attr_int("x_num_col_dims", 1) + _attr_int("y_num_col_dims", 1) + bookkeeping),
           _op("elementwise_add", [("X", ["h"]), ("Y", ["fc.b"])], [("Out", ["h2"])],
               _attr_int("axis", 1) + _attr_float("unused_scale", 1.5)),
           _op("softmax", [("X", ["h2"])], [("Out", ["prob"])],
               _attr_int("axis", -1) + _fld(5, 0, 0)),   # is_target = false
           _op("fetch", [("X", ["prob"])], [("Out", ["fetch"])], _attr_int("col", 0))]
    block += b"".join(_fld(4, 2, op) for op in ops)
    compat = _fld(1, 2, _s(1, "softmax") + _fld(2, 2, _s(1, "1.6.0") + _fld(2, 0, 2)))
    program = _fld(1, 2, block) + _fld(3, 2, compat) + _fld(4, 2, _fld(1, 0, 0))
    where.mkdir()
    (where / ("model" if combined else "__model__")).write_bytes(program)
    if combined:   # by order of name: fc.b then fc.w
        (where / "params").write_bytes(_tensor_bytes(b) + _tensor_bytes(w))
    else:
        (where / "fc.w").write_bytes(_tensor_bytes(w))
        (where / "fc.b").write_bytes(_tensor_bytes(b))
    return w, b


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("combined", [False, True])
def test_a_hand_built_fluid_model_loads_and_predicts_as_numpy(tmp_path, combined):
    where = tmp_path / "m"
    w, b = _hand_built_fc(where, combined)
    kw = {"model_filename": "model", "params_filename": "params"} if combined else {}
    exe = fluid.Executor()
    with pytest.warns(UncheckedModelWarning):  # written by hand: no checksums
        program, feeds, fetches = fluid.io.load_inference_model(str(where), exe, **kw)
    assert feeds == ["x"] and [v.name for v in fetches] == ["prob"]
    x = np.random.default_rng(1).normal(size=(5, 3)).astype(np.float32)
    (out,) = exe.run(program, feed={"x": x}, fetch_list=fetches)
    np.testing.assert_allclose(np.asarray(out), _softmax(x @ w + b), rtol=1e-6, atol=1e-7)


def test_a_model_written_by_fluid_1_8_predicts_what_fluid_predicted():
    io = np.load(FIXTURE / "io.npz")
    exe = fluid.Executor()
    for sub, kw in (("separate", {}),
                    ("combined", {"model_filename": "model", "params_filename": "params"})):
        with pytest.warns(UncheckedModelWarning):  # Paddle's: no checksums (below)
            program, feeds, fetches = fluid.io.load_inference_model(str(FIXTURE / sub), exe,
                                                                    **kw)
        assert feeds == ["x", "ids"]
        assert next(v.name for v in fetches).startswith("save_infer_model/scale_0")
        ids = fluid.create_lod_tensor(io["ids"], [list(io["lens"])], fluid.CPUPlace())
        (out,) = exe.run(program, feed={"x": io["x"], "ids": ids}, fetch_list=fetches)
        np.testing.assert_allclose(np.asarray(out), io["pred"], rtol=1e-5, atol=1e-6)
        # Paddle's models carry no checksums: Fluid's API loads them with a named
        # warning, pyfleet's own loader only when asked for explicitly
        with pytest.warns(UncheckedModelWarning, match=r"no checksums pyfleet can check"):
            fluid.io.load_inference_model(str(FIXTURE / sub), exe, **kw)
        with pytest.raises(ValueError, match=r"no checksums pyfleet can check .* refused"):
            inference.load(str(FIXTURE / sub), **kw)
        assert inference.load(str(FIXTURE / sub), unchecked_ok=True, **kw).feed_names == \
            ["x", "ids"]
    # Program.parse_from_string + load_persistables, as serving code of that era did
    program = fluid.Program.parse_from_string((FIXTURE / "separate" / "__model__").read_bytes())
    assert program._feed_target_names == ["x", "ids"]
    fluid.io.load_persistables(exe, str(FIXTURE / "separate"), program)
    ids = fluid.create_lod_tensor(io["ids"], [list(io["lens"])], fluid.CPUPlace())
    (out,) = exe.run(program, feed={"x": io["x"], "ids": ids},
                     fetch_list=program._fetch_target_names)
    np.testing.assert_allclose(np.asarray(out), io["pred"], rtol=1e-5, atol=1e-6)


def test_a_model_written_by_paddle_3_in_the_programdesc_layout_predicts_the_same():
    """paddlepaddle 3.3.1's save_inference_model (FLAGS_enable_pir_api=0): a newer
    ProgramDesc (fields Fluid 1.8 did not have are skipped), .pdmodel/.pdiparams."""
    where = HERE / "data" / "paddle3_fc"
    io = np.load(where / "io.npz")
    exe = fluid.Executor()
    with pytest.warns(UncheckedModelWarning):  # Paddle's: no checksums
        program, feeds, fetches = fluid.io.load_inference_model(
            str(where), exe, model_filename="m.pdmodel", params_filename="m.pdiparams")
    assert feeds == ["x"]
    (out,) = exe.run(program, feed={"x": io["x"]}, fetch_list=fetches)
    np.testing.assert_allclose(np.asarray(out), io["ref"], rtol=1e-6, atol=1e-7)


def test_the_tensor_file_layout_byte_by_byte(tmp_path):
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    path = tmp_path / "t"
    with open(path, "wb") as f:
        fluid_proto.write_tensor(f, value)
    assert path.read_bytes() == _tensor_bytes(value)
    with open(path, "rb") as f:
        back, lod = fluid_proto.read_tensor(f, "t", np.float32, (2, 3))
    np.testing.assert_array_equal(back, value)
    assert lod == []


def test_a_tensor_header_claiming_a_huge_shape_is_refused_before_allocating(tmp_path):
    tdesc = _fld(1, 0, 5) + _fld(2, 0, 10**12) + _fld(2, 0, 4)
    path = tmp_path / "w"
    path.write_bytes(struct.pack("<IQIi", 0, 0, 0, len(tdesc)) + tdesc + b"\0" * 64)
    with open(path, "rb") as f, pytest.raises(ValueError, match=r"needs 16,000,000,000,000 "
                                                                  r"bytes, 64 remain"):
        fluid_proto.read_tensor(f, str(path))
    with open(path, "rb") as f, pytest.raises(ValueError, match=r"expected \(3, 2\)"):
        fluid_proto.read_tensor(f, str(path), np.float32, (3, 2))


def test_every_attribute_type_round_trips_through_the_wire_encoding():
    attrs = {"i": (0, -7), "f": (1, 0.5), "s": (2, "SUM"), "ints": (3, [1, -2, 3]),
             "floats": (4, [0.25, -1.0]), "strings": (5, ["a", "bé"]), "b": (6, True),
             "bools": (7, [True, False]), "blk": (8, 2), "l": (9, -(1 << 40)),
             "blks": (10, [1, 2]), "longs": (11, [1 << 40, -1])}
    blocks = [{"idx": 0, "parent_idx": -1,
               "vars": [{"name": "v", "type": 7, "persistable": True, "dtype": "int64",
                         "dims": [-1, 5], "lod_level": 1}],
               "ops": [{"type": "t", "inputs": {"X": ["v", "v"]}, "outputs": {},
                        "attrs": attrs}]}]
    back, version = fluid_proto.decode_program(fluid_proto.encode_program(blocks, 3))
    assert version == 3
    (blk,) = back
    assert blk["parent_idx"] == -1
    assert blk["vars"][0]["dims"] == [-1, 5] and blk["vars"][0]["lod_level"] == 1
    assert blk["ops"][0]["inputs"] == {"X": ["v", "v"]}
    assert blk["ops"][0]["attrs"] == attrs


def test_bytes_that_are_no_program_are_refused_by_name():
    with pytest.raises(ValueError, match="no block: not a Fluid ProgramDesc"):
        fluid.Program.parse_from_string(b"")
    with pytest.raises(ValueError, match="claims 100 bytes"):
        fluid.Program.parse_from_string(_v(1 << 3 | 2) + _v(100) + b"x")
    unknown = _fld(1, 2, _fld(1, 0, 0) + _fld(2, 0, -1) + _fld(3, 2, _tensor_var("x", 5, [2]))
                   + _fld(4, 2, _op("while", [("X", ["x"])], [])))
    with pytest.raises(ValueError, match="op 'while' has no pyfleet kernel"):
        fluid.Program.parse_from_string(unknown)
    two_blocks = unknown + _fld(1, 2, _fld(1, 0, 1) + _fld(2, 0, 0))
    with pytest.raises(ValueError, match="2 blocks"):
        fluid.Program.parse_from_string(two_blocks)


# ----------------------------------------------------------- what pyfleet writes
def _trained(vocab=100, ids_high=100):
    main, start = fluid.Program(), fluid.Program()
    main.random_seed = start.random_seed = 5
    with fluid.program_guard(main, start):
        x = fluid.layers.data("x", shape=[4], dtype="float32")
        ids = fluid.layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        big = fluid.layers.data("big", shape=[1], dtype="int64", lod_level=1)
        y = fluid.layers.data("y", shape=[1], dtype="float32")
        small = fluid.layers.sequence_pool(fluid.layers.embedding(ids, size=[50, 3]), "sum")
        table = fluid.layers.sequence_pool(
            fluid.layers.embedding(big, size=[vocab, 2], is_distributed=True,
                                   param_attr=fluid.ParamAttr(name="table")), "sum")
        h = fluid.layers.fc(fluid.layers.concat([x, small, table], axis=1), 8, act="relu")
        # ops whose Fluid form differs from pyfleet's: extra outputs, is_test, list
        # attributes, a cast's in_dtype
        h = fluid.layers.dropout(fluid.layers.batch_norm(h), 0.2)
        L = fluid.layers
        h = L.reshape(L.transpose(L.reshape(h, [-1, 2, 4]), [0, 2, 1]), [-1, 8])
        h = L.cast(L.cast(h, "float64"), "float32")
        h = L.scale(L.concat([h, L.reduce_sum(h, dim=1, keep_dim=True)], axis=1), 0.5, bias=0.1)
        pred = fluid.layers.fc(h, 1, act="sigmoid")
        loss = fluid.layers.mean(fluid.layers.square(pred - y))
        fluid.optimizer.SGD(0.1).minimize(loss)
    exe = fluid.Executor()
    exe.run(start)
    rng = np.random.default_rng(0)

    def feed(n=6, high=ids_high):
        return {"x": rng.random((n, 4), dtype=np.float32),
                "ids": fluid.create_lod_tensor(rng.integers(0, 50, (n, 1)), [[1] * n],
                                               fluid.CPUPlace()),
                "big": fluid.create_lod_tensor(rng.integers(0, high, (n, 1)), [[1] * n],
                                               fluid.CPUPlace()),
                "y": rng.random((n, 1), dtype=np.float32)}
    for _ in range(3):
        exe.run(main, feed=feed(), fetch_list=[loss])
    return main, exe, pred, feed


def _predict(program, exe, fetches, f):
    f = {k: v for k, v in f.items() if k != "y"}
    return np.asarray(exe.run(program, feed=f, fetch_list=fetches)[0])


@pytest.mark.parametrize("combined", [False, True])
def test_pyfleet_writes_fluids_layout_and_reads_it_back_alone(tmp_path, combined):
    main, exe, pred, feed = _trained(vocab=1000)
    where = tmp_path / "model"
    kw = {"model_filename": "model", "params_filename": "params"} if combined else {}
    assert fluid.io.save_inference_model(str(where), ["x", "ids", "big"], [pred], exe, main,
                                         **kw) == [pred.name]
    names = sorted(os.listdir(where))
    persistables = sorted(p.name for p in main.all_parameters())
    assert len(persistables) == 10 and "table" in persistables   # batch_norm's 4 too
    if combined:
        assert {"model", "params", "__model__.json"} <= set(names)
        assert not set(persistables) & set(names)
    else:
        assert {"__model__", "__model__.json", *persistables} <= set(names)
    f = feed(high=1000)
    ref = _predict(main.clone(for_test=True), exe, [pred], f)
    program, feeds, fetches = fluid.io.load_inference_model(str(where), exe, **kw)
    np.testing.assert_allclose(_predict(program, exe, fetches, f), ref, rtol=1e-6)

    # the ProgramDesc: feed ops first (col i), fetch last, Fluid's attribute types
    blocks, _ = fluid_proto.decode_program((where / ("model" if combined else
                                                       "__model__")).read_bytes())
    ops = blocks[0]["ops"]
    assert [(o["type"], o["attrs"]["col"][1]) for o in ops[:3]] == [("feed", 0), ("feed", 1),
                                                                    ("feed", 2)]
    assert ops[-1]["type"] == "fetch" and ops[-1]["inputs"]["X"] == [pred.name]
    lookup = next(o for o in ops if o["type"] == "lookup_table")
    assert lookup["attrs"]["padding_idx"] == (fluid_proto.A_LONG, -1)
    pool = next(o for o in ops if o["type"] == "sequence_pool")
    assert "MaxIndex" in pool["outputs"]   # Fluid 1.8's kernel requires it

    # the sparse table as Fluid's dense [vocab, dim]: trained rows as trained,
    # the others the rows a server would create for those ids
    backend = main.backend
    keys = backend.sparse["table"].keys()
    fluid_dir = tmp_path / "fluid_only"
    shutil.copytree(where, fluid_dir)
    os.remove(fluid_dir / "__model__.json")
    # without its checksums, pyfleet's own program is read only when asked for explicitly
    program, _, fetch_names = inference.load_program(str(fluid_dir), unchecked_ok=True, **kw)
    fetches = [program.global_block().var(n) for n in fetch_names]
    table = program.backend.pull_dense("table")
    assert table.shape == (1000, 2)
    np.testing.assert_array_equal(table[keys.astype(np.int64)],
                                  backend.pull_sparse("table", keys, create=False))
    others = np.setdiff1d(np.arange(1000, dtype=np.uint64), keys)
    np.testing.assert_array_equal(table[others.astype(np.int64)],
                                  backend.sparse["table"].initial_values(others))
    np.testing.assert_allclose(_predict(program, exe, fetches, f), ref, rtol=1e-6)


@pytest.mark.parametrize("combined", [False, True])
def test_deleting_the_checksums_of_a_fluid_layout_model_pyfleet_wrote_is_detected(tmp_path,
                                                                                 combined):
    # The attack: __model__.json (the sha256 of every file) deleted, Fluid's files left:
    # they loaded with nothing checked. pyfleet's program carries a mark Paddle skips
    # (a protobuf field framework.proto does not define) naming its checksum file.
    main, exe, pred, feed = _trained(vocab=1000)
    where = tmp_path / "model"
    kw = {"model_filename": "model", "params_filename": "params"} if combined else {}
    fluid.io.save_inference_model(str(where), ["x", "ids", "big"], [pred], exe, main, **kw)
    program_file = where / ("model" if combined else "__model__")
    assert fluid_proto.read_mark(program_file.read_bytes()) == {
        "checksums": "__model__.json", "intact": True}
    f = feed(high=1000)
    ref = _predict(main.clone(for_test=True), exe, [pred], f)
    os.remove(where / "__model__.json")
    deleted = r"written by pyfleet with the checksums .* in __model__.json, which is missing"
    with pytest.raises(ValueError, match=deleted):
        fluid.io.load_inference_model(str(where), exe, **kw)
    with pytest.raises(ValueError, match=deleted):
        inference.load(str(where), **kw)
    program, _, names = inference.load_program(str(where), unchecked_ok=True, **kw)
    fetches = [program.global_block().var(n) for n in names]
    np.testing.assert_allclose(_predict(program, exe, fetches, f), ref, rtol=1e-6)

    # The program edited as well (here re-encoded by a tool that keeps the old mark):
    # the mark no longer matches it, so it is a model nothing can check, as Paddle's are
    old = program_file.read_bytes()
    blocks, version = fluid_proto.decode_program(old)
    # the mark's length does not depend on the program (a name and a sha256)
    old_mark = old[-len(fluid_proto.mark_program(b"", "__model__.json")):]
    program_file.write_bytes(fluid_proto.encode_program(blocks, version + 1) + old_mark)
    assert fluid_proto.read_mark(program_file.read_bytes()) == {
        "checksums": "__model__.json", "intact": False}
    with pytest.raises(ValueError, match=r"no checksums pyfleet can check .* refused"):
        inference.load(str(where), **kw)
    with pytest.warns(UncheckedModelWarning):
        program, _, fetches = fluid.io.load_inference_model(str(where), exe, **kw)
    np.testing.assert_allclose(_predict(program, exe, fetches, f), ref, rtol=1e-6)


def test_the_combined_file_is_every_tensor_file_in_order_of_name(tmp_path):
    main, exe, pred, _ = _trained()
    fluid.io.save_inference_model(str(tmp_path / "a"), ["x", "ids", "big"], [pred], exe, main)
    fluid.io.save_inference_model(str(tmp_path / "b"), ["x", "ids", "big"], [pred], exe, main,
                                  params_filename="params")
    names = sorted(p.name for p in main.all_parameters())
    assert len(names) == 10
    joined = b"".join((tmp_path / "a" / n).read_bytes() for n in names)
    assert (tmp_path / "b" / "params").read_bytes() == joined


def test_a_table_holding_ids_beyond_its_vocabulary_is_left_out_by_name(tmp_path, caplog):
    main, exe, pred, feed = _trained(vocab=100, ids_high=10**6)   # hashed-looking ids
    where = tmp_path / "m"
    with caplog.at_level(logging.INFO, logger="pyfleet"):
        fluid.io.save_inference_model(str(where), ["x", "ids", "big"], [pred], exe, main)
    assert "sparse table 'table' is not in Fluid's parameter files" in caplog.text
    desc = json.loads((where / "__model__.json").read_text())
    assert "beyond its declared vocabulary 100" in desc["fluid"]["tables_left_out"]["table"]
    assert not (where / "table").exists() and (where / "__model__").exists()
    f = feed(high=10**6)   # pyfleet's own files still predict every id
    ref = _predict(main.clone(for_test=True), exe, [pred], f)
    program, _, fetches = fluid.io.load_inference_model(str(where), exe)
    np.testing.assert_allclose(_predict(program, exe, fetches, f), ref, rtol=1e-6)
    os.remove(where / "__model__.json")   # Fluid's files alone miss the table, by name
    with pytest.raises(ValueError, match=r"parameter file .*table of variable 'table' is "
                                         r"missing"):
        inference.load_program(str(where), unchecked_ok=True)


def test_program_only_and_refused_options(tmp_path):
    main, exe, pred, _ = _trained()
    where = tmp_path / "p"
    fluid.io.save_inference_model(str(where), ["x", "ids", "big"], [pred], exe, main,
                                  program_only=True)
    assert sorted(os.listdir(where)) == ["__model__", "__model__.json"]
    with pytest.raises(ValueError, match="export_for_deployment=False"):
        fluid.io.save_inference_model(str(tmp_path / "q"), ["x"], [pred], exe, main,
                                      export_for_deployment=False)
    with pytest.raises(ValueError, match="pserver_endpoints"):
        fluid.io.load_inference_model(str(where), exe, pserver_endpoints=["127.0.0.1:1"])
    with pytest.raises(ValueError, match="__model__.json is pyfleet's"):
        fluid.io.save_inference_model(str(tmp_path / "r"), ["x", "ids", "big"], [pred], exe,
                                      main, model_filename="__model__.json")


@pytest.mark.parametrize("interpreter,script", [
    ("PYFLEET_FLUID18_PYTHON", "open_model.py"),            # paddlepaddle==1.8.5, Python 3.7
    ("PYFLEET_PADDLE3_PYTHON", "open_model_paddle3.py")])   # a current paddlepaddle
def test_real_paddle_opens_a_pyfleet_model(tmp_path, interpreter, script):
    if not os.environ.get(interpreter):
        pytest.skip(f"{interpreter} (a Python with that paddlepaddle) not set")
    main, exe, pred, feed = _trained(vocab=1000)
    f = feed(high=1000)
    ref = _predict(main.clone(for_test=True), exe, [pred], f)
    np.savez(tmp_path / "feed.npz", x=f["x"], ids=f["ids"].data.reshape(-1, 1),
             big=f["big"].data.reshape(-1, 1), ref=ref)
    for sub, extra in (("separate", []), ("combined", ["model", "params"])):
        kw = dict(zip(("model_filename", "params_filename"), extra))
        fluid.io.save_inference_model(str(tmp_path / sub), ["x", "ids", "big"], [pred], exe,
                                      main, **kw)
        out = subprocess.run([os.environ[interpreter], str(HERE / "fluid18" / script),
                              str(tmp_path / sub), *extra, str(tmp_path / "feed.npz")],
                             capture_output=True, text=True, timeout=300, check=False)
        assert out.returncode == 0, out.stderr[-2000:]
        diffs = [float(line.rsplit(":", 1)[1]) for line in out.stdout.splitlines()
                 if "max |diff| vs pyfleet:" in line]
        assert diffs and max(diffs) < 1e-6, out.stdout


def test_inference_load_reads_a_fluid_directory_too(tmp_path):
    where = tmp_path / "m"
    w, b = _hand_built_fc(where)
    with pytest.raises(ValueError, match="no checksums pyfleet can check"):
        inference.load(str(where))   # a foreign model: only when asked for explicitly
    p = inference.load(str(where), unchecked_ok=True)
    x = np.ones((2, 3), dtype=np.float32)
    np.testing.assert_allclose(np.asarray(p.predict({"x": x})[0]), _softmax(x @ w + b),
                               rtol=1e-6)
    assert sys.modules["pyfleet.fluid.fluid_model"] is fluid_model


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 2000), st.integers(0, 255))
def test_damaged_program_bytes_are_a_clear_error_never_a_crash(noise, at, byte):
    """Random bytes, and a real __model__ with one byte changed or cut short:
    a program or a ValueError, nothing else."""
    real = (FIXTURE / "separate" / "__model__").read_bytes()
    changed = bytearray(real)
    changed[at % len(real)] = byte
    for data in (noise, bytes(changed), real[:at]):
        with contextlib.suppress(ValueError):
            fluid.Program.parse_from_string(data)
