"""Checkpoint directories written by ``fleet.save_persistables``: layout, manifest, verification.

A checkpoint directory ``D`` holds one sub-directory per save (a *generation*)
and one manifest, written last::

    D/MANIFEST.json          the commit point: names the generations to load, in order
    D/g000007-full/          every server's files of one save (shards, dense blocks,
    D/g000008-delta/           server<i>-of-<S>.json); never rewritten once written

A save writes a new generation directory (a fresh name, so nothing of the
committed checkpoint is touched), then replaces ``MANIFEST.json`` atomically
(temporary name, fsync, rename, fsync of the directory), then deletes the
generations the new manifest no longer names. A crash (of a server, of the
worker, of the machine) before the rename leaves the previous manifest and
every generation it names intact: the previous checkpoint still loads. A crash
after it leaves at most unreferenced directories, removed by the next save.

``MANIFEST.json`` (format ``pyfleet-checkpoint``, ``version`` 2)::

    {"format", "version", "id", "created", "mode", "server_num", "tables",
     "placement", "parent": id of the checkpoint a leading delta applies to | null,
     "meta": the saver's own JSON object (optional; ``pyfleet train``: {"pass"}),
     "chain": [{"dir": "g000007-full", "id", "mode": "full"|"delta",
                "server_num", "rows": {table: rows written},
                "files": {name: {"sha256", "bytes", "rows", "table", "server"}}}, ...]}

``chain`` is a full generation followed by the deltas saved after it into the
same ``D`` (a full save starts a new chain). Loading replays the chain in order;
every file is checked against its size and sha256 first, and a mismatch is a
ValueError naming the file. A delta saved into a directory other than the one
of the previous save starts a chain with that delta, ``parent`` naming the
checkpoint it applies to: load it as ``[base_dir, delta_dir]``.

Not thread-safe: one process saves into a directory at a time (worker 0).
"""

import hashlib
import json
import os
import re
import shutil
import time
import uuid

__all__ = ["MANIFEST_NAME", "MANIFEST_VERSION", "build_manifest", "check_tables", "commit",
           "file_info", "new_generation", "read_manifest", "resolve", "verify_generation"]

MANIFEST_NAME = "MANIFEST.json"
MANIFEST_VERSION = 2
_GEN_RE = re.compile(r"g(\d{6,})-(full|delta)")
_CHUNK = 1 << 20


def _table_form(t):
    """What must match between a saved table and a program's: kind and dim or shape."""
    if t.get("kind") == "sparse":
        return f"a sparse table of dim {t.get('dim')}"
    return f"a dense parameter of shape {list(t.get('shape') or [])}"


def check_tables(saved, current, where, extra_ok=True):
    """Raise ValueError when the tables ``saved`` in checkpoint ``where`` (a
    manifest's ``"tables"``) cannot be loaded into a program's ``current``
    ones: a table missing from the checkpoint, or saved with another kind,
    dim or shape (another model: other layers, embedding size or number of
    input features). ``extra_ok=False``: tables the program does not have are
    refused too."""
    by_name = {t.get("name"): t for t in saved if isinstance(t, dict)}
    for t in current:
        name = t["name"]
        old = by_name.get(name)
        if old is None:
            raise ValueError(f"checkpoint {where} has no {name!r} ({_table_form(t)} of this "
                             f"program): a checkpoint of another model")
        if _table_form(old) != _table_form(t):
            raise ValueError(f"checkpoint {where} holds {name!r} as {_table_form(old)}; this "
                             f"program has it as {_table_form(t)}: a checkpoint of another model")
    if not extra_ok:
        extra = sorted(set(by_name) - {t["name"] for t in current})
        if extra:
            raise ValueError(f"checkpoint {where} holds {extra}, which this program does not "
                             f"have: a checkpoint of another model")


