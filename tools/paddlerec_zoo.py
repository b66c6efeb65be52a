"""Run PaddleRec 1.8.5's model zoo through PaddleRec's own runner under pyfleet's
zero-edit mode and print the table of docs/paddlerec.md.

    pip install --no-deps paddle-rec==1.8.5.1 pyyaml     # the framework; not its pinned paddle
    git clone --branch v1.8.5 --depth 1 https://github.com/PaddlePaddle/PaddleRec
    python tools/paddlerec_zoo.py --models-dir PaddleRec/models [--only rank/dnn ...]

For every model, in a copy of the models directory (the originals are never
written): its own ``config.yaml`` with only the runners chosen and their
output paths set (the network, data, hyper-parameters and PaddleRec's code are
untouched), run as ``pyfleet run -m paddlerec.run -m CONFIG``:

- single process: the model's CPU ``train`` runner (at most ``--epochs`` epochs,
  a checkpoint every epoch), then its ``infer`` runner from that checkpoint
  (``init_model_path``; a model whose config names a file the repository
  does not hold is not run: the cell says which and what makes it; a config
  whose infer phase is commented out, as recall/ncf's, gets it as its comment
  says);
- local cluster: a ``local_cluster_train`` runner, 2 servers and 2 workers,
  PaddleRec's default ``async`` strategy, the same epochs, a checkpoint each
  (sample data directories holding one file are split in two, one per worker,
  a file of one line given whole to both; the cell shows worker 0's metric).

recall/fasttext's ``data/dict/word_ngrams_id.txt`` is not in the repository:
its ``data_prepare.sh`` makes it (``preprocess.py``) from the dictionaries it
builds from the one-billion-word corpus it downloads. Those dictionaries are in
the repository (``word_count_dict.txt``: the words, by count, then their
character n-grams; ``word_id_dict.txt``: the id of every entry), and the file is
a function of them alone: for each word (the ``<...>`` entries before the
n-grams start), its id, then the ids of its character n-grams of ``min_n`` to ``max_n``
characters (``hyper_parameters``), an id being the line of the entry's last
occurrence in ``word_count_dict.txt``. :func:`fasttext_ngram_ids` writes it so
into the work copy (n-gram ids ascending: the preprocess wrote them in a set's
order, which its reader does not depend on), after checking that
``word_id_dict.txt`` holds exactly those ids and that every n-gram is an entry;
the cells say the file was derived.

Each training cell is the first logged and the last value of the model's
first reported metric (a loss when it reports one, else e.g. AUC); the infer
cell the last value of the infer phase; or why the run failed: the exception
PaddleRec's runner caught, as it printed it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

import yaml

MODELS = ["rank/logistic_regression", "rank/dnn", "rank/wide_deep", "rank/deepfm",
          "rank/xdeepfm", "rank/dcn", "rank/fm", "rank/ffm", "rank/fnn", "rank/nfm", "rank/pnn",
          "rank/afm", "rank/din", "multitask/mmoe", "multitask/esmm", "multitask/share-bottom",
          "match/dssm", "match/multiview-simnet", "recall/word2vec", "recall/ncf",
          "recall/youtube_dnn", "recall/fasttext"]

METRIC = re.compile(r"(\w+): \[?\s*([-+\d.eE]+|nan|inf)")
GLOBAL = re.compile(r"(\w+)=\[?\s*([-+\d.eE]+|nan|inf)")
FAILED = re.compile(r"except: (.*)")


def _runner(config, kind):
    for r in config.get("runner", []):
        if r.get("class") == kind and str(r.get("device", "cpu")).lower() == "cpu":
            return r
    return None


def _infer_phase(config, train, infer):
    """A config whose infer phase is commented out (it runs every phase, all on
    training data, whose readers yield the label the infer network does not
    feed) gets that phase as its comment tells users to write it: the model
    of its phase on its ``*infer*`` dataset, for the infer runner only."""
    phases = config.get("phase") or []
    datasets = [d.get("name") for d in config.get("dataset", [])]
    infer_sets = [n for n in datasets if "infer" in str(n)]
    if infer is None or infer.get("phases") or len(phases) != 1 or not infer_sets or \
            phases[0].get("dataset_name") in infer_sets:
        return config, train, infer
    phase = dict(phases[0], name="zoo_infer", dataset_name=infer_sets[0], thread_num=1)
    config = dict(config, phase=phases + [phase])
    return config, dict(train, phases=[phases[0]["name"]]), dict(infer, phases=["zoo_infer"])


def _missing_files(config, workspace, work):
    """The files the config names under its workspace (dictionaries, vocabularies)
    that the repository does not hold, and the script that makes them if the
    model has one (a data_prepare.sh, which downloads the full data set)."""
    found = []

    def walk(v):
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, str) and v.startswith("{workspace}/") and \
                os.path.splitext(v)[1] in (".txt", ".csv", ".json", ".pkl", ".npy"):
            path = os.path.join(work, v.replace("{workspace}", workspace))
            if not os.path.exists(path):
                found.append(v.replace("{workspace}/", ""))
    walk({k: v for k, v in config.items() if k in ("dataset", "hyper_parameters")})
    script = "data_prepare.sh" if os.path.exists(
        os.path.join(work, workspace, "data_prepare.sh")) else None
    return sorted(set(found)), script


def _char_ngrams(word, min_n, max_n):
    """The character n-grams of ``word`` that fastText's preprocess takes: from every
    start with at least ``min_n`` characters left, ``min_n`` to ``max_n`` characters
    (cut at the word's end)."""
    return {word[i:i + n] for i in range(len(word) - min_n + 1)
            for n in range(min_n, max_n + 1)}


def fasttext_ngram_ids(dict_dir, min_n, max_n):
    """Write ``dict_dir/word_ngrams_id.txt`` from ``word_count_dict.txt`` (see the
    module's docstring); ValueError when the dictionaries do not fit the rule.
    Returns the number of words written."""
    with open(os.path.join(dict_dir, "word_count_dict.txt"), encoding="utf-8") as f:
        entries = [line.split() for line in f if line.strip()]
    # Words first (each ``<...>``, once), then the n-grams: the first entry that is no
    # ``<...>`` or repeats one before it (an n-gram ``<...>`` is a whole short word) starts them.
    seen = set()
    words = len(entries)
    for i, (entry, _) in enumerate(entries):
        if not (entry.startswith("<") and entry.endswith(">")) or entry in seen:
            words = i
            break
        seen.add(entry)
    ids = {e[0]: i for i, e in enumerate(entries)}          # the last occurrence wins
    with open(os.path.join(dict_dir, "word_id_dict.txt"), encoding="utf-8") as f:
        shipped = {k: int(v) for k, v in (line.split() for line in f if line.strip())}
    if shipped != ids:
        raise ValueError("word_id_dict.txt is not the id of each entry's last line in "
                         "word_count_dict.txt: the dictionaries are not of one preprocess run")
    with open(os.path.join(dict_dir, "word_ngrams_id.txt"), "w", encoding="utf-8") as out:
        for word, _ in entries[:words]:
            grams = _char_ngrams(word, min_n, max_n)
            lost = sorted(g for g in grams if g not in ids)
            if lost:
                raise ValueError(f"word_count_dict.txt lacks the n-grams {lost} of {word!r}")
            out.write(" ".join(map(str, [ids[word], *sorted(ids[g] for g in grams)])) + "\n")
    return words


DERIVED = {"recall/fasttext": ("data/dict/word_ngrams_id.txt", "data/dict",
                               lambda d, hp: fasttext_ngram_ids(d, int(hp.get("min_n", 3)),
                                                                int(hp.get("max_n", 5))))}


def _derive(model, config, workspace, work):
    """Make the file the model needs that the repository's dictionaries determine
    (:data:`DERIVED`); a sentence for the cells, or None."""
    if model not in DERIVED:
        return None
    path, where, make = DERIVED[model]
    if os.path.exists(os.path.join(work, workspace, path)):
        return None
    words = make(os.path.join(work, workspace, where), config.get("hyper_parameters") or {})
    return (f"{path} derived from the repository's dictionaries ({words} words; see "
            f"tools/paddlerec_zoo.py)")


def _data_dirs(config, workspace, work):
    for d in config.get("dataset", []):
        path = os.path.join(work, str(d.get("data_path", "")).replace("{workspace}", workspace))
        if os.path.isdir(path):
            yield path


def _split_in_two(path):
    """A data directory of one file becomes two (each worker of the cluster reads one;
    a one-line file is copied whole into both)."""
    files = [f for f in sorted(os.listdir(path)) if not f.startswith(".")]
    if len(files) != 1:
        return
    src = os.path.join(path, files[0])
    with open(src, "rb") as f:
        lines = f.readlines()
    if not lines:
        return
    # One line (recall/fasttext's sample is one sentence): each worker reads it whole
    # (PaddleRec would otherwise run one worker: a file per worker).
    half = len(lines) // 2
    for i, part in enumerate((lines[:half], lines[half:]) if half else (lines, lines)):
        with open(os.path.join(path, f"part-{i}"), "wb") as f:
            f.writelines(part)
    os.remove(src)


def _series(text, train):
    """``{metric: [values in order]}`` of the [Train] (or [Infer]) lines and the
    epoch summaries."""
    out = {}
    tag = "[Train]" if train else "[Infer]"
    for line in text.splitlines():
        if tag in line:
            body = line.split(tag, 1)[1]
            pairs = METRIC.findall(body)
        elif "global metrics:" in line and (train != line.startswith("Infer")):
            pairs = GLOBAL.findall(line.split("global metrics:", 1)[1])
        else:
            continue
        for name, value in pairs:
            if name in ("epoch", "batch", "time_each_interval"):
                continue
            out.setdefault(name, []).append(float(value))
    return out


def _pick(series):
    """The metric a cell shows: a loss when the model reports one, else the first
    (by name) that is not 0 throughout (Fluid's AUC of a label with no positive)."""
    if not series:
        return None, []
    names = sorted(series, key=lambda n: (not re.search("loss|cost", n, re.I),
                                          not any(series[n]), n))
    return names[0], series[names[0]]


def _failure(text):
    found = FAILED.findall(text)
    if found:
        msg = found[-1].strip()
        lines = text.strip().splitlines()
        kind = lines[-1].strip() if lines else ""
        return f"{kind}: {msg}" if re.fullmatch(r"\w+", kind) and kind not in msg else msg
    tb = [ln for ln in text.splitlines() if re.match(r"^\w+(Error|Exception)\b", ln)]
    return tb[-1] if tb else None


def _cell(text, code, train=True):
    name, values = _pick(_series(text, train))
    if code == 0 and values:
        if train:
            return {"ok": True, "metric": name, "first": values[0], "last": values[-1]}
        return {"ok": True, "metric": name, "last": values[-1]}
    if code == 0 and "PaddleRec Finish" in text and not FAILED.search(text):
        return {"ok": True, "metric": None}   # ran; too few batches to log a metric
    return {"ok": False, "why": _failure(text) or (f"exit code {code}" if code else
                                                   "no metric reported")}


def _run(cmd, cwd, timeout, env):
    t = time.time()
    try:
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=timeout, check=False)
        return r.returncode, r.stdout + r.stderr, time.time() - t
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
            else (e.stdout or "")
        return 124, out + f"\ntimed out after {timeout} s", time.time() - t


