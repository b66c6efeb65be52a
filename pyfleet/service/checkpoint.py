"""Checkpoint directories: the layout and manifest written by ``fleet.save_persistables``,
their verification, and one server's shard files (written and read by
:class:`pyfleet.service.server.Server`).

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
     "state_worker": the worker whose scope state (auc counters) was saved,
     "state_dir": the generation holding them as ``<name>.state.npy``,
     "chain": [{"dir": "g000007-full", "id", "mode": "full"|"delta",
                "server_num", "rows": {table: rows written},
                "files": {name: {"sha256", "bytes", "rows", "table", "server"}}}, ...]}

Every file a checkpoint consists of is checksummed: a generation's ``files``
list every file of its directory (the shards and dense blocks, the servers'
``server<i>-of-<S>.json`` and the saving worker's ``<name>.state.npy``),
``"beside"`` the files next to the manifest (state files of checkpoints saved
before they moved into the generation) as ``{name: {"sha256", "bytes"}}``,
and ``"body_sha256"`` the manifest's own body (the sha256 of its JSON without
that key, keys sorted, no spaces). :func:`read_manifest` checks
the body and the files beside it, :func:`verify_generation` a generation's
files before anything is loaded; a manifest without ``body_sha256`` (edited,
or written before it was recorded) is refused unless read with
``unchecked_ok=True``.

``chain`` is a full generation followed by the deltas saved after it into the
same ``D`` (a full save starts a new chain). Loading replays the chain in order;
every file is checked against its size and sha256 first, and a mismatch is a
ValueError naming the file. A delta saved into a directory other than the one
of the previous save starts a chain with that delta, ``parent`` naming the
checkpoint it applies to: load it as ``[base_dir, delta_dir]``.

Every server of a save writes, into the generation directory, one file per
sparse table shard (``<name>.shard<i>-of-<S>.bin``), one per dense block
(``<name>.<start>-<end>.bin``) and its own manifest ``server<i>-of-<S>.json``
(the table configs and files it wrote; written atomically like every JSON
file here). A load reads any number of servers' files: a sparse shard keeps
the keys routed to the loading server, a dense block is assembled from the
saved blocks that overlap it.

Not thread-safe: one process saves into a directory at a time (worker 0).
:func:`load_server` takes the registry's lock while it touches the tables;
:func:`save_server` takes it only to list them and writes the files without
it (each table snapshots its rows under its own locks), so a long save never
stops the server from answering heartbeats and barriers.
"""

import json
import os
import re
import shutil
import struct
import time
import uuid

import numpy as np

from pyfleet._atomic import BODY_KEY, body_digest, check_body, write_json
from pyfleet.service.checksums import MANIFEST_NAME, check_beside, file_info, seal
from pyfleet.table import DenseTable

__all__ = ["BODY_KEY", "MANIFEST_NAME", "MANIFEST_VERSION", "STATE_SUFFIX", "body_digest",
           "build_manifest", "check_tables", "commit", "confined_path", "file_info",
           "load_server", "new_generation", "read_manifest", "resolve", "save_server", "seal",
           "state_dir", "verify_generation"]

MANIFEST_VERSION = 2
STATE_SUFFIX = ".state.npy"  # a worker's scope state file (pyfleet.fluid.io writes them)
_GEN_RE = re.compile(r"g(\d{6,})-(full|delta)")


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


def read_manifest(path, unchecked_ok=False, beside=True):
    """The manifest of checkpoint directory ``path`` (None when there is none);
    a manifest that is not valid JSON of this format, whose body does not match
    its ``body_sha256`` (or has none, unless ``unchecked_ok``), or (``beside``)
    a file beside it that differs from its checksum is a ValueError naming it."""
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
    check_body(mpath, m, unchecked_ok)
    if beside:
        check_beside(path, mpath, m)
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
    """Write ``manifest`` as ``path``'s MANIFEST.json atomically (sealed first:
    :func:`seal`), then delete the generation directories it does not name."""
    seal(path, manifest)
    write_json(os.path.join(path, MANIFEST_NAME), manifest, indent=1)
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
    _verify_files(path, gen, gen["files"])
    extra = sorted(n for n in os.listdir(os.path.join(path, gen["dir"]))
                   if not n.startswith(".") and n not in gen["files"])
    if extra:
        raise ValueError(f"checkpoint {path}: files {extra} in {gen['dir']} are not in "
                         f"the manifest")


