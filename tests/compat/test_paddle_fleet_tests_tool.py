"""tools/paddle_fleet_tests.py judges Paddle's Fleet tests honestly: their bases never
check the trainers' exit codes, so a class whose unittest says OK but whose role log
holds a traceback is an error, and a pyfleet refusal is named as one."""

import importlib
import subprocess
import sys
import tarfile
import textwrap

from support import REPO

sys.path.insert(0, str(REPO / "tools"))
tool = importlib.import_module("paddle_fleet_tests")

# A stand-in of a Paddle test base: it starts a "trainer" child writing its stderr to
# $TMPDIR/tr0_err.log, waits, and never looks at the child's exit code.
FAKE_TEST = textwrap.dedent('''
    import os, subprocess, sys, tempfile, unittest

    def role(code):
        with open(os.path.join(tempfile.gettempdir(), "tr0_err.log"), "wb") as err:
            subprocess.run([sys.executable, "-c", code], stderr=err, check=False)

    class TrainerDies(unittest.TestCase):
        def test_train(self):
            role("raise RuntimeError('trainer died here')")

    class TrainerRefused(unittest.TestCase):
        def test_train(self):
            role("from pyfleet import fluid; fluid.layers.warpctc()")

    class TrainerFine(unittest.TestCase):
        def test_train(self):
            role("import paddle; print(paddle.__name__)")

    class Skipped(unittest.TestCase):
        @unittest.skip("not here")
        def test_train(self):
            pass
''')


def test_a_role_traceback_under_an_ok_unittest_is_an_error(tmp_path):
    release = tmp_path / "tests" / "9.9"
    release.mkdir(parents=True)
    (release / "test_fake_fleet.py").write_text(FAKE_TEST)
    out = subprocess.run([sys.executable, str(REPO / "tools" / "paddle_fleet_tests.py"),
                          "--tests-dir", str(tmp_path / "tests"), "--work",
                          str(tmp_path / "work"), "--timeout", "120"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    rows = {line.split("|")[3].strip(): line for line in out.stdout.splitlines()
            if line.startswith("| 9.9 |")}
    assert set(rows) == {"TrainerDies", "TrainerRefused", "TrainerFine", "Skipped"}
    assert "| errors | tr0: RuntimeError: trainer died here |" in rows["TrainerDies"]
    assert "| refused |" in rows["TrainerRefused"] and "warpctc" in rows["TrainerRefused"]
    assert "| passed |" in rows["TrainerFine"]
    assert "| skipped |" in rows["Skipped"]        # never counted as passing
    assert "(avazu data: the synthetic stand-in)" in out.stdout


def test_unittest_outcomes_are_read_as_unittest_prints_them():
    assert tool._unittest_outcome("Ran 3 tests in 1.0s\n\nOK\n") == ("passed", 3)
    assert tool._unittest_outcome("Ran 2 tests in 1s\n\nOK (skipped=2)\n") == ("skipped", 2)
    assert tool._unittest_outcome("Ran 2 tests\n\nFAILED (failures=1)\n") == ("failed", 2)
    assert tool._unittest_outcome("Ran 2 tests\n\nFAILED (failures=1, errors=1)\n") == \
        ("errors", 2)
    assert tool._unittest_outcome("ImportError: no module\n") == ("errors", 0)


def test_the_standin_avazu_data_has_the_layout_ctr_dataset_reader_reads(tmp_path):
    tgz = tool.write_standin_avazu(tmp_path, rows=40)
    with tarfile.open(tgz) as tar:
        names = set(tar.getnames())
    assert {"avazu_ctr_data/train.txt", "avazu_ctr_data/data.meta.txt"} <= names
    meta = (tmp_path / "avazu_ctr_data" / "data.meta.txt").read_text().splitlines()
    assert meta == ["dnn_input_dim: 10000", "lr_input_dim: 10000"]
    lines = (tmp_path / "avazu_ctr_data" / "train.txt").read_text().splitlines()
    assert len(lines) == 40
    deep, wide, click = lines[0].split("\t")
    assert len(deep.split()) == 16 and all(0 <= int(i) < 10000 for i in deep.split())
    assert all(w.endswith(":1") for w in wide.split()) and click in ("0", "1")
    clicks = {ln.rsplit("\t", 1)[1] for ln in lines}
    assert clicks == {"0", "1"}