def run_model(model, work, epochs, timeout, env):
    slug = model.replace("/", "_")
    out = os.path.join("zoo_out", slug)
    workspace = os.path.join("models", model)
    src = os.path.join(work, workspace, "config.yaml")
    with open(src) as f:
        config = yaml.safe_load(f)
    os.makedirs(os.path.join(work, out), exist_ok=True)
    for path in _data_dirs(config, workspace, work):
        _split_in_two(path)
    row = {"model": model}
    derived = _derive(model, config, workspace, work)
    if derived:
        row["derived"] = derived
    missing, script = _missing_files(config, workspace, work)
    if missing:
        why = (f"the repository does not hold {', '.join(missing)}" +
               (f" (its {script} makes it from the full data set it downloads, not from the "
                f"sample data)" if script else ""))
        row["single"] = row["cluster"] = {"ok": False, "why": why}
        row["infer"] = {"ok": False, "why": "not reached (no data)"}
        return row
    train, infer = _runner(config, "train"), _runner(config, "infer")
    config, train, infer = _infer_phase(config, train, infer)
    if train is None:
        row["single"] = row["cluster"] = row["infer"] = {"ok": False,
                                                         "why": "no CPU train runner"}
        return row
    ckpt = os.path.join(out, "ckpt")
    single = dict(config)
    train = dict(train, epochs=min(int(train.get("epochs") or 1), epochs),
                 save_checkpoint_interval=1, save_checkpoint_path=ckpt)
    runners = [train]
    if infer is not None:
        runners.append(dict(infer, epochs=1, init_model_path=ckpt))
    single["runner"], single["mode"] = runners, [r["name"] for r in runners]
    cfg = os.path.join(workspace, "zoo_single.yaml")
    with open(os.path.join(work, cfg), "w") as f:
        yaml.safe_dump(single, f)
    cmd = [sys.executable, "-m", "pyfleet.cli", "run", "-m", "paddlerec.run", "-m", cfg]
    code, text, secs = _run(cmd, work, timeout, env)
    with open(os.path.join(work, out, "single.log"), "w") as f:
        f.write(text)
    part = text.split("Runner " + train["name"] + " Begin")[-1].split("PaddleRec: Runner")[0]
    failed = code != 0 and (infer is None or FAILED.search(part) is not None)
    row["single"] = _cell(part, 1 if failed or FAILED.search(part) else 0)
    if infer is None:
        row["infer"] = {"ok": False, "why": "the model has no infer runner"}
    else:
        part = text.split("Runner " + infer["name"] + " Begin")
        row["infer"] = _cell(part[-1], code, train=False) if len(part) > 1 else \
            {"ok": False, "why": "not reached (training failed)"}
    row["seconds_single"] = round(secs, 1)

    cluster = dict(config)
    run = {"name": "zoo_local_cluster", "class": "local_cluster_train",
           "epochs": train["epochs"],
           "device": "cpu", "worker_num": 2, "server_num": 2, "distribute_strategy": "async",
           "save_checkpoint_interval": 1, "save_checkpoint_path": os.path.join(out, "cluster"),
           "init_model_path": "", "print_interval": 1,
           "phases": train.get("phases")}
    if run["phases"] is None:
        run.pop("phases")
    cluster["runner"], cluster["mode"] = [run], [run["name"]]
    cfg = os.path.join(workspace, "zoo_cluster.yaml")
    with open(os.path.join(work, cfg), "w") as f:
        yaml.safe_dump(cluster, f)
    shutil.rmtree(os.path.join(work, "logs"), ignore_errors=True)
    cmd = [sys.executable, "-m", "pyfleet.cli", "run", "-m", "paddlerec.run", "-m", cfg]
    code, text, secs = _run(cmd, work, timeout, env)
    logs = os.path.join(work, "logs")
    workers = []
    if os.path.isdir(logs):
        shutil.rmtree(os.path.join(work, out, "logs"), ignore_errors=True)
        shutil.move(logs, os.path.join(work, out, "logs"))
        for name in sorted(os.listdir(os.path.join(work, out, "logs"))):
            with open(os.path.join(work, out, "logs", name), errors="replace") as f:
                if name.startswith("worker"):
                    workers.append(f.read())
    with open(os.path.join(work, out, "cluster.log"), "w") as f:
        f.write(text)
    failed = [w for w in workers if "PaddleRec Finish" not in w]
    cell = _cell(failed[0] if failed else workers[0] if workers else text,
                 1 if failed else code)          # worker 0's metrics, or the first failure
    if cell["ok"] and len(workers) < 2:
        cell.update(ok=False, why=f"{len(workers)} of 2 workers ran")
    row["cluster"] = cell
    row["seconds_cluster"] = round(secs, 1)
    return row


