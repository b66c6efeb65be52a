"""``pyfleet plan``: what a sparse table of N ids costs, and how many servers hold it.

The bytes a row are not a second, hand-kept table of the row layout: they are the C++
table's own memory accounting (``SparseTable.memory_bytes``: rows, optimizer state,
row metadata and the key index) measured on a table of the same dim, optimizer and
storage type, at 100,000 to 125,000 rows: one growth of its index (the index grows
1.25x at a time, so its bytes a row vary by a few percent with where the table is in
that cycle; the mean is printed, within 2% of a table of millions of rows). The slot a row takes on disk with
a disk tier (``--spill-dir``) is the table's own ``spill_slot_bytes``.

Not counted: the dense parameters (small beside the tables of a CTR model, and
placed whole on servers), a server process's own memory (Python, ZeroMQ buffers:
about 100 MiB), and the working memory of the requests in flight.
"""

import json
import math
import os
import sys
import tempfile

import numpy as np

from pyfleet.cli.units import byte_count

__all__ = ["cmd_plan", "measure_row_bytes"]

# One table grown through one growth of its index (1.25x) from 100,000 rows, measured
# at 8 sizes: past the index's first huge pages, where a row costs what it costs at
# millions (within 1-2%).
_SIZES = [int(100_000 * 1.25 ** (k / 8)) for k in range(8)]
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _optimizer(name):
    from pyfleet.trainer.job import optimizer_of  # the rules pyfleet train builds
    return optimizer_of({"optimizer": {"name": name, "learning_rate": 0.01}})


def measure_row_bytes(dim, optimizer, storage):
    """``{"row_bytes", "table_bytes", "spill_slot_bytes", "state_dim"}`` of a table
    of ``dim`` with ``optimizer`` (a name) in ``storage``, from the table's own
    accounting (see the module)."""
    from pyfleet.table import SparseTable
    table = SparseTable(dim, _optimizer(optimizer), storage=storage)
    empty = table.memory_bytes()
    keys = np.arange(1, _SIZES[-1] + 1, dtype=np.uint64) * _GOLDEN
    per_row, done = [], 0
    for n in _SIZES:
        table.pull(keys[done:n])
        done = n
        per_row.append((table.memory_bytes() - empty) / n)
    state_dim = table.stats()["state_dim"]
    del table
    with tempfile.TemporaryDirectory(prefix="pyfleet-plan-") as spill:
        # the smallest budget the table takes: only the slot size is read
        probe = SparseTable(dim, _optimizer(optimizer), storage=storage)
        budget = probe._t.min_memory_budget()
        spilling = SparseTable(dim, _optimizer(optimizer), storage=storage,
                               memory_budget=budget, spill_dir=spill)
        slot = spilling.stats()["spill_slot_bytes"]
        del spilling
    return {"row_bytes": float(np.mean(per_row)), "table_bytes": int(empty),
            "spill_slot_bytes": int(slot), "state_dim": int(state_dim)}


def _short(n):
    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def _gib(n):
    return f"{n / 2**30:,.2f} GiB"


