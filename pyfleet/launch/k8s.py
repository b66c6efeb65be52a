"""``pyfleet train --emit-k8s DIR``: the Kubernetes manifests of the same job.

One file, ``DIR/pyfleet-job.yaml`` (``kubectl apply -f DIR``), and the job file it runs,
``DIR/job.json`` (also inside the manifest, as a ConfigMap):

- a PersistentVolumeClaim ``<name>-run`` (ReadWriteMany), mounted at :data:`RUN_DIR` in
  every pod: the run directory (checkpoint, model, logs of the roles, progress);
- a ConfigMap ``<name>-job`` holding ``job.json``, the settings ``pyfleet train`` would run
  here, with the run directory and the data at their paths in the pods;
- a headless Service ``<name>-server``: server i is ``<name>-server-i.<name>-server``;
- two Indexed Jobs (Kubernetes >= 1.24), ``<name>-server`` and ``<name>-worker``, whose
  pods take their index from the ``batch.kubernetes.io/job-completion-index`` annotation as
  ``PYFLEET_SERVER_INDEX`` / ``PYFLEET_WORKER_INDEX``: the environment contract of
  docs/fleet.md, the same as the local launcher's and ``--hosts``'.

The data: with ``--train``, a PersistentVolumeClaim ``<name>-data`` mounted read-only at
:data:`DATA_DIR`, holding the files by their base names; without, each worker's init
container writes the same generated data set (``pyfleet gen-data``, deterministic) into
its own ``emptyDir``. Servers authenticate clients with the CURVE keys of the Secret
``<name>-keys`` (its command is in the manifest's header), as examples/k8s/pyfleet-job.yaml.
The image is built from examples/k8s/Dockerfile.
"""

from __future__ import annotations

import json
import os

__all__ = ["DATA_DIR", "RUN_DIR", "manifests", "to_yaml", "write_manifests"]

RUN_DIR = "/pyfleet/run"
DATA_DIR = "/pyfleet/data"
JOB_DIR = "/pyfleet/job"
KEYS_DIR = "/etc/pyfleet/keys"
DEFAULT_IMAGE = "pyfleet-train:latest"
DEFAULT_PORT = 6000
_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def _scalar(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return json.dumps(v)
    return json.dumps(str(v))  # a double-quoted YAML scalar


def to_yaml(obj, indent=0):
    """Block-style YAML of dicts, lists and scalars (strings double-quoted)."""
    pad = " " * indent
    lines = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, str) and "\n" in v:  # a file's text: a literal block
                lines.append(f"{pad}{k}: |")
                lines.extend(f"{pad}  {line}" for line in v.split("\n"))
            elif isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{k}:")
                lines.append(to_yaml(v, indent + 2))
            else:
                lines.append(f"{pad}{k}: {_scalar(v) if not isinstance(v, (dict, list)) else json.dumps(v)}")
    elif isinstance(obj, list):
        for v in obj:
            if isinstance(v, (dict, list)) and v:
                inner = to_yaml(v, indent + 2).split("\n")
                lines.append(f"{pad}- {inner[0].lstrip()}")
                lines.extend(inner[1:])
            else:
                lines.append(f"{pad}- {_scalar(v) if not isinstance(v, (dict, list)) else json.dumps(v)}")
    else:
        lines.append(pad + _scalar(obj))
    return "\n".join(lines)


def _pod_paths(job, generated):
    """The job with its run directory and data at their paths in the pods."""
    out = dict(job, run_dir=RUN_DIR, resume=None)

    def inside(p):
        return None if p is None else f"{DATA_DIR}/{os.path.basename(os.path.normpath(p))}"

    if generated:
        out.update(train=f"{DATA_DIR}/train.tsv", test=f"{DATA_DIR}/test.tsv")
    else:
        for key in ("train", "test"):
            v = job.get(key)
            out[key] = [inside(p) for p in v] if isinstance(v, list) else inside(v)
    return out


