"""A resumed run trains at the learning rates of the run it continues."""

from pyfleet.cli.resume import _resumed_settings


def test_a_run_from_before_sparse_lr_goes_on_at_the_rate_its_tables_trained_at():
    # job.json of a run made before --sparse-lr existed: its sparse tables took --lr
    old = {"lr": 0.002, "model": "dnn",
           "settings": {"lr": 0.002, "model": "dnn", "embedding_dim": 16}}
    assert _resumed_settings(old)["sparse_lr"] == 0.002
    older = {"lr": 0.003, "model": "dnn", "layers": [8]}   # no "settings" at all
    assert _resumed_settings(older)["sparse_lr"] == 0.003
    assert "sparse_lr" not in old["settings"]   # the file's dict is not changed


def test_a_run_with_sparse_lr_keeps_what_it_recorded():
    given = {"lr": 0.001, "sparse_lr": 0.05, "settings": {"lr": 0.001, "sparse_lr": 0.05}}
    assert _resumed_settings(given)["sparse_lr"] == 0.05
    # the default rate of a run made with --sparse-lr known stays the default
    default = {"lr": 0.001, "sparse_lr": 0.01, "settings": {"lr": 0.001, "sparse_lr": None}}
    assert _resumed_settings(default)["sparse_lr"] is None
