"""The training job behind ``pyfleet train``: one function per role, driven by a job file.

``pyfleet train`` writes ``job.json`` into the run directory and starts a local
cluster with :func:`pyfleet.launch.launch_local`; every role runs
``python -m pyfleet.trainer RUN_DIR/job.json`` and learns its role from the
launcher's environment contract (``fleet.init()`` with no argument), exactly as
a user's own Fleet script would. The same command runs a role on a real
cluster, with the environment set by mpirun or Kubernetes.

Every worker reads its share of the training files (``Dataset`` with
``worker_index``/``worker_num``), trains the chosen model for ``epochs``
passes, evaluates its share of the test files and writes
``RUN_DIR/worker<i>.json`` (throughput, and the statistics of its test
predictions); worker 0 also writes ``metrics.jsonl`` (one line per progress
report), saves the checkpoint (``RUN_DIR/checkpoint``) after every pass and the
inference model (``RUN_DIR/model``) at the end. :func:`summarize` combines the
workers' files: the test AUC and logloss are computed from every worker's
predictions together, never from worker 0's alone.

One module per concept: ``job`` (the job file: defaults, network, optimizer, tables,
datasets), ``role`` (what each role runs, and :func:`train_local`), ``progress`` (the
workers' progress files), ``evaluation`` (per-pass tests and :func:`summarize`),
``keeper`` (the ``--keep``/``--keep-best`` checkpoint copies).
"""

from pyfleet.trainer.evaluation import summarize
from pyfleet.trainer.job import (
    JOB_DEFAULTS,
    build_program,
    entry_of,
    feed_of,
    job_dataset,
    optimizer_of,
    show_click_of,
    sparse_lr_of,
    strategy_of,
    tables_of,
)
from pyfleet.trainer.keeper import snapshot_checkpoint
from pyfleet.trainer.role import main, run_role, train_local

__all__ = ["JOB_DEFAULTS", "build_program", "entry_of", "feed_of", "job_dataset", "main", "optimizer_of",
           "run_role", "show_click_of", "snapshot_checkpoint", "sparse_lr_of", "strategy_of",
           "summarize", "tables_of", "train_local"]