def file_info(path):
    """``{"sha256", "bytes"}`` of a file (read in bounded chunks)."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(_CHUNK)
            if not b:
                break
            h.update(b)
            n += len(b)
    return {"sha256": h.hexdigest(), "bytes": n}


def read_manifest(path):
    """The manifest of checkpoint directory ``path`` (None when there is none);
    a manifest that is not valid JSON of this format is a ValueError."""
    mpath = os.path.join(path, MANIFEST_NAME)
    try:
        with open(mpath) as f:
            m = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ValueError(f"checkpoint manifest {mpath} is unreadable: {e}") from None
    if not isinstance(m, dict) or m.get("format") != "pyfleet-checkpoint":
        raise ValueError(f"{mpath} is not a pyfleet checkpoint manifest")
    if m.get("version") != MANIFEST_VERSION:
        raise ValueError(f"{mpath} has format version {m.get('version')!r}; this pyfleet "
                         f"reads version {MANIFEST_VERSION}")
    chain = m.get("chain")
    if not isinstance(chain, list) or not chain or not all(
            isinstance(g, dict) and isinstance(g.get("dir"), str)
            and _GEN_RE.fullmatch(g["dir"]) and isinstance(g.get("files"), dict)
            for g in chain):
        raise ValueError(f"{mpath}: 'chain' must be a non-empty list of generations")
    for g in chain:
        bad = [n for n in g["files"] if not isinstance(n, str) or os.path.basename(n) != n
               or n.startswith(".") or not isinstance(g["files"][n], dict)]
        if bad:  # names are joined to the generation's path: no way out of it
            raise ValueError(f"{mpath}: generation {g['dir']} lists bad file names {bad[:3]}")
    return m


def new_generation(path, mode):
    """A fresh generation directory name in ``path`` (numbered after every
    directory already there, committed or left by a crashed save)."""
    n = 0
    if os.path.isdir(path):
        for name in os.listdir(path):
            m = _GEN_RE.fullmatch(name)
            if m:
                n = max(n, int(m.group(1)))
    return f"g{n + 1:06d}-{mode}"


def commit(path, manifest):
    """Write ``manifest`` as ``path``'s MANIFEST.json atomically, then delete
    the generation directories it does not name."""
    tmp = os.path.join(path, MANIFEST_NAME + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, MANIFEST_NAME))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a power cut
    finally:
        os.close(fd)
    keep = {g["dir"] for g in manifest["chain"]}
    for name in os.listdir(path):
        if _GEN_RE.fullmatch(name) and name not in keep:
            shutil.rmtree(os.path.join(path, name), ignore_errors=True)


def build_manifest(previous, gen, mode, replies, tables, placement, parent, meta=None):
    """The manifest after saving generation ``gen`` (server ``replies`` of
    SAVE). ``previous``: the manifest a delta extends (None: start a chain);
    ``meta``: the caller's JSON object, kept as ``"meta"`` (omitted when None)."""
    files, rows = {}, {}
    for s, r in enumerate(replies):
        for fi in r.get("file_info") or []:
            files[fi["file"]] = {"sha256": fi["sha256"], "bytes": fi["bytes"],
                                 "rows": fi["rows"], "table": fi["table"], "server": s}
        for table, n in (r.get("rows") or {}).items():
            rows[table] = rows.get(table, 0) + int(n)
    entry = {"dir": gen, "id": uuid.uuid4().hex, "mode": mode, "server_num": len(replies),
             "rows": rows, "files": files}
    chain = [*previous["chain"], entry] if previous is not None else [entry]
    manifest = {"format": "pyfleet-checkpoint", "version": MANIFEST_VERSION, "id": entry["id"],
                "created": time.time(), "mode": mode, "server_num": len(replies),
                "tables": tables, "placement": placement,
                "parent": previous["parent"] if previous is not None else parent,
                "chain": chain}
    if meta is not None:
        manifest["meta"] = meta
    return manifest


def verify_generation(path, gen):
    """Check every file of generation ``gen`` (a chain entry) in checkpoint dir
    ``path``: present, of its size and sha256, and no shard file unaccounted
    for. Raises ValueError naming the first damaged file."""
    gdir = os.path.join(path, gen["dir"])
    if not os.path.isdir(gdir):
        raise ValueError(f"checkpoint {path}: generation directory {gen['dir']} is missing")
    for name, want in sorted(gen["files"].items()):
        f = os.path.join(gdir, name)
        if not os.path.isfile(f):
            raise ValueError(f"checkpoint {path}: file {gen['dir']}/{name} is missing")
        got = file_info(f)
        if got["bytes"] != want.get("bytes"):
            raise ValueError(f"checkpoint {path}: file {gen['dir']}/{name} has "
                             f"{got['bytes']} bytes, the manifest says {want.get('bytes')} "
                             f"(truncated or damaged)")
        if got["sha256"] != want.get("sha256"):
            raise ValueError(f"checkpoint {path}: file {gen['dir']}/{name} is damaged "
                             f"(sha256 differs from the manifest)")
    extra = sorted(n for n in os.listdir(gdir)
                   if n.endswith(".bin") and n not in gen["files"])
    if extra:
        raise ValueError(f"checkpoint {path}: files {extra} in {gen['dir']} are not in "
                         f"the manifest")


def resolve(root, rels):
    """The generations to load, in order, for checkpoint dir(s) ``rels``
    (relative to ``root``; one path, or a list: a base then deltas): a list of
    ``(generation path relative to root, chain entry, checkpoint path)``.
    None when ``rels`` is one directory without a manifest (a plain
    ``Client.save`` directory, loaded as it is). Raises ValueError when a
    manifest is missing from a list, damaged, or the list is out of order."""
    single = isinstance(rels, str)
    rels = [rels] if single else list(rels)
    if not rels or not all(isinstance(r, str) and r for r in rels):
        raise ValueError(f"checkpoint dirs must be a path or a non-empty list of paths, "
                         f"got {rels!r}")
    out, head = [], None
    for i, rel in enumerate(rels):
        path = os.path.join(root, rel)
        m = read_manifest(path)
        if m is None:
            if single:
                return None
            raise ValueError(f"checkpoint {rel!r} has no {MANIFEST_NAME}: an incomplete "
                             f"save, or not a pyfleet checkpoint")
        first = m["chain"][0]
        if first["mode"] == "delta":
            if head is None:
                raise ValueError(f"checkpoint {rel!r} starts with a delta on checkpoint "
                                 f"{m.get('parent')!r}: load it after its base, as "
                                 f"[base_dir, ..., {rel!r}]")
            if m.get("parent") != head:
                raise ValueError(f"checkpoint {rel!r} is a delta on checkpoint "
                                 f"{m.get('parent')!r}, but the one before it in the list "
                                 f"ends at {head!r}: wrong order or wrong base")
        elif i > 0:
            raise ValueError(f"checkpoint {rel!r} is a full checkpoint: only the first of "
                             f"a list may be (the others are its deltas, in order)")
        for g in m["chain"]:
            out.append((os.path.join(rel, g["dir"]), g, path))
        head = m["chain"][-1]["id"]
    return out