def manifests(job, servers, workers, *, image=None, name="pyfleet", port=DEFAULT_PORT,
              generated=None):
    """``(documents, pod_job)``: the manifests (dicts) and the job file the pods run.
    ``generated``: ``(rows, seed)`` of the generated data set, None with ``--train``."""
    image = image or DEFAULT_IMAGE
    pod_job = _pod_paths(job, generated)
    svc = f"{name}-server"
    eps = ",".join(f"{svc}-{i}.{svc}:{port}" for i in range(servers))
    contract = [{"name": "PYFLEET_SERVER_ENDPOINTS", "value": eps},
                {"name": "PYFLEET_WORKER_NUM", "value": str(workers)},
                {"name": "PYFLEET_MODE", "value": job["mode"]},
                {"name": "PYFLEET_CHECKPOINT_DIR", "value": RUN_DIR},
                {"name": "PYFLEET_CURVE_DIR", "value": KEYS_DIR},
                {"name": "OPENBLAS_NUM_THREADS", "value": "1"},
                {"name": "PYTHONUNBUFFERED", "value": "1"}]
    mounts = [{"name": "run", "mountPath": RUN_DIR},
              {"name": "job", "mountPath": JOB_DIR, "readOnly": True},
              {"name": "keys", "mountPath": KEYS_DIR, "readOnly": True}]
    volumes = [{"name": "run", "persistentVolumeClaim": {"claimName": f"{name}-run"}},
               {"name": "job", "configMap": {"name": f"{name}-job"}}]
    data_volume = ({"name": "data", "emptyDir": {}} if generated else
                   {"name": "data", "persistentVolumeClaim": {"claimName": f"{name}-data",
                                                              "readOnly": True}})
    command = ["python", "-m", "pyfleet.trainer", f"{JOB_DIR}/job.json"]

    def keys(role):
        items = ([{"key": "server.key", "path": "server.key"},
                  {"key": "server.key_secret", "path": "server.key_secret"},
                  {"key": "client.key", "path": "authorized_clients/client.key"}]
                 if role == "server" else
                 [{"key": "server.key", "path": "server.key"},
                  {"key": "client.key", "path": "client.key"},
                  {"key": "client.key_secret", "path": "client.key_secret"}])
        return {"name": "keys", "secret": {"secretName": f"{name}-keys", "defaultMode": 0o400,
                                           "items": items}}

    def indexed_job(role, count):
        index_var = "PYFLEET_SERVER_INDEX" if role == "server" else "PYFLEET_WORKER_INDEX"
        container = {
            "name": role, "image": image, "command": command, "workingDir": RUN_DIR,
            "env": [{"name": "PYFLEET_ROLE", "value": role},
                    {"name": index_var, "valueFrom": {"fieldRef": {"fieldPath": _INDEX}}},
                    *contract],
            "volumeMounts": list(mounts)}
        spec = {"restartPolicy": "Never", "containers": [container],
                "volumes": [*volumes, keys(role)]}
        if role == "server":
            container["ports"] = [{"containerPort": port}]
            spec["subdomain"] = svc
            if job.get("spill_dir"):  # the rows beyond --memory-budget: the pod's own disk
                container["volumeMounts"].append({"name": "spill",
                                                  "mountPath": job["spill_dir"]})
                spec["volumes"].append({"name": "spill", "emptyDir": {}})
        else:
            container["volumeMounts"].append({"name": "data", "mountPath": DATA_DIR,
                                              "readOnly": not generated})
            spec["volumes"].append(data_volume)
            if generated:
                rows, seed = generated
                spec["initContainers"] = [{
                    "name": "data", "image": image,
                    "command": ["pyfleet", "gen-data", "--rows", str(rows), "--seed", str(seed),
                                "--out", DATA_DIR],
                    "volumeMounts": [{"name": "data", "mountPath": DATA_DIR}]}]
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": f"{name}-{role}"},
                "spec": {"completionMode": "Indexed", "completions": count,
                         "parallelism": count,
                         "backoffLimit": 0,  # a dead role fails the job: --resume continues it
                         "template": {"metadata": {"labels": {"app": name,
                                                              "pyfleet-role": role}},
                                      "spec": spec}}}

    docs = [
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": {"name": f"{name}-run"},
         "spec": {"accessModes": ["ReadWriteMany"],
                  "resources": {"requests": {"storage": "20Gi"}}}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-job"},
         "data": {"job.json": json.dumps(pod_job, indent=1)}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": svc},
         "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                  "selector": {"app": name, "pyfleet-role": "server"},
                  "ports": [{"name": "pserver", "port": port}]}},
        indexed_job("server", servers),
        indexed_job("worker", workers),
    ]
    return docs, pod_job


HEADER = """\
# The Kubernetes manifests of a pyfleet train job ({servers} server(s), {workers} worker(s),
# {mode}), written by `pyfleet train --emit-k8s` (docs/scaleout.md).
#
#   docker build -f examples/k8s/Dockerfile -t {image} .     # from a pyfleet checkout
#   pyfleet keygen keys && kubectl create secret generic {name}-keys \\
#       --from-file=keys/server.key --from-file=keys/server.key_secret \\
#       --from-file=keys/client.key --from-file=keys/client.key_secret
{data_step}#   kubectl apply -f {path}
#
# The run directory (checkpoint, model/, the roles' progress) is the volume {name}-run,
# mounted at {run_dir} in every pod: it must be ReadWriteMany (NFS, CephFS, EFS, ...), set a
# storageClassName that provides it and size it with `pyfleet plan`.
"""


def write_manifests(out_dir, job, servers, workers, *, image=None, name="pyfleet",
                    port=DEFAULT_PORT, generated=None):
    """Write ``out_dir/pyfleet-job.yaml`` and ``out_dir/job.json``; returns the manifest's
    path."""
    docs, pod_job = manifests(job, servers, workers, image=image, name=name, port=port,
                              generated=generated)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "pyfleet-job.yaml")
    data_step = "" if generated else (
        f"#   (the data: a volume {name}-data holding "
        f"{', '.join(sorted({os.path.basename(str(p)) for p in _flat(pod_job)}))})\n")
    header = HEADER.format(servers=servers, workers=workers, mode=job["mode"],
                           image=image or DEFAULT_IMAGE, name=name, path=out_dir,
                           data_step=data_step, run_dir=RUN_DIR)
    with open(path, "w") as f:
        f.write(header + "\n---\n".join(to_yaml(d) for d in docs) + "\n")
    with open(os.path.join(out_dir, "job.json"), "w") as f:
        json.dump(pod_job, f, indent=1)
    return path


def _flat(pod_job):
    for key in ("train", "test"):
        v = pod_job.get(key)
        yield from ([] if v is None else v if isinstance(v, list) else [v])
