"""`pyfleet train --config FILE -o key=value`: TOML, YAML and JSON files with
the options' names as keys, -o overrides, command-line flags winning, unknown keys and
missing readers refused by name before anything is written, settings in job.json."""

import json

import pytest
from support.cli import pyfleet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]



TOML = """\
# one config per model, as PaddleRec users keep them
model = "lr"
embedding_dim = 8
layers = [8, 4]
rows = 3000
workers = 1
mode = "sync"
keep_best = true
"""


def _settings(run):
    job = json.loads((run / "job.json").read_text())
    return job["settings"], job["config"]


def test_toml_config_with_overrides_and_flags_winning(tmp_path):
    (tmp_path / "job.toml").write_text(TOML)
    r = pyfleet("train", "--config", "job.toml", "-o", "model=dnn", "-o", "seed=3",
                "--embedding-dim", "4", "--run-dir", tmp_path / "run", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["train_examples"] == 2700  # rows = 3000 from the file
    settings, config = _settings(tmp_path / "run")
    assert settings["model"] == "dnn"           # -o wins over the file
    assert settings["embedding_dim"] == 4       # the flag wins over the file
    assert settings["layers"] == "8,4" and settings["keep_best"] is True  # the file's
    assert settings["seed"] == 3 and settings["workers"] == 1 and settings["mode"] == "sync"
    assert config["file"] == str(tmp_path / "job.toml")
    assert config["overrides"] == ["model=dnn", "seed=3"]
    assert config["values"]["layers"] == [8, 4]
    assert (tmp_path / "run" / "checkpoints" / "best").is_dir()  # keep_best took effect


@pytest.mark.parametrize("kind", ["yaml", "json"])
def test_yaml_and_json_configs(tmp_path, kind):
    pytest.importorskip("yaml") if kind == "yaml" else None
    values = {"model": "widedeep", "embedding-dim": 4, "layers": "8", "rows": 3000,
              "workers": 1, "mode": "sync", "batch_size": 256}
    if kind == "yaml":
        text = "".join(f"{k}: {v}\n" for k, v in values.items())
        text = text.replace("layers: 8", 'layers: "8"')
    else:
        text = json.dumps(values)
    (tmp_path / f"job.{kind}").write_text(text)
    r = pyfleet("train", "--config", f"job.{kind}", "--run-dir", tmp_path / "run", "--json",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    settings, _ = _settings(tmp_path / "run")
    assert (settings["model"], settings["embedding_dim"], settings["layers"],
            settings["batch_size"]) == ("widedeep", 4, "8", 256)


def _refused(r, text, run):
    assert r.returncode != 0
    assert r.stderr.count("\n") == 1 and text in r.stderr, r.stderr
    assert not run.exists()


def test_bad_keys_and_values_are_refused_by_name_before_anything_is_written(tmp_path):
    run = tmp_path / "run"
    (tmp_path / "job.toml").write_text(TOML + "embeding_dim = 3\n")
    _refused(pyfleet("train", "--config", "job.toml", "--run-dir", run, cwd=tmp_path),
             "--config job.toml: unknown key 'embeding_dim' (did you mean embedding_dim?)", run)
    (tmp_path / "job.toml").write_text(TOML)
    _refused(pyfleet("train", "--config", "job.toml", "-o", "learning_rate=0.1",
                     "--run-dir", run, cwd=tmp_path), "unknown key 'learning_rate'", run)
    _refused(pyfleet("train", "--config", "job.toml", "-o", "batch_size=big", "--run-dir", run,
                     cwd=tmp_path), "-o batch_size=big: batch_size expects int, got 'big'", run)
    _refused(pyfleet("train", "--config", "job.toml", "-o", "model=xgboost", "--run-dir", run,
                     cwd=tmp_path), "model must be one of lr, dnn, widedeep, deepfm", run)
    _refused(pyfleet("train", "-o", "epochs", "--run-dir", run, cwd=tmp_path),
             "-o epochs: expected key=value", run)
    (tmp_path / "job.toml").write_text("model = \n")
    _refused(pyfleet("train", "--config", "job.toml", "--run-dir", run, cwd=tmp_path),
             "--config job.toml: not valid TOML", run)
    (tmp_path / "job.ini").write_text("[x]\n")
    _refused(pyfleet("train", "--config", "job.ini", "--run-dir", run, cwd=tmp_path),
             "unknown file type .ini", run)


def test_a_missing_toml_or_yaml_reader_is_refused_by_name(tmp_path):
    """Python < 3.11 without tomli, and no PyYAML: simulated by modules that fail to import."""
    fake = tmp_path / "fake"
    for name in ("tomllib", "tomli", "yaml"):
        (fake / name).mkdir(parents=True)
        (fake / name / "__init__.py").write_text(f"raise ImportError('no {name} here')\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(fake)}
    (tmp_path / "job.toml").write_text(TOML)
    (tmp_path / "job.yaml").write_text("model: lr\n")
    run = tmp_path / "run"
    _refused(pyfleet("train", "--config", "job.toml", "--run-dir", run, cwd=tmp_path, env=env),
             "reading TOML needs Python >= 3.11 (tomllib) or the tomli package", run)
    _refused(pyfleet("train", "--config", "job.yaml", "--run-dir", run, cwd=tmp_path, env=env),
             "reading YAML needs PyYAML", run)