def _verify_files(path, gen, files):
    """Check ``files`` (``{name: {"sha256", "bytes"}}``) of generation ``gen``,
    its directory confined to the checkpoint first."""
    gdir = os.path.join(path, gen["dir"])
    # Confined before anything is read or stat'ed through it: the generation must be a
    # directory inside the checkpoint, not a link out of it (whose files' sizes or
    # contents an error could otherwise reveal).
    if os.path.islink(gdir) or (os.path.isdir(gdir) and os.path.realpath(gdir) != os.path.join(
            os.path.realpath(path), gen["dir"])):
        raise ValueError(f"checkpoint {path}: generation {gen['dir']} is a symbolic link "
                         f"(or lies outside the checkpoint directory): refused unread")
    if not os.path.isdir(gdir):
        raise ValueError(f"checkpoint {path}: generation directory {gen['dir']} is missing")
    for name, want in sorted(files.items()):
        f = os.path.join(gdir, name)
        if os.path.islink(f):
            raise ValueError(f"checkpoint {path}: file {gen['dir']}/{name} is a symbolic "
                             f"link: refused unread")
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


def state_dir(path, manifest):
    """The directory of checkpoint dir ``path`` holding the saving worker's
    scope state (``<name>.state.npy``): its newest generation, each state file
    checked against its checksum first (a ValueError naming a damaged one), or
    ``path`` itself for a checkpoint saved before the state moved into the
    generation (:func:`read_manifest` checked those files)."""
    name = manifest.get("state_dir")
    if name is None:
        return path
    gen = manifest["chain"][-1]
    if name != gen["dir"]:
        raise ValueError(f"checkpoint {path}: 'state_dir' {name!r} is not its newest "
                         f"generation {gen['dir']!r}")
    _verify_files(path, gen, {n: f for n, f in gen["files"].items()
                              if n.endswith(STATE_SUFFIX)})
    return os.path.join(path, name)


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


# ------------------------------------------------------------ a server's shard files

_SERVER_JSON_RE = re.compile(r"server\d+-of-\d+\.json")


def confined_path(root, rel):
    """The real path of ``rel``, which must be a relative path staying inside
    ``root`` (ValueError otherwise, or when ``root`` is None: the server
    has no checkpoint dir)."""
    if root is None:
        raise ValueError("this server has no checkpoint_dir; save/load are disabled")
    if not isinstance(rel, str) or not rel:
        raise ValueError(f"dir must be a non-empty relative path, got {rel!r}")
    if os.path.isabs(rel) or "\x00" in rel:
        raise ValueError(f"dir {rel!r} must be relative to the checkpoint dir")
    path = os.path.realpath(os.path.join(root, rel))
    if os.path.commonpath([path, root]) != root:
        raise ValueError(f"dir {rel!r} escapes the checkpoint dir")
    return path


def _file_name(e, index, num):
    """The file server ``index`` of ``num`` saves table entry ``e`` into."""
    if e.kind == "sparse":
        return f"{e.name}.shard{index}-of-{num}.bin"
    return f"{e.name}.{e.start}-{e.end}.bin"


def _refuse_written(path, rel, names):
    """Refuse a save into ``path`` (request dir ``rel``) that would write into a
    checkpoint (a directory holding a manifest), into a generation a manifest
    commits, or over any of the files ``names``: a save writes fresh files
    only, so nothing of a committed checkpoint is ever rewritten in place."""
    if os.path.exists(os.path.join(path, MANIFEST_NAME)):
        raise ValueError(f"save refused: dir {rel!r} holds {MANIFEST_NAME} (a checkpoint); a "
                         f"save writes a new generation directory, never into a checkpoint")
    parent, name = os.path.split(path)
    if _GEN_RE.fullmatch(name) and os.path.exists(os.path.join(parent, MANIFEST_NAME)):
        try:
            committed = any(g["dir"] == name for g in read_manifest(parent)["chain"])
        except ValueError:
            committed = True  # cannot tell: keep out
        if committed:
            raise ValueError(f"save refused: dir {rel!r} is a generation its checkpoint's "
                             f"{MANIFEST_NAME} commits (or whose manifest is unreadable); "
                             f"committed generations are never rewritten")
    taken = sorted(n for n in names if os.path.lexists(os.path.join(path, n)))
    if taken:
        raise ValueError(f"save refused: dir {rel!r} already holds {taken[:3]} (an earlier "
                         f"save); a save never overwrites one: save into a new directory")


