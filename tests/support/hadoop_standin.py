"""A stand-in for Hadoop's ``hadoop fs`` client, for tests (see :func:`install`).

Serves ``hdfs:``/``afs:`` paths (and bare absolute ones) from the local
directory ``$HADOOP_STANDIN_ROOT``: ``hdfs://nn:9000/a/b`` and ``afs:/a/b`` are
``$HADOOP_STANDIN_ROOT/a/b``. Implements the subcommands pyfleet and Fluid
use: ``-cat``, ``-text`` (gunzips), ``-ls``, ``-test -e|-d``, ``-mkdir [-p]``,
``-put [-f]``, ``-get``, ``-rm [-r] [-f]``, ``-mv``, ``-ls -R``. Every call's argv is appended, as
one JSON line, to ``$HADOOP_STANDIN_LOG``. A path containing ``BROKEN`` fails
as an unreachable name node does (exit 255, a message on stderr).
"""

import gzip
import json
import os
import re
import shutil
import stat
import sys
import time


def install(bin_dir, root, log):
    """Write an executable ``hadoop`` into ``bin_dir`` running this stand-in
    with ``root`` and ``log``; returns the environment entries to set."""
    os.makedirs(bin_dir, exist_ok=True)
    exe = os.path.join(bin_dir, "hadoop")
    with open(exe, "w") as f:
        f.write(f"#!/bin/sh\nexec {sys.executable} {os.path.abspath(__file__)} \"$@\"\n")
    os.chmod(exe, os.stat(exe).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "HADOOP_STANDIN_ROOT": str(root), "HADOOP_STANDIN_LOG": str(log)}


def serve(tmp_path, monkeypatch):
    """For a test: a stand-in ``hadoop`` on PATH serving ``tmp_path/hdfs``; returns
    ``(that directory, a function returning the argv of every call so far)``."""
    root, log = tmp_path / "hdfs", tmp_path / "hadoop.log"
    root.mkdir()
    log.write_text("")
    for k, v in install(tmp_path / "bin", root, log).items():
        monkeypatch.setenv(k, v)
    return root, lambda: [json.loads(line) for line in log.read_text().splitlines()]


def _local(path):
    if "BROKEN" in path:
        sys.stderr.write(f"{path}: Call to namenode failed on connection exception: "
                         "java.net.ConnectException: Connection refused\n")
        sys.exit(255)
    rest = re.sub(r"^(hdfs|afs):(//[^/]*)?", "", path)
    return os.path.join(os.environ["HADOOP_STANDIN_ROOT"], rest.lstrip("/"))


def _missing(cmd, path):
    sys.stderr.write(f"{cmd}: `{path}': No such file or directory\n")
    sys.exit(1)


def main(argv):
    with open(os.environ["HADOOP_STANDIN_LOG"], "a") as f:
        f.write(json.dumps(argv) + "\n")
    if not argv or argv[0] != "fs":
        sys.stderr.write("usage: hadoop fs [generic options] ...\n")
        return 2
    args = argv[1:]
    while args and args[0].startswith("-D"):   # generic options: -D k=v or -Dk=v
        args = args[2:] if args[0] == "-D" else args[1:]
    cmd, rest = args[0], args[1:]
    flags = {a for a in rest if a in ("-f", "-p", "-r", "-R", "-e", "-d")}
    paths = [a for a in rest if a not in flags]
    out = sys.stdout.buffer
    if cmd in ("-cat", "-text"):
        for p in paths:
            local = _local(p)
            if not os.path.isfile(local):
                _missing(cmd[1:], p)
            opener = gzip.open if cmd == "-text" and p.endswith(".gz") else open
            with opener(local, "rb") as f:
                shutil.copyfileobj(f, out)
        return 0
    if cmd == "-test":
        local = _local(paths[0])
        ok = os.path.isdir(local) if "-d" in flags else os.path.exists(local)
        return 0 if ok else 1
    if cmd == "-ls":
        local = _local(paths[0])
        if not os.path.exists(local):
            _missing("ls", paths[0])
        base = paths[0].rstrip("/")
        if "-R" in flags:
            names = sorted(os.path.relpath(os.path.join(d, n), local)
                           for d, dirs, files in os.walk(local) for n in dirs + files)
        else:
            names = sorted(os.listdir(local)) if os.path.isdir(local) else [""]
        for n in names:
            full = os.path.join(local, n)
            kind = "d" if os.path.isdir(full) else "-"
            size = 0 if kind == "d" else os.path.getsize(full)
            when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(os.path.getmtime(full)))
            out.write(f"{kind}rw-r--r--   3 user group {size} {when} {base}/{n}\n".encode())
        return 0
    if cmd == "-mv":
        src, dst = (_local(p) for p in paths)
        if not os.path.exists(src):
            _missing("mv", paths[0])
        os.rename(src, dst)
        return 0
    if cmd == "-mkdir":
        os.makedirs(_local(paths[0]), exist_ok=True)
        return 0
    if cmd == "-put":
        src, dst = paths
        local = _local(dst)
        if os.path.isdir(local):
            local = os.path.join(local, os.path.basename(src.rstrip("/")))
        if os.path.exists(local) and "-f" not in flags:
            sys.stderr.write(f"put: `{dst}': File exists\n")
            return 1
        if not os.path.isdir(os.path.dirname(local)):
            _missing("put", dst)
        if os.path.isdir(src):
            shutil.rmtree(local, ignore_errors=True)
            shutil.copytree(src, local)
        else:
            shutil.copyfile(src, local)
        return 0
    if cmd == "-get":
        src, dst = paths
        local = _local(src)
        if not os.path.exists(local):
            _missing("get", src)
        if os.path.isdir(dst):
            dst = os.path.join(dst, os.path.basename(local.rstrip("/")))
        (shutil.copytree if os.path.isdir(local) else shutil.copyfile)(local, dst)
        return 0
    if cmd in ("-rm", "-rmr"):
        local = _local(paths[0])
        if os.path.isdir(local):
            shutil.rmtree(local)
        elif os.path.exists(local):
            os.remove(local)
        elif "-f" not in flags:
            _missing("rm", paths[0])
        return 0
    sys.stderr.write(f"{cmd}: Unknown command\n")
    return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
