"""`pyfleet serve` through a real HTTP client against a real server process on
127.0.0.1: its predictions are `pyfleet predict`'s, a version swap under
concurrent clients shows only whole versions, every bad input is one 4xx line,
a killed server leaves nothing behind, /metrics parses as Prometheus text."""

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from support import DATA
from support.cli import save_small_model
from support.serving import (
    ServeProcess,
    criteo_json_rows,
    predict,
    request,
    slot_json_rows,
)

pytest.importorskip("httptools")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TSV = DATA / "criteo-paddlerec-part0" / "part-0.tsv"
CSV = DATA / "criteo-kaggle-tiny" / "train.tiny.csv"
SLOT = DATA / "criteo-paddlerec-dnn-slot" / "sample_train.txt"
if not (TSV.exists() and CSV.exists() and SLOT.exists()):
    pytest.skip("shared Criteo samples missing", allow_module_level=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two versions of one network: 1 and 3 passes over the Kaggle rows."""
    root = tmp_path_factory.mktemp("models")
    return (save_small_model(root / "v1", CSV, format="csv", batch_size=200, passes=1),
            save_small_model(root / "v2", CSV, format="csv", batch_size=200, passes=3))


def pyfleet_predict(model, data, fmt, tmp_path):
    out = tmp_path / f"pred-{fmt}.txt"
    r = subprocess.run([sys.executable, "-m", "pyfleet.cli", "predict", "--model", model,
                        "--data", data, "--format", fmt, "--out", out],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return np.loadtxt(out)


def test_predictions_equal_pyfleet_predict_in_every_request_form(models, tmp_path):
    v1 = models[0]
    want_tsv = pyfleet_predict(v1, TSV, "criteo", tmp_path)
    want_csv = pyfleet_predict(v1, CSV, "csv", tmp_path)
    want_slot = pyfleet_predict(v1, SLOT, "slot", tmp_path)
    lines = TSV.read_text().splitlines()
    with ServeProcess("--model", v1, cwd=tmp_path) as s:
        got, version = predict(s.url, TSV.read_bytes(), "text/tab-separated-values")
        assert version.startswith("v1@")
        np.testing.assert_allclose(got, want_tsv, rtol=1e-6, atol=1e-7)
        unlabelled = "\n".join(line.split("\t", 1)[1] for line in lines).encode()
        got, _ = predict(s.url, unlabelled, "text/tab-separated-values")
        np.testing.assert_allclose(got, want_tsv, rtol=1e-6, atol=1e-7)
        got, _ = predict(s.url, CSV.read_bytes(), "text/csv")  # CRLF, Id and Label columns
        np.testing.assert_allclose(got, want_csv, rtol=1e-6, atol=1e-7)
        got, _ = predict(s.url, SLOT.read_bytes(), "text/plain")
        np.testing.assert_allclose(got, want_slot, rtol=1e-6, atol=1e-7)
        body = json.dumps({"rows": criteo_json_rows(lines)}).encode()
        got, _ = predict(s.url, body, "application/json")
        np.testing.assert_allclose(got, want_tsv, rtol=1e-6, atol=1e-7)
        # one row at a time: the same numbers as inside a batch
        for i in (0, 17, 99):
            one = {"rows": criteo_json_rows(lines[i:i + 1])}
            got, _ = predict(s.url, json.dumps(one).encode(), "application/json")
            assert got == pytest.approx([want_tsv[i]], rel=1e-6, abs=1e-7)
        # slot-form JSON rows: dense_feature as is, ids per slot
        slot_rows = slot_json_rows(SLOT.read_text().splitlines()[:5])
        got, _ = predict(s.url, json.dumps({"rows": slot_rows}).encode(), "application/json")
        np.testing.assert_allclose(got, want_slot[:5], rtol=1e-6, atol=1e-7)
        # the numpy form: a Batch's arrays in, float32 .npy out
        from pyfleet.data import Dataset
        batch = next(iter(Dataset(str(TSV), format="criteo", batch_size=1000)))
        buf = io.BytesIO()
        np.savez(buf, dense=batch.dense, ids=batch.ids_matrix())
        status, headers, out = request(s.url + "/predict", buf.getvalue(), "application/x-npz",
                                       accept="application/x-npy")
        assert status == 200, out
        assert headers["X-Model-Version"] == version
        got = np.load(io.BytesIO(out), allow_pickle=False)
        assert got.dtype == np.float32 and got.shape == want_tsv.shape
        np.testing.assert_allclose(got, want_tsv, rtol=1e-6, atol=1e-7)


def test_storage_type_and_disk_tier_serve_the_same_model(models, tmp_path):
    v1 = models[0]
    want = pyfleet_predict(v1, TSV, "criteo", tmp_path)
    spill = tmp_path / "spill"
    with ServeProcess("--model", v1, "--storage", "fp16", "--memory-budget", "64K",
                      "--spill-dir", spill, cwd=tmp_path) as s:
        status, _, info = request(s.url + "/model")
        info = json.loads(info)
        table = info["tables"]["SparseFeatFactors"]
        assert table["storage"] == "fp16" and table["memory_budget"] == 64 << 10
        got, _ = predict(s.url, TSV.read_bytes(), "text/tab-separated-values")
        # fp16 rows: about 3 significant digits of each weight
        np.testing.assert_allclose(got, want, atol=2e-3)
        assert not np.array_equal(np.asarray(got), want)
        from prometheus_client.parser import text_string_to_metric_families
        _, _, text = request(s.url + "/metrics")
        fams = {f.name: f for f in text_string_to_metric_families(text.decode())}
        tiers = {smp.labels["tier"]: smp.value for smp in fams["pyfleet_serve_table_rows"].samples}
        assert tiers["disk"] > 0 and tiers["ram"] + tiers["disk"] == table["rows"]


BAD = [
    ("malformed row", b"1\tx" + b"\t" * 38 + b"\n", "text/tab-separated-values", 400,
     "line 1: malformed (bad dense value)"),
    ("wrong field count", b"1\t2\t3\n", "text/tab-separated-values", 400,
     "line 1 has 3 tab-separated fields"),
    ("wrong JSON column", b'{"rows": [{"I1": 1}, {"Z9": 2}]}', "application/json", 400,
     "row 2: unknown column 'Z9'"),
    ("JSON of the wrong type", b'{"rows": [{"C1": [1.5]}]}', "application/json", 400,
     "row 1: column 'C1' holds list"),
    ("not JSON", b"{rows: ", "application/json", 400, "the body is not valid JSON"),
    ("no row", b'{"rows": []}', "application/json", 400, "the request holds no row"),
    ("wrong content type", b"a=1", "application/x-www-form-urlencoded", 415,
     "Content-Type 'application/x-www-form-urlencoded' is not served"),
    ("too many rows", b"\n".join([b"\t" * 38] * 51), "text/tab-separated-values", 413,
     "the request holds 51 rows, more than --max-rows 50"),
    ("oversized body", b'{"rows": [' + b'{"I1": 1},' * 500 + b'{"I1": 1}]}',
     "application/json", 413, "more than --max-body-bytes 4,096"),
    ("CSV of another model", b"label,I1,C1\n1,2,ab\n", "text/csv", 400,
     "the CSV header names 1 I<k> and 1 C<k> columns; the model reads 13 and 26"),
    ("npz of the wrong shape", None, "application/x-npz", 400, "npz 'ids' is uint64 (2, 3)"),
]


def test_every_bad_input_is_one_4xx_line_and_the_server_keeps_serving(models, tmp_path):
    good = TSV.read_bytes().splitlines()[0] + b"\n"
    with ServeProcess("--model", models[0], "--max-rows", "50", "--max-body-bytes", "4K",
                      cwd=tmp_path) as s:
        for what, body, ctype, status, text in BAD:
            if body is None:
                buf = io.BytesIO()
                np.savez(buf, dense=np.zeros((2, 13), np.float32),
                         ids=np.zeros((2, 3), np.uint64))
                body = buf.getvalue()
            got, _, out = request(s.url + "/predict", body, ctype)
            assert got == status, (what, got, out)
            msg = out.decode()
            assert msg.endswith("\n") and msg.count("\n") == 1, (what, msg)
            assert text in msg, (what, msg)
            assert predict(s.url, good, "text/tab-separated-values")[0]  # still serving
        assert request(s.url + "/predict", method="GET")[0] == 405
        assert s.proc.poll() is None
        from prometheus_client.parser import text_string_to_metric_families
        _, _, text = request(s.url + "/metrics")
        fams = {f.name: f for f in text_string_to_metric_families(text.decode())}
        codes = {smp.labels["code"]: smp.value for smp in fams["pyfleet_serve_requests"].samples
                 if smp.name == "pyfleet_serve_requests_total"}
        # (one 200 more: the readiness check's GET /healthz)
        assert codes["200"] == len(BAD) + 1 and codes["400"] == 8 and codes["413"] == 2
        assert codes["415"] == 1 and codes["405"] == 1


def test_metrics_parse_as_prometheus_text_and_count_what_happened(models, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families
    lines = TSV.read_bytes().splitlines()
    with ServeProcess("--model", models[0], cwd=tmp_path) as s:
        for n in (1, 3, 10):
            predict(s.url, b"\n".join(lines[:n]), "text/tab-separated-values")
        threads = [threading.Thread(target=predict, args=(s.url, lines[i], "text/tab-"
                                                          "separated-values"))
                   for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        _, headers, text = request(s.url + "/metrics")
        assert headers["Content-Type"].startswith("text/plain")
        fams = {f.name: f for f in text_string_to_metric_families(text.decode())}
    samples = {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
               for f in fams.values() for smp in f.samples}
    assert samples[("pyfleet_serve_rows_total", ())] == 14 + 32
    assert samples[("pyfleet_serve_request_duration_seconds_count", ())] == 3 + 32
    assert samples[("pyfleet_serve_requests_total", (("code", "200"),))] == 1 + 3 + 32
    steps = samples[("pyfleet_serve_batch_rows_count", ())]
    assert samples[("pyfleet_serve_batch_rows_sum", ())] == 14 + 32
    assert steps < 3 + 32, "32 concurrent single-row requests never shared a model step"
    info = list(fams["pyfleet_serve_model_info"].samples)
    assert len(info) == 1 and info[0].labels["version"].startswith("v1@")
    assert fams["pyfleet_serve_request_duration_seconds"].type == "histogram"


def _commit_version(src, models_dir, name):
    """Copy a model into ``models_dir/name`` the way a publisher should: written
    beside, then renamed into place in one step."""
    tmp = models_dir / f".{name}.tmp"
    shutil.copytree(src, tmp)
    os.rename(tmp, models_dir / name)


def test_swap_under_concurrent_clients_shows_only_whole_versions(models, tmp_path):
    v1, v2 = models
    body = b"\n".join(TSV.read_bytes().splitlines()[:20])
    want = {"1": pyfleet_predict(v1, TSV, "criteo", tmp_path)[:20],
            "2": pyfleet_predict(v2, TSV, "criteo", tmp_path)[:20]}
    assert np.abs(want["1"] - want["2"]).max() > 1e-3  # the versions can be told apart
    models_dir = tmp_path / "models"
    models_dir.mkdir()
    _commit_version(v1, models_dir, "1")
    answers, failures, stop = [], [], threading.Event()

    def client():
        while not stop.is_set():
            status, _, out = request(s.url + "/predict", body, "text/tab-separated-values")
            if status != 200:
                failures.append((status, out))
            else:
                doc = json.loads(out)
                answers.append((doc["model_version"], doc["predictions"]))

    with ServeProcess("--follow", models_dir, "--poll-interval", "0.1", cwd=tmp_path) as s:
        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        try:
            s.wait_for(lambda: len(answers) > 20, what="answers from version 1")
            _commit_version(v2, models_dir, "2")
            s.wait_for(lambda: answers and answers[-1][0].startswith("2@"), what="the swap")
            n = len(answers)
            s.wait_for(lambda: len(answers) > n + 20, what="answers after the swap")
            # a damaged version 3 is refused by name; version 2 keeps serving
            tmp = tmp_path / "v3"
            shutil.copytree(v2, tmp)
            w = sorted(tmp.glob("fc_*.w_0.npy"))[0]
            data = bytearray(w.read_bytes())
            data[-1] ^= 0xFF
            w.write_bytes(bytes(data))
            os.rename(tmp, models_dir / "3")
            s.wait_for(lambda: "refused" in s.stderr_text(), what="the refusal")
            n = len(answers)
            s.wait_for(lambda: len(answers) > n + 20, what="answers after the refusal")
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
        assert "models/3" in s.stderr_text() and w.name in s.stderr_text()
        _, _, text = request(s.url + "/metrics")
        assert "pyfleet_serve_model_load_failures_total 1" in text.decode()
        assert "pyfleet_serve_model_swaps_total 1" in text.decode()
    assert not failures, failures[:3]
    seen = set()
    for version, preds in answers:
        key = version.split("@")[0]
        seen.add(key)
        np.testing.assert_allclose(preds, want[key], rtol=1e-6, atol=1e-7)
    assert seen == {"1", "2"}
    assert answers[-1][0].startswith("2@")


def _port_is_free(port):
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_a_killed_server_leaves_nothing_behind(models, tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    work = tmp_path / "cwd"
    work.mkdir()
    s = ServeProcess("--model", models[0], "--memory-budget", "64K", "--spill-dir", spill,
                     cwd=work)
    try:
        predict(s.url, TSV.read_bytes(), "text/tab-separated-values")
        _, _, text = request(s.url + "/metrics")
        assert 'tier="disk"} 0\n' not in text.decode()  # rows on disk while it runs
        os.kill(s.proc.pid, signal.SIGKILL)
        assert s.proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        s.close()
    assert os.listdir(spill) == [] and os.listdir(work) == []
    assert _port_is_free(s.port)


def test_refused_options_and_an_unloadable_model_are_named(models, tmp_path):
    def serve(*args):
        return subprocess.run([sys.executable, "-m", "pyfleet.cli", "serve", "--port", "0",
                               *map(str, args)], capture_output=True, text=True, timeout=120)
    r = serve()
    assert r.returncode != 0 and "give --model DIR, --follow DIR" in r.stderr
    r = serve("--model", models[0], "--memory-budget", "1G")
    assert r.returncode != 0 and "--memory-budget and --spill-dir go together" in r.stderr
    r = serve("--model", models[0], "--max-rows", "0")
    assert r.returncode != 0 and "max-rows must be an integer >= 1" in r.stderr
    broken = tmp_path / "broken"
    shutil.copytree(models[0], broken)
    bias = sorted(broken.glob("fc_*.b_0.npy"))[0]
    bias.unlink()
    r = serve("--model", broken)
    assert r.returncode == 1 and f"{bias.name} is missing" in r.stderr


def test_follow_a_training_run_serves_its_storage_type_and_swaps_in_a_retrained_model(tmp_path):
    run = tmp_path / "run"

    def train(*extra):
        r = subprocess.run([sys.executable, "-m", "pyfleet.cli", "train", "--rows", "4000",
                            "--workers", "1", "--storage", "fp16", "--embedding-dim", "4",
                            "--layers", "8", "--run-dir", run, "--quiet", *extra],
                           capture_output=True, text=True, timeout=240,
                           env={**os.environ, "OPENBLAS_NUM_THREADS": "1",
                                "PYFLEET_CACHE_DIR": str(tmp_path / "cache")})
        assert r.returncode == 0, r.stderr
    train()
    data = Path(json.loads((run / "job.json").read_text())["test"])  # the generated test rows
    want = pyfleet_predict(run / "model", data, "criteo", tmp_path)
    with ServeProcess("--follow", run, "--poll-interval", "0.2", cwd=tmp_path) as s:
        info = json.loads(request(s.url + "/model")[2])
        assert info["path"] == str(run / "model")
        assert info["tables"]["SparseFeatFactors"]["storage"] == "fp16"  # as trained
        got, first = predict(s.url, data.read_bytes(), "text/tab-separated-values")
        # fp16 rows hold the trained weights exactly: the same numbers as pyfleet predict
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        train("--overwrite", "--seed", "7")
        want2 = pyfleet_predict(run / "model", data, "criteo", tmp_path)
        s.wait_for(lambda: predict(s.url, b"\t" * 38, "text/tab-separated-values")[1] != first,
                   what="the retrained model")
        got, second = predict(s.url, data.read_bytes(), "text/tab-separated-values")
        assert second.startswith("model@") and second != first
        np.testing.assert_allclose(got, want2, rtol=1e-6, atol=1e-7)


def test_a_stalled_body_is_408_and_frees_its_slot(models, tmp_path):
    with ServeProcess("--model", models[0], "--read-timeout", "1", "--max-concurrent", "1",
                      cwd=tmp_path) as s:
        with socket.create_connection(("127.0.0.1", s.port), timeout=30) as sock:
            sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: text/csv\r\n"
                         b"Content-Length: 1000\r\n\r\nI1,C1\n")  # then nothing more
            # while it stalls, it holds the one slot (once the server has read its head)
            s.wait_for(lambda: b"pyfleet_serve_in_flight_requests 1" in
                       request(s.url + "/metrics")[2], 30, "the stalled request's slot")
            status, _, out = request(s.url + "/predict", b"\t" * 38, "text/tab-separated-values")
            assert status == 429 and b"--max-concurrent 1" in out
            reply = sock.recv(4096)
        assert reply.startswith(b"HTTP/1.1 408") and b"--read-timeout 1 s" in reply
        assert predict(s.url, b"\t" * 38, "text/tab-separated-values")[0]


def test_following_an_empty_directory_is_not_ready_until_a_version_is_committed(
        models, tmp_path):
    models_dir = tmp_path / "models"
    models_dir.mkdir()
    with ServeProcess("--follow", models_dir, "--poll-interval", "0.1", cwd=tmp_path,
                      ready=False) as s:
        status, _, out = request(s.url + "/healthz")
        assert status == 503 and json.loads(out)["status"] == "loading"
        status, _, out = request(s.url + "/predict", b"\t" * 38, "text/tab-separated-values")
        assert status == 503 and out.decode().count("\n") == 1
        _commit_version(models[0], models_dir, "7")
        s.wait_ready(60)
        assert predict(s.url, b"\t" * 38, "text/tab-separated-values")[1].startswith("7@")
        s.proc.send_signal(signal.SIGTERM)  # stops cleanly
        assert s.proc.wait(timeout=60) == 0


def test_without_uvloop_the_server_runs_on_asyncio_s_own_loop(models, tmp_path):
    # (uvloop is not on Windows): the same answers, keep-alive and refusals
    code = ("import sys; sys.modules['uvloop'] = None; from pyfleet.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    line = TSV.read_bytes().splitlines()[0]
    with ServeProcess("--model", models[0], cwd=tmp_path, launcher=("-c", code)) as s:
        got, version = predict(s.url, line, "text/tab-separated-values")
        status, _, out = request(s.url + "/predict", b"1\t2\n", "text/tab-separated-values")
        assert status == 400 and out.count(b"\n") == 1
        s.wait_for(lambda: "event loop: asyncio's own" in s.stderr_text(), what="its log")
        with ServeProcess("--model", models[0], cwd=tmp_path) as fast:  # on uvloop
            assert predict(fast.url, line, "text/tab-separated-values") == (got, version)
            fast.wait_for(lambda: "event loop: uvloop" in fast.stderr_text(), what="its log")
