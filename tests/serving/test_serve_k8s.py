"""The serving target of examples/k8s: the Dockerfile's `serve` stage installs the
wheel with its serve extra and runs `pyfleet serve`; the Deployment's arguments are
options `pyfleet serve` accepts, its readiness is GET /healthz on the served port, and
it follows the directory the training job writes its inference model to."""

import json

import pytest
from support import REPO

K8S = REPO / "examples" / "k8s"


def _serve_stage():
    lines, pending, stage = [], "", None
    for line in (K8S / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip("\\").strip() + " "
        if line.endswith("\\"):
            continue
        word, _, rest = pending.strip().partition(" ")
        pending = ""
        if word.upper() == "FROM":
            stage = rest.split()[-1] if " AS " in rest else None
        elif stage == "serve":
            lines.append((word.upper(), rest))
    return lines


def test_dockerfile_serve_stage_installs_the_extra_and_runs_pyfleet_serve():
    stage = _serve_stage()
    assert ("COPY", "--from=build /wheels /wheels") in stage
    installs = [r for w, r in stage if w == "RUN" and "pip install" in r]
    assert len(installs) == 1 and '"$(ls /wheels/*.whl)[serve]"' in installs[0]
    entry = json.loads(dict(stage)["ENTRYPOINT"])
    assert entry[:2] == ["pyfleet", "serve"] and entry[entry.index("--port") + 1] == "8080"
    assert entry[entry.index("--host") + 1] == "0.0.0.0"
    assert dict(stage)["EXPOSE"] == "8080"


def test_deployment_is_ready_on_healthz_with_options_pyfleet_serve_accepts():
    yaml = pytest.importorskip("yaml")
    from pyfleet.cli.parser import build_parser
    docs = list(yaml.safe_load_all((K8S / "pyfleet-serve.yaml").read_text()))
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    service = next(d for d in docs if d["kind"] == "Service")
    pod = deploy["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    entry = json.loads(dict(_serve_stage())["ENTRYPOINT"])
    args = build_parser()[0].parse_args(entry[1:] + c["args"])  # refused options exit
    assert args.command == "serve" and args.port == 8080 and args.follow
    assert (args.memory_budget is None) == (args.spill_dir is None)
    port = next(p for p in c["ports"] if p["name"] == "http")["containerPort"]
    assert port == args.port
    probe = c["readinessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and probe["port"] in ("http", port)
    assert service["spec"]["ports"][0]["targetPort"] in ("http", port)
    assert service["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
    # it follows what the training job's worker 0 writes, on the same claim
    job = (K8S / "pyfleet-job.yaml").read_text()
    assert f'"--inference-dir", "{args.follow}"' in job
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
              if "persistentVolumeClaim" in v}
    assert any(args.follow.startswith(mounts[name]) for name in claims)
    assert args.spill_dir.startswith(mounts["spill"])
