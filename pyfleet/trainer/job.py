"""The job file of ``pyfleet train`` (``RUN_DIR/job.json``): its defaults, and the
network, optimizer, tables, strategy and datasets it describes."""

import numpy as np

from pyfleet import fluid, models
from pyfleet import optimizer as _opt
from pyfleet.config import DistributeTranspilerConfig
from pyfleet.data import Dataset
from pyfleet.data.files import MAX_LINE_BYTES
from pyfleet.distributed.fleet import table_configs
from pyfleet.entry import CountFilterEntry

JOB_DEFAULTS = {
    "train": None, "test": None, "format": "criteo", "model": "dnn", "embedding_dim": 16,
    "layers": [256, 128, 64], "lr": 0.001, "batch_size": 512, "epochs": 1, "mode": "async",
    "seed": 0, "run_dir": None, "resume": None, "first_pass": 1, "progress_interval": 2.0,
    "request_timeout": 60.0, "connect_timeout": 120.0, "barrier_timeout": 300.0,
    "heartbeat_timeout": 10.0, "save_model": True, "geo_k_steps": 100,
    "admission_count": None, "show_click": False, "shrink_min_score": None,
    "shrink_decay": 0.98, "shrink_unseen_passes": None, "optimizer": None,
    "valid_fraction": None, "keep": None, "keep_best": False, "log_level": "info",
    "checkpoint_steps": None, "checkpoint_seconds": None, "sparse_mode": None,
    "storage": "fp32", "memory_budget": None, "spill_dir": None,
    "sparse_lr": None,   # None: SPARSE_LR_SCALE times the optimizer's learning rate
}
# The sparse tables' learning rate without a "sparse_lr" (pyfleet train
# --sparse-lr), as a multiple of the optimizer's, by (optimizer, model). Adam
# moves a row by about its learning rate a step whatever the gradient, and
# most ids of a CTR table are seen a few times a pass: at 0.001 the rows
# hardly leave their start. 10x raised the one-pass test AUC on 1M generated
# rows by 0.010 (DNN), 0.009 (Wide & Deep) and 0.008 (LR); DeepFM's pairwise
# term multiplies the rows, and there 10x lowered it by 0.028 and 3x by 0.002
# (docs/quickstart.md, "--sparse-lr"). Unlisted: the optimizer's own rate.
SPARSE_LR_SCALE = {("adam", "dnn"): 10.0, ("adam", "widedeep"): 10.0, ("adam", "lr"): 10.0}


def sparse_lr_of(job):
    """The job's sparse tables' learning rate: ``job["sparse_lr"]``, else the
    optimizer's rate times its :data:`SPARSE_LR_SCALE`."""
    if job.get("sparse_lr") is not None:
        return float(job["sparse_lr"])
    opt = optimizer_of(job)
    name = (job.get("optimizer") or {"name": "adam"})["name"]
    model = str(job.get("model") or "dnn").replace("_", "")
    return opt.learning_rate * SPARSE_LR_SCALE.get((name, model), 1.0)


def optimizer_of(job):
    """The job's optimizer: ``job["optimizer"]`` is ``{"name": adam|adagrad|sgd|ftrl|
    momentum|rmsprop, "learning_rate": ..., <its parameters>}`` (momentum's
    ``momentum`` defaults to 0.9); without one (older job files), Adam at ``job["lr"]``."""
    spec = dict(job.get("optimizer") or {"name": "adam", "learning_rate": job["lr"]})
    cls = {"adam": _opt.Adam, "adagrad": _opt.Adagrad, "sgd": _opt.SGD, "ftrl": _opt.FTRL,
           "momentum": _opt.Momentum, "rmsprop": _opt.RMSProp}
    name = spec.pop("name")
    if name not in cls:
        raise ValueError(f"unknown optimizer {name!r}; expected one of {sorted(cls)}")
    if name == "momentum":
        spec.setdefault("momentum", 0.9)
    return cls[name](**spec)


def feed_of(batch, model):
    """The feed dict of a :class:`pyfleet.data.Batch` for a :mod:`pyfleet.models`
    network: no per-example Python (CSR slots go in as ``(ids, offsets)``)."""
    feed = {model.dense_input.name: batch.dense,
            model.label.name: batch.labels.astype(np.int64).reshape(-1, 1)}
    for var, (ids, offsets) in zip(model.slots, batch.sparse):
        feed[var.name] = (ids, offsets)
    return feed


