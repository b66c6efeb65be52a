"""The Fluid 1.8 API census: every public name of Fluid 1.8.5
(``fluid_1_8_names.json``, from ``tools/fluid_census.py``) either works or,
used, raises an UnsupportedError naming it and its reason; never an
AttributeError or ImportError. docs/fleet.md states the counts."""

import importlib
import json
import re
import sys
from pathlib import Path

import pytest
from support import REPO

from pyfleet.errors import UnsupportedError
from pyfleet.fluid import refusals

CENSUS = json.loads((Path(__file__).parent / "fluid_1_8_names.json").read_text())["modules"]
sys.path.insert(0, str(REPO / "tools"))
fluid_census = importlib.import_module("fluid_census")

NAMES = [(m, n) for m, names in sorted(CENSUS.items()) for n in names]


def test_the_census_holds_every_module_the_issue_lists():
    for module in ("paddle.fluid", "paddle.fluid.layers", "paddle.fluid.io",
                   "paddle.fluid.optimizer", "paddle.fluid.initializer",
                   "paddle.fluid.regularizer", "paddle.fluid.clip", "paddle.fluid.metrics",
                   "paddle.fluid.nets", "paddle.fluid.contrib", "paddle.reader",
                   "paddle.dataset",
                   "paddle.fluid.incubate.fleet.parameter_server.distribute_transpiler"):
        assert CENSUS.get(module), module
    assert len(NAMES) > 600
    assert ("paddle.fluid.layers", "fill_constant_batch_size_like") in NAMES


@pytest.mark.parametrize("module,name", NAMES, ids=[f"{m}.{n}" for m, n in NAMES])
def test_every_fluid_name_works_or_is_refused_by_name(module, name):
    obj = fluid_census.resolve(module, name)     # never AttributeError / ImportError
    if not refusals.is_refused(obj):
        return
    reason = refusals.REFUSED.get(module, {}).get(name) or obj._fluid_reason
    assert reason and obj._fluid_reason == reason
    short = f"{module.removeprefix('paddle.')}.{name}"
    with pytest.raises(UnsupportedError) as err:
        obj()
    assert short in str(err.value) and reason in str(err.value)


def test_docs_state_the_census_counts():
    works, refused = fluid_census.classify({"modules": CENSUS})
    text = (REPO / "docs" / "fleet.md").read_text()
    m = re.search(r"Of the (\d+) public names, \*\*(\d+) work\*\* and \*\*(\d+) are refused\*\*",
                  text)
    assert m, "docs/fleet.md lacks the census counts (python tools/fluid_census.py --report)"
    assert tuple(int(g) for g in m.groups()) == (len(NAMES), len(works), len(refused))
    for module, name, _reason in refused:
        assert f"`{module.removeprefix('paddle.')}.{name}`" in text, name


def test_a_placeholder_refuses_every_use_and_is_no_type_of_anything():
    from pyfleet import fluid
    layer = fluid.dygraph.Layer
    for use in (lambda: layer(), lambda: layer.create_parameter,
                lambda: type("Net", (layer,), {})):
        with pytest.raises(UnsupportedError, match="fluid.dygraph.Layer.* is not supported.*"
                                                   "dygraph"):
            use()
    assert not isinstance(object(), layer)
    assert not isinstance(3, fluid.layers.pool2d)
    assert "refused by pyfleet" in repr(fluid.layers.pool2d)
    with pytest.raises(AttributeError):
        fluid.dygraph._private_name  # noqa: B018
    assert "pool2d" not in fluid.layers.__all__


def test_refused_names_import_in_zero_edit_spelling():
    from pyfleet.fluid.layers import dynamic_lstm, pool2d  # `from paddle.fluid.layers import`
    with pytest.raises(UnsupportedError, match="dynamic_lstm.*recurrent"):
        dynamic_lstm(None, 4)
    with pytest.raises(UnsupportedError, match="pool2d.*image"):
        pool2d(None, 1)


def test_fluid_module_level_helpers_work():
    from pyfleet import fluid
    assert fluid.is_compiled_with_cuda() is False
    assert fluid.in_dygraph_mode() is False
    assert len(fluid.cpu_places(3)) == 3
    with fluid.device_guard("cpu"):
        pass
    with pytest.raises(UnsupportedError, match="device_guard\\('gpu'\\)"):
        with fluid.device_guard("gpu"):
            pass
    t = fluid.create_random_int_lodtensor([[2, 3]], [1], fluid.CPUPlace(), low=0, high=9)
    assert t.lod() == [[0, 2, 5]] and t.data.min() >= 0 and t.data.max() <= 9
    assert fluid.Tensor is fluid.LoDTensor
    arr = fluid.LoDTensorArray()
    arr.append(t)
    assert isinstance(arr, fluid.core.LoDTensorArray) and len(arr) == 1
    with pytest.raises(TypeError):
        arr.append([1, 2])
    import numpy as np
    assert np.dtype(fluid.core.VarDesc.VarType.FP32) == np.float32
    assert fluid.core.VarDesc.VarType.INT64 == 3   # framework.proto's number


def test_dataset_common_file_helpers(tmp_path, monkeypatch):
    from pyfleet.dataset import common
    f = tmp_path / "m" / "data.txt"
    f.parent.mkdir()
    f.write_bytes(b"abc")
    monkeypatch.setattr(common, "DATA_HOME", str(tmp_path))
    digest = common.md5file(str(f))
    assert digest == "900150983cd24fb0d6963f7d28e17f72"
    assert common.download("http://x/data.txt", "m", digest) == str(f)
    with pytest.raises(ValueError, match="does not download"):
        common.download("http://x/other.txt", "m", digest)
    with pytest.raises(ValueError, match="has MD5"):
        common.download("http://x/data.txt", "m", "0" * 32)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="no pickle default for dumper"):
        common.split(lambda: iter(range(7)), 3, suffix="part-%02d.pickle")
    with pytest.raises(ValueError, match="no pickle default for loader"):
        list(common.cluster_files_reader(str(tmp_path / "part-*.pickle"), 2, 0)())
    dump = lambda obj, f: f.write(json.dumps(obj).encode())  # noqa: E731
    common.split(lambda: iter(range(7)), 3, suffix="part-%02d.pickle", dumper=dump)
    parts = sorted(p.name for p in tmp_path.glob("part-*.pickle"))
    assert parts == ["part-00.pickle", "part-01.pickle"]
    read = [list(common.cluster_files_reader(str(tmp_path / "part-*.pickle"), 2, i,
                                             loader=lambda f: json.loads(f.read()))())
            for i in (0, 1)]
    assert read == [[0, 1, 2, 3], [4, 5, 6]]    # as Paddle: the first file holds one more
