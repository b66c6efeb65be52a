"""The Kubernetes example can run: examples/k8s/Dockerfile builds pyfleet's
wheel from the checkout and holds examples/fleet_ctr.py, the manifest runs that script
with the image's paths and keeps its checkpoints on a persistent volume; the pods'
commands, with the volumes as local directories, train and save on 127.0.0.1."""

import os
import shlex
import subprocess
import sys

import pytest
from support import REPO

K8S = REPO / "examples" / "k8s"


def _instructions():
    """``[(INSTRUCTION, arguments)]`` of the Dockerfile (continuations joined)."""
    out, pending = [], ""
    for line in (K8S / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def _stages():
    stages = []
    for word, rest in _instructions():
        if word == "FROM":
            stages.append([])
        stages[-1].append((word, rest))
    return stages


def test_dockerfile_builds_the_wheel_from_the_checkout_and_holds_the_example():
    text = (K8S / "Dockerfile").read_text()
    for quote in ("", "'", '"'):  # never the index's project of that name
        assert "pip install " + quote + "pyfleet" not in text
    stages = _stages()
    build, run = stages[0], stages[-1]  # (the serve stage between: tests/serving)
    assert build[0][1].endswith(" AS build")
    # the build stage: the whole checkout as the context, the wheel built from it
    assert ("COPY", ". /src") in build and ("WORKDIR", "/src") in build
    wheel = [shlex.split(r) for w, r in build if w == "RUN" and r.startswith("pip wheel")]
    assert len(wheel) == 1 and wheel[0][-1] == "." and "--no-deps" in wheel[0]
    assert "--wheel-dir" in wheel[0] and wheel[0][wheel[0].index("--wheel-dir") + 1] == "/wheels"
    compilers = " ".join(r for w, r in build if w == "RUN" and "apt-get" in r)
    assert all(tool in compilers.split() for tool in ("g++", "cmake", "make"))
    # the run stage: the wheel file installed, the example copied, run outside the checkout
    assert ("COPY", "--from=build /wheels /wheels") in run
    installs = [r for w, r in run if w == "RUN" and "pip install" in r]
    assert len(installs) == 1 and "/wheels/*.whl" in installs[0].split()
    copies = [r.split() for w, r in run if w == "COPY" and not r.startswith("--from")]
    assert copies == [["examples/fleet_ctr.py", "/app/fleet_ctr.py"]]
    assert (REPO / copies[0][0]).is_file()
    workdirs = [r for w, r in run if w == "WORKDIR"]
    assert workdirs == ["/app"]  # not /src: the checkout's pyfleet/ would shadow the wheel
    assert any(w == "RUN" and "import pyfleet._core" in r for w, r in run)
    # the documented build command: the checkout's root as the context
    assert "docker build -f examples/k8s/Dockerfile -t registry.example.com/ctr/pyfleet-train" \
        in text
    ignored = (REPO / ".dockerignore").read_text().split()
    assert "build" in ignored and ".git" in ignored and "runs" in ignored


def _manifest():
    yaml = pytest.importorskip("yaml")
    return list(yaml.safe_load_all((K8S / "pyfleet-job.yaml").read_text()))


def test_manifest_runs_the_image_example_with_checkpoints_on_a_persistent_volume():
    docs = _manifest()
    claims = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert len(claims) == 1 and claims[0]["spec"]["accessModes"] == ["ReadWriteMany"]
    claim = claims[0]["metadata"]["name"]
    text = (K8S / "Dockerfile").read_text()
    for job in (d for d in docs if d["kind"] == "Job"):
        pod = job["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        container = pod["containers"][0]
        assert container["image"].startswith("registry.example.com/ctr/pyfleet-train:")
        assert container["image"].split(":")[0] in text  # the image the Dockerfile builds
        cmd = container["command"]
        assert cmd[:2] == ["python", "/app/fleet_ctr.py"]  # where the Dockerfile put it
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert volumes[mounts["/checkpoints"]]["persistentVolumeClaim"]["claimName"] == claim
        if job["metadata"]["name"] == "pyfleet-worker":
            for flag in ("--model-dir", "--inference-dir"):
                assert cmd[cmd.index(flag) + 1].startswith("/checkpoints/")
            init = pod["initContainers"][0]
            out = init["command"][init["command"].index("--out") + 1]
            assert cmd[cmd.index("--data") + 1] == out + "/train.tsv"  # gen-data's file
            assert {m["mountPath"]: m["name"] for m in init["volumeMounts"]}[out] == \
                mounts[out]
            assert "emptyDir" in volumes[mounts[out]]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_pods_commands_train_and_save_on_the_volume(tmp_path):
    """The init container's and the pods' commands, the volumes as local directories,
    the pods as processes on 127.0.0.1 (1 server, 2 workers)."""
    docs = _manifest()
    jobs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Job"}
    worker = jobs["pyfleet-worker"]["spec"]["template"]["spec"]
    local = {"/data": str(tmp_path / "data"), "/checkpoints": str(tmp_path / "checkpoints"),
             "/app/fleet_ctr.py": str(REPO / "examples" / "fleet_ctr.py")}

    def here(args):
        out = []
        for a in args:
            for k, v in local.items():
                if a == k or a.startswith(k + "/"):
                    a = v + a[len(k):]
            out.append(a)
        return out

    gen = here(worker["initContainers"][0]["command"])
    gen[gen.index("--rows") + 1] = "3000"  # small: the command's shape is what is tested
    r = subprocess.run([sys.executable, "-m", "pyfleet.cli", *gen[1:]], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    os.makedirs(local["/checkpoints"])
    cmd = here(worker["containers"][0]["command"])
    r = subprocess.run([sys.executable, "-m", "pyfleet.launch", "--server_num", "1",
                        "--worker_num", "2", *cmd[1:], "--hidden", "16"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "[worker.0] pass 1 done" in r.stdout and "[worker.1] pass 1 done" in r.stdout
    ckpt = tmp_path / "checkpoints"
    assert (ckpt / "model" / "MANIFEST.json").is_file()      # the servers' shards, committed
    assert (ckpt / "inference" / "__model__.json").is_file()
    r = subprocess.run([sys.executable, "-m", "pyfleet.cli", "predict", "--model",
                        ckpt / "inference", "--data", tmp_path / "data" / "test.tsv",
                        "--out", tmp_path / "p.txt", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