def job_dataset(job, paths, worker_index, worker_num, shuffle=False, prefetch=4, side=None):
    """``side``: "train" or "valid" with ``job["valid_fraction"]``: that side of
    the rows held out (by their content, whatever reads them)."""
    holdout = None
    if side is not None and job.get("valid_fraction"):
        holdout = (float(job["valid_fraction"]), side)
    return Dataset(paths, format=job["format"], batch_size=job["batch_size"],
                   worker_index=worker_index, worker_num=worker_num, shuffle=shuffle,
                   seed=job["seed"], prefetch=prefetch, holdout=holdout,
                   max_line_bytes=job.get("max_line_bytes") or MAX_LINE_BYTES,
                   max_malformed=job.get("max_malformed"))


def build_program(job, n_dense, n_slots):
    """``(main, startup, model)`` of the job's network (no optimizer yet)."""
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = int(job["seed"])
    with fluid.program_guard(main, startup):
        model = models.build(job["model"], num_dense=n_dense, num_slots=n_slots,
                             embedding_dim=int(job["embedding_dim"]),
                             layers=tuple(int(x) for x in job["layers"]))
    # Fluid's per-parameter rate (ParamAttr(learning_rate=...)): a multiple of the optimizer's
    ratio = sparse_lr_of(job) / optimizer_of(job).learning_rate
    if ratio != 1.0:
        for p in main.all_parameters():
            if p.is_sparse_table:
                p.learning_rate = ratio
    return main, startup, model


def tables_of(job):
    """The table configs of the job's program (``pyfleet._fleet.table_configs``):
    what a checkpoint it resumes from must hold."""
    job = {**JOB_DEFAULTS, **job}
    with fluid.unique_name.guard():  # the names a role's first program gets
        main, startup, model = build_program(job, job["n_dense"], job["n_slots"])
        with fluid.program_guard(main, startup):
            optimizer_of(job).minimize(model.avg_cost)
    return table_configs(main, entry_of(job), job.get("storage") or "fp32",
                         sparse_memory_budget=job.get("memory_budget"),
                         sparse_spill_dir=job.get("spill_dir"))[0]


def strategy_of(job):
    cfg = DistributeTranspilerConfig()
    cfg.mode = job["mode"]
    if cfg.hybrid:  # the servers' side (pyfleet train --sparse-mode)
        cfg.sparse_mode = job.get("sparse_mode") or "async"
    cfg.geo_k_steps = int(job["geo_k_steps"])
    rt = cfg.runtime
    rt.request_timeout = job["request_timeout"]
    rt.connect_timeout = job["connect_timeout"]
    rt.barrier_timeout = job["barrier_timeout"]
    rt.heartbeat_timeout = job["heartbeat_timeout"]
    return cfg


def show_click_of(batch):
    """``(ids, shows, clicks)`` of a batch: every distinct feature id, the
    instances it appears in (once per appearance), and the clicks among them
    (Paddle's CTR accessor counts). Vectorized over slots and ids."""
    ids = np.concatenate([ids for ids, _ in batch.sparse])
    rows = np.concatenate([np.repeat(np.arange(len(batch)), np.diff(offsets))
                           for _, offsets in batch.sparse])
    uniq, inverse = np.unique(ids, return_inverse=True)
    shows = np.bincount(inverse, minlength=uniq.shape[0]).astype(np.float32)
    clicks = np.bincount(inverse, weights=batch.labels[rows],
                         minlength=uniq.shape[0]).astype(np.float32)
    return uniq, shows, clicks


def _shrink_args(job):
    args = {}
    if job.get("shrink_min_score") is not None:
        args["min_score"] = float(job["shrink_min_score"])
        args["decay"] = float(job.get("shrink_decay", 0.98))
    if job.get("shrink_unseen_passes") is not None:
        args["max_unseen_passes"] = int(job["shrink_unseen_passes"])
    return args


def entry_of(job):
    """The sparse tables' admission policy: ``CountFilterEntry(admission_count)``
    when the job sets one (keys become rows after that many pulls), else None."""
    n = job.get("admission_count")
    if n is None:
        return None
    return CountFilterEntry(int(n))
