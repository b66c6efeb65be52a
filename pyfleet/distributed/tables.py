"""The tables a Fleet program puts on its servers: one create_tables config per
sparse table and dense parameter (:func:`table_configs`), and the share of one
server (:func:`server_table_configs`). Used by :mod:`pyfleet.distributed.fleet`
and the trainer; the servers build their tables from these configs.
"""

from pyfleet.errors import ConfigError

__all__ = ["server_table_configs", "table_configs"]


def _check_server_rule(optimizer, what):
    """Momentum and RMSProp are numpy rules for local dense parameters: the
    servers' tables have no such rule, so a Fleet program refuses them here,
    at distributed_optimizer/minimize, not when a server builds its table."""
    if optimizer.kind is None:
        raise ConfigError(f"{what} is {type(optimizer).__name__}, which pyfleet's servers "
                          f"cannot apply (their tables run SGD, Adagrad, Adam or FTRL); "
                          f"{type(optimizer).__name__} trains local programs only")


def table_configs(program, sparse_entry=None, sparse_storage="fp32"):
    """``(configs, dense_shapes)`` of a minimized program: a create_tables
    config per sparse table and dense parameter, and ``[(name, shape)]`` of the
    dense ones in program order (the order placement depends on).
    ``sparse_entry``: the admission policy of every sparse table (None: none);
    ``sparse_storage``: their storage type."""
    entry = None if sparse_entry is None else sparse_entry.to_config()
    opt = program._optimizer
    if opt is None:
        raise ConfigError("the program has no optimizer: call minimize(loss) first")
    configs, dense = [], []
    for p in program.all_parameters():
        popt = p.optimizer or opt
        _check_server_rule(popt, f"parameter {p.name!r}'s optimizer")
        if p.is_sparse_table:
            if sparse_storage.endswith("_q8") and popt.kind not in ("Adam", "Adagrad"):
                raise ConfigError(f"sparse_storage {sparse_storage!r} keeps Adam's or Adagrad's "
                                  f"state in 8 bits; sparse table {p.name!r} uses {popt.kind}")
            configs.append({"kind": "sparse", "name": p.name, "dim": p.dim,
                            "optimizer": popt.to_config(),
                            "initializer": p.initializer.to_config(), "seed": p.seed,
                            "entry": entry, "storage": sparse_storage})
        else:
            shape = [int(s) for s in p.shape]
            configs.append({"kind": "dense", "name": p.name, "shape": shape,
                            "optimizer": popt.to_config(),
                            "initial": p.initializer.to_config(), "seed": p.seed})
            dense.append((p.name, shape))
    return configs, dense


def server_table_configs(configs, placement, server_index):
    """The configs server ``server_index`` holds: every sparse table, and its
    dense blocks (as ``pyfleet.client.Client.create_tables`` sends them)."""
    out = []
    for cfg in configs:
        if cfg["kind"] == "sparse":
            out.append(cfg)
            continue
        for name, start, end, s in placement:
            if name == cfg["name"] and s == server_index:
                out.append({**cfg, "start": start, "end": end})
    return out
