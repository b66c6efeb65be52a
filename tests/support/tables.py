"""A trained table and its sorted export, shared by the table tests."""

import numpy as np

import pyfleet
from pyfleet.optimizer import Adam


def trained_table(opt=None, dim=6, n=3000, seed=0, storage=None):
    """A table after three pull/push rounds on ``n`` random keys plus the two edge keys."""
    opt = opt or Adam(learning_rate=0.01)
    rng = np.random.default_rng(seed)
    kwargs = {} if storage is None else {"storage": storage}
    t = pyfleet.SparseTable(dim, opt, seed=seed, **kwargs)
    edge = np.array([0, 2**64 - 1], dtype=np.uint64)
    ks = np.concatenate([edge, rng.integers(0, 2**64, n, dtype=np.uint64)])
    for _ in range(3):
        t.pull(ks)
        t.push(ks, rng.normal(0, 1, (len(ks), dim)).astype(np.float32))
    return t, ks


def snapshot(t):
    """The table's export with state, rows sorted by key."""
    e = t.export(with_state=True)
    order = np.argsort(e["keys"])
    return {k: v[order] for k, v in e.items()}


def fleet_table_configs(optimizer=None, **distributed_optimizer_kwargs):
    """The table configs a Fleet worker derives from the zoo's LR program with
    ``fleet.distributed_optimizer(optimizer or SGD(0.1), **distributed_optimizer_kwargs)``."""
    from pyfleet import fluid, models
    from pyfleet.distributed.fleet import Fleet
    from pyfleet.distributed.role_maker import Role, UserDefinedRoleMaker

    f = Fleet()
    f.init(UserDefinedRoleMaker(current_id=0, role=Role.WORKER, worker_num=1,
                                server_endpoints=["127.0.0.1:1"]))
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        m = models.build("lr", num_dense=2, num_slots=2, embedding_dim=2)
        f.distributed_optimizer(optimizer or fluid.optimizer.SGD(0.1),
                                **distributed_optimizer_kwargs).minimize(m.avg_cost)
    return f._tables