def save_server(registry, root, rel, mode="full"):
    """Save every table of ``registry`` (a server's) under ``<root>/<rel>``
    (``mode="delta"``: sparse rows changed since the last save). Returns
    ``{"rows": {table: rows}, "files": [...], "file_info": [{"file",
    "table", "rows", "sha256", "bytes"}]}`` (checksums computed from the
    written files, for the checkpoint manifest); raises ValueError when
    refused: a path outside ``root``, or a directory already holding this
    server's save (or any file it would write), a checkpoint's manifest, or
    committed by one. Thread-safe."""
    if mode not in ("full", "delta"):
        raise ValueError(f"mode must be 'full' or 'delta', got {mode!r}")
    path = confined_path(root, rel)
    index, num = registry.server_index, registry.server_num
    rows, files, info = {}, [], []
    with registry.lock:  # the list of tables, not their files
        entries = list(registry.entries.values())
    _refuse_written(path, rel, [_file_name(e, index, num) for e in entries]
                    + [f"server{index}-of-{num}.json"])
    os.makedirs(path, exist_ok=True)
    # The files are written without the server's lock, so the serving thread
    # keeps answering (heartbeats, barriers) during a long save: a sparse
    # table copies each of its shards under that shard's own lock (every row
    # saved from one instant), a dense block is saved under its own lock.
    for e in entries:
        f = os.path.join(path, _file_name(e, index, num))
        try:
            if e.kind == "sparse":
                rows[e.key] = e.table.save(f, delta=(mode == "delta"))
            else:
                with e.lock:
                    rows[e.key] = e.table.save(f)
        except RuntimeError as err:  # the core's I/O error (a full disk), naming its file
            raise OSError(f"cannot save table {e.key!r} to {f}: {err}") from None
        files.append(os.path.basename(f))
        info.append({"file": files[-1], "table": e.key, "rows": int(rows[e.key])})
    manifest = {"server_index": index, "server_num": num, "mode": mode,
                "tables": [e.config for e in entries], "files": files}
    write_json(os.path.join(path, f"server{index}-of-{num}.json"), manifest, indent=1)
    for fi in info:  # outside the lock: training goes on while the files are hashed
        fi.update(file_info(os.path.join(path, fi["file"])))
    return {"rows": rows, "files": files, "file_info": info}


def load_server(registry, root, rel):
    """Load every table of ``registry`` from ``<root>/<rel>`` (written by any
    number of servers). ``rel`` may be a checkpoint of
    ``fleet.save_persistables`` (its manifest's chain is replayed, every file
    verified first) or a list of them (a base, then its deltas in order), or a
    plain ``Client.save`` directory. Returns ``{table: rows}`` (rows read,
    summed over a chain); raises ValueError naming what is missing, damaged
    or refused. Thread-safe."""
    if isinstance(rel, (list, tuple)) or (isinstance(rel, str) and rel):
        for r in [rel] if isinstance(rel, str) else rel:
            confined_path(root, r)
        chain = resolve(root, rel)
        if chain is not None:
            total = {}
            for _, gen, path in chain:
                verify_generation(path, gen)
            for grel, _, _ in chain:
                for k, n in _load_dir(registry, root, grel).items():
                    total[k] = total.get(k, 0) + n
            return total
    return _load_dir(registry, root, rel)


def _saved_dense_shapes(path, names):
    """``{name: shape}`` of the dense parameters a save directory's
    ``server<i>-of-<S>.json`` files describe (empty for a directory without
    them). An unreadable one is refused, naming it."""
    shapes = {}
    for n in sorted(names):
        if not _SERVER_JSON_RE.fullmatch(n):
            continue
        try:
            with open(os.path.join(path, n)) as f:
                tables = json.load(f).get("tables") or []
            for t in tables:
                if t.get("kind") == "dense":
                    shapes[t["name"]] = [int(x) for x in t["shape"]]
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
            raise ValueError(f"{os.path.join(path, n)} is unreadable: {e}") from None
    return shapes


