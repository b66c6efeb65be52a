"""A ``pyfleet serve`` process on 127.0.0.1 for the serving tests, and a small client."""

import json
import os
import queue
import subprocess
import sys
import threading
import urllib.error
import urllib.request

from support.wait import wait_until


class ServeProcess:
    """``python -m pyfleet.cli serve ARGS --port 0`` (or ``python LAUNCHER serve
    ...``) started, its port read from
    its first line, and (``ready=True``) ``/healthz`` answering 200; always
    stopped by :meth:`close` (a context manager)."""

    def __init__(self, *args, cwd, ready=True, timeout=120, launcher=("-m", "pyfleet.cli")):
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, *launcher, "serve", "--port", "0", *map(str, args)],
            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stderr_lines = []
        lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc.stdout, lines), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, None), daemon=True).start()
        try:
            first = lines.get(timeout=timeout)
        except queue.Empty:
            self.close()
            raise AssertionError(f"pyfleet serve printed nothing in {timeout} s: "
                                 f"{self.stderr_text()}") from None
        if not first.startswith("pyfleet serve: listening on "):
            self.close()
            raise AssertionError(f"pyfleet serve said {first!r}: {self.stderr_text()}")
        self.url = first.rsplit(" ", 1)[1].strip()
        self.port = int(self.url.rsplit(":", 1)[1])
        if ready:
            self.wait_ready(timeout)

    def _pump(self, stream, out):
        with stream:  # closed at its end: the pipe is not left to the garbage collector
            for line in stream:
                if out is not None:
                    out.put(line)
                else:
                    self.stderr_lines.append(line)

    def stderr_text(self):
        return "".join(self.stderr_lines)

    def wait_ready(self, timeout=120):
        def healthy():
            if self.proc.poll() is not None:
                raise AssertionError(f"pyfleet serve exited with {self.proc.returncode}: "
                                     f"{self.stderr_text()}")
            return request(self.url + "/healthz", timeout=5)[0] == 200
        wait_until(healthy, timeout, "/healthz", interval=0.05, detail=self.stderr_text)

    def wait_for(self, predicate, timeout=60, what="the condition"):
        wait_until(predicate, timeout, what, interval=0.05, detail=self.stderr_text)

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def request(url, body=None, content_type=None, accept=None, timeout=30, method=None):
    """``(status, headers, body bytes)`` of one HTTP request (urllib, a real client)."""
    headers = {}
    if content_type:
        headers["Content-Type"] = content_type
    if accept:
        headers["Accept"] = accept
    req = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
    except (urllib.error.URLError, ConnectionError):
        return None, {}, b""


def criteo_json_rows(tsv_lines):
    """Criteo TSV lines (str) as JSON rows of named columns (absent values left out)."""
    rows = []
    for line in tsv_lines:
        f = line.split("\t")
        row = {f"I{i}": float(f[i]) for i in range(1, 14) if f[i]}
        row.update({f"C{i}": f[13 + i] for i in range(1, 27) if f[13 + i]})
        rows.append(row)
    return rows


def slot_json_rows(slot_lines):
    """PaddleRec slot-format lines (str) as JSON rows: ``dense_feature`` and a list
    of ids per slot (a single id as a number)."""
    rows = []
    for line in slot_lines:
        row = {"dense_feature": []}
        for tok in line.split():
            name, value = tok.split(":")
            if name == "dense_feature":
                row["dense_feature"].append(float(value))
            elif name != "click":
                row.setdefault(name, []).append(int(value))
        rows.append({k: (v[0] if k != "dense_feature" and len(v) == 1 else v)
                     for k, v in row.items()})
    return rows


def predict(url, body, content_type, timeout=30):
    """``(predictions list, model version)`` of a 200 answer; AssertionError otherwise."""
    status, _, out = request(url + "/predict", body, content_type, timeout=timeout)
    assert status == 200, (status, out[:300])
    doc = json.loads(out)
    return doc["predictions"], doc["model_version"]
