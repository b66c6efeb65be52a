"""The tables a Fleet program puts on its servers: one create_tables config per
sparse table and dense parameter (:func:`table_configs`), and the share of one
server (:func:`server_table_configs`). Used by :mod:`pyfleet.distributed.fleet`
and the trainer; the servers build their tables from these configs.
"""

from pyfleet.errors import ConfigError

__all__ = ["server_table_configs", "servers_regularize", "table_configs"]


def servers_regularize(strategy):
    """The kinds of table (``"sparse"``, ``"dense"``) whose regularizers the
    servers apply: sync and async servers, as Fluid's pserver optimize blocks,
    decay the rows a push touches (on the merged gradient in sync mode). In a
    hybrid job they do so for the sparse tables only (the workers decay their
    dense replicas' gradients before the averaging all-reduce: one decay); in
    geo mode, whose workers train a local copy, for none (the worker decays)."""
    if strategy.sparse_mode == "geo":
        return frozenset()
    return frozenset({"sparse"} if strategy.hybrid else {"sparse", "dense"})


def _regularizer(p, opt):
    """``p``'s regularizer as a table config (its own, else the optimizer's), or None."""
    reg = getattr(p, "regularizer", None) or opt.regularization
    if reg is None or reg.regularization_coeff == 0.0:
        return None
    return reg.to_config()


def table_configs(program, sparse_entry=None, sparse_storage="fp32", regularizers=(),
                  sparse_memory_budget=None, sparse_spill_dir=None):
    """``(configs, dense_shapes)`` of a minimized program: a create_tables
    config per sparse table and dense parameter, and ``[(name, shape)]`` of the
    dense ones in program order (the order placement depends on).
    ``sparse_entry``: the admission policy of every sparse table (None: none);
    ``sparse_storage``: their storage type. ``regularizers``: the kinds of
    table (``"sparse"``, ``"dense"``) that apply their parameters'
    regularizers (a ``"regularizer"`` key where one is set; see
    :func:`servers_regularize`). ``sparse_memory_budget`` bytes
    (each server's, split evenly among the sparse tables) and
    ``sparse_spill_dir``: their disk tier (None: all rows in RAM)."""
    entry = None if sparse_entry is None else sparse_entry.to_config()
    opt = program._optimizer
    if opt is None:
        raise ConfigError("the program has no optimizer: call minimize(loss) first")
    configs, dense = [], []
    n_sparse = sum(1 for p in program.all_parameters() if p.is_sparse_table)
    spill = {}
    if sparse_memory_budget is not None and n_sparse:
        spill = {"memory_budget": int(sparse_memory_budget) // n_sparse,
                 "spill_dir": str(sparse_spill_dir)}
    for p in program.all_parameters():
        popt = p.optimizer or opt
        if p.is_sparse_table:
            if sparse_storage.endswith("_q8") and popt.kind not in ("Adam", "Adagrad"):
                raise ConfigError(f"sparse_storage {sparse_storage!r} keeps Adam's or Adagrad's "
                                  f"state in 8 bits; sparse table {p.name!r} uses {popt.kind}")
            cfg = {"kind": "sparse", "name": p.name, "dim": p.dim,
                   "optimizer": popt.to_config(), "initializer": p.initializer.to_config(),
                   "seed": p.seed, "entry": entry, "storage": sparse_storage, **spill}
        else:
            shape = [int(s) for s in p.shape]
            cfg = {"kind": "dense", "name": p.name, "shape": shape,
                   "optimizer": popt.to_config(), "initial": p.initializer.to_config(),
                   "seed": p.seed}
            dense.append((p.name, shape))
        reg = _regularizer(p, opt) if cfg["kind"] in regularizers else None
        if reg is not None:
            cfg["regularizer"] = reg
        configs.append(cfg)
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
