"""`pyfleet train --emit-k8s DIR`: the manifests of the same job, checked as Kubernetes
would read them, then run: every pod's containers (init containers first) started here as
processes, with the pod's environment (the completion index from the annotation), its
volumes as directories (the run volume shared, the keys Secret's items), and the Service's
DNS names as 127.0.0.1 ports."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from support.cli import pyfleet

from pyfleet.launch import free_ports
from pyfleet.service import auth

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _emit(tmp_path, *extra):
    out = tmp_path / "k8s"
    r = pyfleet("train", "--emit-k8s", out, "--servers", 2, "--workers", 2, "--rows", 4000,
                "--layers", "16", "--embedding-dim", 4, "--run-dir", tmp_path / "run",
                *extra, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "run").exists()  # nothing ran, nothing written here
    return list(yaml.safe_load_all((out / "pyfleet-job.yaml").read_text()))


def test_manifests_describe_the_job(tmp_path):
    docs = _emit(tmp_path, "--image", "registry.example.com/ctr/pyfleet:1", "--mode", "sync",
                 "--memory-budget", "1G", "--spill-dir", tmp_path / "spill")
    kinds = [d["kind"] for d in docs]
    assert kinds == ["PersistentVolumeClaim", "ConfigMap", "Service", "Job", "Job"]
    pvc, cm, svc, servers, workers = docs
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert svc["spec"]["clusterIP"] == "None"
    job = json.loads(cm["data"]["job.json"])
    assert job["run_dir"] == "/pyfleet/run" and job["mode"] == "sync"
    assert job["train"] == "/pyfleet/data/train.tsv" and job["layers"] == [16]
    assert job["memory_budget"] == 1 << 30
    for j, n in ((servers, 2), (workers, 2)):
        assert j["spec"]["completionMode"] == "Indexed" and j["spec"]["completions"] == n
        c = j["spec"]["template"]["spec"]["containers"][0]
        assert c["image"] == "registry.example.com/ctr/pyfleet:1"
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["PYFLEET_SERVER_ENDPOINTS"] == (
            "pyfleet-server-0.pyfleet-server:6000,pyfleet-server-1.pyfleet-server:6000")
        assert env["PYFLEET_WORKER_NUM"] == "2" and env["PYFLEET_MODE"] == "sync"
        assert {"name": "run", "mountPath": "/pyfleet/run"} in c["volumeMounts"]
    spec = servers["spec"]["template"]["spec"]
    assert spec["subdomain"] == svc["metadata"]["name"]
    assert {"name": "spill", "mountPath": str(tmp_path / "spill")} in \
        spec["containers"][0]["volumeMounts"]
    init = workers["spec"]["template"]["spec"]["initContainers"][0]
    assert init["command"][:2] == ["pyfleet", "gen-data"] and "4000" in init["command"]


def test_refused_with_what_it_cannot_write(tmp_path):
    for extra, message in ((["--hosts", "a,b"], "drop --hosts"),
                           (["--mode", "collective"], "--mode collective runs under the MPI"),
                           (["--image", "x"], None)):
        args = ["train", "--rows", 1000, "--run-dir", tmp_path / "run", *extra]
        if message is not None:
            args += ["--emit-k8s", tmp_path / "k8s"]
        r = pyfleet(*args, cwd=tmp_path, timeout=120)
        assert r.returncode != 0, r.stdout
        assert (message or "--image is the container image of --emit-k8s") in r.stderr
    assert not (tmp_path / "k8s").exists() and not (tmp_path / "run").exists()


def test_the_emitted_pods_train_the_job(tmp_path):
    docs = _emit(tmp_path)
    _, cm, svc, server_job, worker_job = docs
    ports = free_ports(2)
    dns = {f"pyfleet-server-{i}.pyfleet-server:6000": f"127.0.0.1:{p}"
           for i, p in enumerate(ports)}
    run, data, jobdir = tmp_path / "vol-run", tmp_path / "vol-data", tmp_path / "vol-job"
    for d in (run, data, jobdir):
        d.mkdir()
    keys = tmp_path / "secret"
    auth.keygen(keys)
    paths = {"/pyfleet/run": str(run), "/pyfleet/data": str(data), "/pyfleet/job": str(jobdir)}

    def local(text):
        for k, v in {**dns, **paths}.items():
            text = text.replace(k, v)
        return text

    (jobdir / "job.json").write_text(local(cm["data"]["job.json"]))

    def start(job, index, init):
        spec = job["spec"]["template"]["spec"]
        secret = next(v["secret"] for v in spec["volumes"] if "secret" in v)
        kdir = tmp_path / f"keys-{job['metadata']['name']}-{index}"
        for item in secret["items"]:
            (kdir / os.path.dirname(item["path"])).mkdir(parents=True, exist_ok=True)
            (kdir / item["path"]).write_bytes((keys / item["key"]).read_bytes())
        procs = []
        for c in spec.get("initContainers", []) if init else spec["containers"]:
            env = dict(os.environ)
            for e in c.get("env", []):
                env[e["name"]] = str(index) if "valueFrom" in e else local(e["value"])
            env["PYFLEET_CURVE_DIR"] = str(kdir)
            argv = [local(a) for a in c["command"]]
            if argv[0] == "pyfleet":
                argv = [sys.executable, "-m", "pyfleet.cli", *argv[1:]]
            else:
                argv[0] = sys.executable
            p = subprocess.Popen(argv, env=env, cwd=local(c.get("workingDir", str(tmp_path))),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if init:
                out = p.communicate(timeout=300)[0]
                assert p.returncode == 0, out
            else:
                procs.append(p)
        return procs

    start(worker_job, 0, init=True)  # gen-data once (each pod's emptyDir holds the same set)
    procs = [p for i in range(2) for p in start(server_job, i, init=False)]
    procs += [p for i in range(2) for p in start(worker_job, i, init=False)]
    outputs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], "\n".join(o[-2000:] for o in outputs)
    assert (run / "checkpoint" / "MANIFEST.json").exists()
    assert (run / "model").is_dir()
    results = [json.loads((run / f"worker{i}.json").read_text()) for i in range(2)]
    assert sum(r["examples"] for r in results) == 3600