def _fmt(cell, train=True):
    if cell.get("ok"):
        if cell.get("metric") is None:
            return "runs (no metric logged: too few batches)"
        if train:
            return f"{cell['metric']} {cell['first']:.4g} → {cell['last']:.4g}"
        return f"{cell['metric']} {cell['last']:.4g}"
    why = " ".join(str(cell.get("why")).split())
    return f"✗ {why[:160]}"


def table(rows):
    lines = ["| model | single process (train) | local_cluster 2×2 (train) | infer |",
             "| --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['model']} | {_fmt(r['single'])} | {_fmt(r['cluster'])} | "
                     f"{_fmt(r['infer'], train=False)} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models-dir", required=True,
                   help="the models/ directory of PaddleRec's repository at tag v1.8.5")
    p.add_argument("--only", nargs="*", default=None, help="these models (default: the list)")
    p.add_argument("--work", default="paddlerec-zoo", help="work directory (recreated)")
    p.add_argument("--epochs", type=int, default=2, help="at most this many epochs, single")
    p.add_argument("--timeout", type=float, default=600, help="seconds a run may take")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    a = p.parse_args(argv)
    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(a.models_dir, os.path.join(work, "models"))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    rows = []
    for model in a.only or MODELS:
        if not os.path.isfile(os.path.join(work, "models", model, "config.yaml")):
            rows.append({"model": model, **{k: {"ok": False, "why": "not in --models-dir"}
                                            for k in ("single", "cluster", "infer")}})
            continue
        print(f"{model} ...", file=sys.stderr, flush=True)
        try:
            rows.append(run_model(model, work, a.epochs, a.timeout, env))
        except (OSError, KeyError, TypeError, yaml.YAMLError) as exc:
            rows.append({"model": model, **{k: {"ok": False, "why": f"config: {exc!r}"}
                                            for k in ("single", "cluster", "infer")}})
        print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(table(rows))
    print(f"\n(logs under {work}/zoo_out/; load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
