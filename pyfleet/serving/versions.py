"""Finding model versions to serve: ``--model DIR`` or ``--follow DIR``.

``--follow`` takes a ``pyfleet train`` run directory (its ``model/``), a model
directory itself, or a models directory whose subdirectories are versions
(TensorFlow Serving's layout: the highest number, or without numbers the
newest, is served). A version is committed when its model description exists
(written last, atomically); its identity is its directory and the digest of
that description, which records every file's checksum, so a rewritten
``model/`` is a new version.

A :class:`Follower` polls in its own thread, loads a new version there while
the previous one keeps serving, and hands each loaded version to ``on_loaded``
(the server swaps it in on its event loop). A version that fails to load is
refused by name through ``on_refused`` and not tried again until its directory
changes.
"""

import logging
import os
import threading

from pyfleet.serving.model import MODEL_FILES, ModelVersion, is_model_dir, model_digest

__all__ = ["Follower", "newest_model_dir"]

log = logging.getLogger("pyfleet.serve")


def _order(name, path):
    mtime = max((os.stat(os.path.join(path, f)).st_mtime_ns for f in MODEL_FILES
                 if os.path.isfile(os.path.join(path, f))), default=0)
    return (1, int(name), mtime) if name.isdigit() else (0, mtime, name)


def newest_model_dir(path):
    """The model directory ``path`` stands for now (see the module doc), or None."""
    if is_model_dir(path):
        return path
    run_model = os.path.join(path, "model")
    if is_model_dir(run_model):
        return run_model
    try:
        names = os.listdir(path)
    except OSError:
        return None
    found = [(_order(n, p), p) for n in names
             for p in [os.path.join(path, n)] if os.path.isdir(p) and is_model_dir(p)]
    return max(found)[1] if found else None


def _signature(path):
    """What changes when a directory's files change: names, sizes, times."""
    try:
        return tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns)
                            for e in os.scandir(path) if e.is_file()))
    except OSError:
        return ()


class Follower:
    """Polls ``path`` every ``interval`` seconds (see the module doc).

    ``current()`` says which version serves now (``(its directory, its digest)``); ``load_options``
    go to :class:`ModelVersion`. ``stop()`` ends the thread (a load under way
    finishes first)."""

    def __init__(self, path, interval, current, on_loaded, on_refused, load_options):
        self.path, self.interval = path, float(interval)
        self.current = current
        self.on_loaded, self.on_refused = on_loaded, on_refused
        self.load_options = load_options
        self._refused = {}  # model dir -> signature of the directory when it was refused
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pyfleet-serve-follow",
                                        daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=60)

    def poll(self):
        """Load the newest committed version if it is not the one served; returns it or None."""
        where = newest_model_dir(self.path)
        if where is None:
            return None
        try:
            digest = model_digest(where)
        except (OSError, ValueError):
            return None  # replaced while we looked: the next poll sees it
        if (os.path.abspath(where), digest) == self.current():
            return None
        sig = (digest, _signature(where))
        if self._refused.get(where) == sig:
            return None
        try:
            version = ModelVersion(where, **self.load_options)
        except (OSError, ValueError, KeyError, TypeError) as e:
            self._refused[where] = sig
            self.on_refused(where, e)
            return None
        self.on_loaded(version)
        return version

    def _run(self):
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception:  # a bug must not stop following; it is logged with its trace
                log.exception("following %s", self.path)
            self._stop.wait(self.interval)