def _load_dir(registry, root, rel):
    """Load ``registry``'s tables from the one save directory ``<root>/<rel>``."""
    path = confined_path(root, rel)
    if not os.path.isdir(path):
        raise ValueError(f"checkpoint dir {rel!r} does not exist")
    names = os.listdir(path)
    saved = _saved_dense_shapes(path, names)
    index, num = registry.server_index, registry.server_num
    rows = {}
    with registry.lock:
        for e in registry.entries.values():
            if e.kind == "sparse":
                pat = re.compile(re.escape(e.name) + r"\.shard(\d+)-of-(\d+)\.bin")
                shard_files = sorted(n for n in names if pat.fullmatch(n))
                if not shard_files:
                    raise ValueError(f"no shard files for table {e.name!r} in {rel!r}")
                rows[e.key] = sum(e.table.load(os.path.join(path, n), filter=(num, index))
                                  for n in shard_files)
            else:
                shape = saved.get(e.name)
                if shape is not None and shape != list(e.shape):
                    # Blocks are flat ranges: loaded, they would fill this
                    # shape with another parameter's values.
                    raise ValueError(f"dense {e.name!r} has shape {shape} in {rel!r}, "
                                     f"{list(e.shape)} here: a checkpoint of another model")
                rows[e.key] = _load_dense(e, path, names, rel)
    return rows


# The 64-byte header of a table file (include/pyfleet/table_io.h, FileHeader) and
# its 32-byte trailer: what a dense file must say before anything is allocated.
_HEADER = struct.Struct("<8sIIIIII QQII8s")
_TABLE_MAGIC, _TRAILER_BYTES, _DENSE_KIND = b"PYFLTBL\0", 32, 2


def _check_dense_file(path, floats):
    """Refuse ``path`` unless its header is a pyfleet dense table file of ``floats``
    weights whose size on disk is what the header promises (read: 64 bytes)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEADER.size)
            on_disk = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    if len(head) < _HEADER.size:
        raise ValueError(f"{path} is not a pyfleet table file: {on_disk} bytes is too short")
    magic, version, kind, _dim, _opt_kind, state_dim, _flags, _seed, dense_size, _meta, \
        _storage, _reserved = _HEADER.unpack(head)
    if magic != _TABLE_MAGIC:
        raise ValueError(f"{path} is not a pyfleet table file (bad magic)")
    if kind != _DENSE_KIND:
        raise ValueError(f"{path} is not a dense table file")
    if dense_size != floats:
        raise ValueError(f"{path} holds {dense_size} weights, its name says {floats}")
    expect = _HEADER.size + 4 * (dense_size + state_dim) + _TRAILER_BYTES
    if on_disk != expect:
        raise ValueError(f"{path} has {on_disk} bytes; its header promises {expect} "
                         f"(truncated or damaged)")


def _load_dense(e, path, names, rel):
    """Load dense block ``e`` from the files ``names`` of ``path``."""
    exact = f"{e.name}.{e.start}-{e.end}.bin"
    with e.lock:
        if exact in names:
            return e.table.load(os.path.join(path, exact))
        # A different placement: assemble this block from overlapping blocks
        # (optimizer state restarts, the weights are exact).
        pat = re.compile(re.escape(e.name) + r"\.(\d+)-(\d+)\.bin")
        out = np.full(e.end - e.start, np.nan, dtype=np.float32)
        size = int(np.prod(e.shape))
        for n in names:
            m = pat.fullmatch(n)
            if not m:
                continue
            s, t = int(m.group(1)), int(m.group(2))
            lo, hi = max(s, e.start), min(t, e.end)
            if lo >= hi:
                continue
            if not s < t <= size:
                raise ValueError(f"{os.path.join(path, n)}: its name gives block [{s}, {t}) "
                                 f"of dense {e.name!r}, which has {size} elements: not a "
                                 f"block of this parameter")
            # The file's own header and size must agree with its name before a
            # block of that size is made: a name is not a promise.
            _check_dense_file(os.path.join(path, n), t - s)
            block = DenseTable(t - s, e.table.optimizer)
            block.load(os.path.join(path, n))
            out[lo - e.start:hi - e.start] = block.pull()[lo - s:hi - s]
        if np.isnan(out).any():
            raise ValueError(f"files in {rel!r} do not cover dense block {e.key!r}")
        e.table.set(out.reshape(e.table.shape))
        return int(out.shape[0])