def plan(rows, dim, optimizer, storage, memory_budget=None, servers=None):
    """The figures ``pyfleet plan`` prints, as a dict (its ``--json``)."""
    from pyfleet.table import STORAGE_TYPES
    kinds = [s for s in STORAGE_TYPES if not s.endswith("_q8")
             or optimizer in ("adam", "adagrad")]
    out = {"rows": rows, "dim": dim, "optimizer": optimizer, "storage": storage,
           "memory_budget": memory_budget, "servers": servers, "storage_types": {}}
    for kind in kinds:
        m = measure_row_bytes(dim, optimizer, kind)
        total = m["row_bytes"] * rows
        entry = {**m, "all_rows_bytes": int(total)}
        if memory_budget is not None:
            fit = max(int((memory_budget - m["table_bytes"]) // m["row_bytes"]), 0)
            entry["rows_in_budget"] = fit
            entry["servers_needed"] = math.ceil(rows / fit) if fit else None
        if servers:
            entry["rows_a_server"] = math.ceil(rows / servers)
            entry["bytes_a_server"] = int(m["table_bytes"] + m["row_bytes"]
                                          * math.ceil(rows / servers))
        out["storage_types"][kind] = entry
    return out


def format_plan(p):
    budget, servers = p["memory_budget"], p["servers"]
    head = ["storage", "B/row", "all rows", "B/row on disk"]
    if budget is not None:
        head += [f"rows in {_gib(budget)}", "servers"]
    if servers:
        head += [f"RAM a server ({servers})"]
    rows = []
    for kind, e in p["storage_types"].items():
        r = [kind + (" *" if kind == p["storage"] else ""), f"{e['row_bytes']:.1f}",
             _gib(e["all_rows_bytes"]), str(e["spill_slot_bytes"])]
        if budget is not None:
            r += [f"{e['rows_in_budget']:,}", "-" if e["servers_needed"] is None
                  else f"{e['servers_needed']:,}"]
        if servers:
            r += [_gib(e["bytes_a_server"])]
        rows.append(r)
    widths = [max(len(x[i]) for x in [head] + rows) for i in range(len(head))]
    lines = [f"{p['rows']:,} ids, dim {p['dim']}, {p['optimizer']} (optimizer state "
             f"{p['storage_types'][p['storage']]['state_dim']} floats a row); bytes a row "
             f"from the table's own memory accounting"]
    for r in [head] + rows:
        lines.append("  ".join(x.ljust(w) if i == 0 else x.rjust(w)
                               for i, (x, w) in enumerate(zip(r, widths))))
    chosen = p["storage_types"][p["storage"]]
    if budget is not None:
        need = chosen["servers_needed"]
        if need is None:
            lines.append(f"--storage {p['storage']}: {_gib(budget)} does not hold the "
                         f"table's fixed {chosen['table_bytes']:,} bytes")
        else:
            lines.append(f"--storage {p['storage']}: {need:,} server(s) of {_gib(budget)} "
                         f"hold {p['rows']:,} ids in RAM (pyfleet train --servers {need} "
                         f"--storage {p['storage']}); fewer servers with --memory-budget "
                         f"{_short(budget)} --spill-dir DIR keep the rest "
                         f"on disk, {chosen['spill_slot_bytes']} bytes a row")
    lines.append("not counted: dense parameters, each server process's own ~100 MiB, "
                 "requests in flight (docs/scaleout.md)")
    return "\n".join(lines)


def cmd_plan(args):
    from pyfleet.table import STORAGE_TYPES
    for flag, value in (("--rows", args.rows), ("--dim", args.dim)):
        if value < 1:
            raise SystemExit(f"pyfleet plan: {flag} must be >= 1, got {value}")
    if args.servers is not None and args.servers < 1:
        raise SystemExit(f"pyfleet plan: --servers must be >= 1, got {args.servers}")
    if args.storage not in STORAGE_TYPES:
        raise SystemExit(f"pyfleet plan: --storage must be one of {', '.join(STORAGE_TYPES)}")
    if args.storage.endswith("_q8") and args.optimizer not in ("adam", "adagrad"):
        raise SystemExit(f"pyfleet plan: --storage {args.storage} keeps Adam's or Adagrad's "
                         f"state in 8 bits; --optimizer {args.optimizer} is not supported by it")
    p = plan(args.rows, args.dim, args.optimizer, args.storage, args.memory_budget,
             args.servers)
    try:
        print(json.dumps(p) if args.json else format_plan(p), flush=True)
    except BrokenPipeError:  # | head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def add_plan_parser(sub, add_parser):
    p = add_parser(sub, "plan", "bytes a row, rows a server holds, servers needed",
                   "Size a job's sparse tables before running it: the bytes a row of each\n"
                   "storage type for the optimizer and dim (measured on the C++ table), the\n"
                   "rows a server holds in --memory-budget, and the servers that N ids need.")
    p.add_argument("--rows", type=int, required=True, metavar="N",
                   help="distinct ids (sparse rows) of the model, over every table (required)")
    p.add_argument("--dim", type=int, default=16, metavar="D",
                   help="embedding width (pyfleet train's --embedding-dim)")
    p.add_argument("--optimizer", default="adam",
                   choices=["adam", "adagrad", "sgd", "ftrl", "momentum", "rmsprop"],
                   help="update rule: its state is part of every row")
    p.add_argument("--storage", default="fp32",
                   choices=["fp32", "fp16", "bf16", "fp16_q8", "bf16_q8"],
                   help="the storage type the last line sizes (every one is in the table)")
    p.add_argument("--memory-budget", type=byte_count, default=None, metavar="BYTES",
                   help="one server's RAM for its rows (e.g. 4G): the rows it holds and the "
                        "servers needed (default: not asked)")
    p.add_argument("--servers", type=int, default=None, metavar="S",
                   help="also the RAM each of S servers needs for its share (default: not "
                        "asked)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p
