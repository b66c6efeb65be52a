"""The parameter server: one process per endpoint, serving table shards over ZeroMQ.

A :class:`Server` holds, for one ``server_index`` among ``server_num``:

- every sparse table's shard (the keys ``pyfleet.table.route(key, server_num)``
  sends here), as a :class:`pyfleet.table.SparseTable`;
- the dense parameter blocks placed on it, as :class:`pyfleet.table.DenseTable`

in a :class:`~pyfleet.service.registry.Registry`. This module is the
dispatch and the control ops; it delegates the socket loop to
:mod:`pyfleet.service.loop`, the data and table ops to
:mod:`pyfleet.service.table_ops`, the barrier and liveness rules to
:mod:`pyfleet.service.barrier` and the shard files to
:mod:`pyfleet.service.checkpoint`.

Threads: the thread calling :meth:`run` owns the ROUTER socket (the
endpoint) and answers the requests of a training step itself (at most
``inline_limit`` floats of keys x dim, 512k by default, and cheap control
ops); larger ones go to ``handler_threads`` Python threads (see
:mod:`pyfleet.service.loop`). A sparse pull of at least
``split_pull_keys`` keys is itself pulled in parts by several threads at
once. A barrier never parks a thread: the waiting requests' envelopes are
kept and answered when the barrier completes (or fails, detected by the
ROUTER thread's housekeeping).

Modes (``async``, ``sync``, ``geo``; see docs/service.md and
:mod:`pyfleet.service.table_ops`) decide when pushes apply.

Every malformed request (bad magic, version, op, sizes, table, dim, non-finite
gradient...) gets an error reply naming the problem and is counted in
``stats()``; the server keeps serving.

``python -m pyfleet.server --endpoint HOST:PORT --index I --num-servers S
--workers W --mode MODE`` runs one server and exits 0 once every worker has
called ``stop_worker`` (port 0 picks a free port; the line
``pyfleet.server ready on HOST:PORT`` is printed when it serves).
"""

import errno
import logging
import os
import threading
import time

import zmq

from pyfleet.config import MODES
from pyfleet.endpoint import split_endpoint
from pyfleet.errors import EndpointInUse, PyfleetError
from pyfleet.service import auth as _auth
from pyfleet.service import checkpoint as _checkpoint
from pyfleet.service import inbound as _inbound
from pyfleet.service import protocol as P
from pyfleet.service import table_ops as _table_ops
from pyfleet.service import wire as Z
from pyfleet.service.barrier import Barriers, Ticks
from pyfleet.service.dedup import RecentRequests
from pyfleet.service.limits import Limits
from pyfleet.service.loop import INLINE_LIMIT, SocketLoop, give_back_memory
from pyfleet.service.owners import Owners, not_a_worker
from pyfleet.service.protocol import Op, ProtocolError, Refused, Status
from pyfleet.service.registry import Registry
from pyfleet.service.stats import Counters, peak_rss_bytes, rss_bytes
from pyfleet.service.table_ops import SPLIT_PULL_KEYS, TableOps, control_payload, segment_sum
from pyfleet.service.worker_ops import WorkerOps

__all__ = ["Server", "segment_sum"]

log = logging.getLogger("pyfleet.server")

_OP_BY_INT = {int(o): o for o in Op}
# Requests applied at most once (a client's retry of one is answered, not applied).
_PUSH_OPS = frozenset({Op.PUSH_SPARSE, Op.PUSH_DENSE, Op.PUSH_DENSE_MANY, Op.PUSH_SHOW_CLICK})
# The socket thread ticks every 100 ms when idle: a longer gap means this
# server was not running (stopped, starved), not that the workers went quiet.
_STALL_SECONDS = 1.0
_OP_COUNTER = {o: f"op_{o.name.lower()}" for o in Op}


class Server(WorkerOps):
    """One parameter-server endpoint.

    Args:
        endpoint: ``"host:port"`` (or ``"tcp://host:port"``); port 0 picks a free
            port, readable afterwards as :attr:`endpoint`. Bound in the constructor.
        server_index, server_num: this server's place among all servers.
        worker_num: workers that will connect; :meth:`run` returns after each of
            them called ``stop_worker``.
        mode: ``"async"``, ``"sync"`` or ``"geo"``.
        tables: table configs to create at start (see :meth:`create_tables`).
        handler_threads: Python threads calling into the tables.
        max_message_bytes: largest accepted message (``zmq.MAXMSGSIZE`` drops
            the connection of a peer sending one larger frame; a message whose
            frames add up to more gets an error reply).
        max_queued_replies, max_request_keys, max_dense_floats,
            max_sparse_dim, max_tables: what a peer may make this server hold
            (keyword only; see :mod:`pyfleet.service.limits`).
        heartbeat_timeout: seconds without a heartbeat after which a worker
            missing at a barrier is declared dead and the barrier fails.
        barrier_timeout: seconds a barrier may wait in all.
        checkpoint_dir: root of ``save``/``load`` directories (None: refused).
        spill_root: the directory under which a peer's table config may place a
            disk tier (``spill_dir``); None: peers' configs may not ask for one
            (tables given here, ``tables``, are the operator's and may).
        inline_limit: requests of at most this many floats (keys x dim) are
            answered by the ROUTER thread itself; 0 sends all to the handlers.
        split_pull_keys: sparse pulls of at least this many keys are pulled in
            up to ``handler_threads`` parts at once (not under an admission
            policy, whose counts are per call); 0 never splits.
        curve_secret_key: a Z85 secret key (``zmq.curve_keypair()[1]``): the
            endpoint then speaks CURVE (encrypted; a client needs the matching
            public key). None: plain TCP, for trusted networks.
        curve_client_keys: a directory of admitted client public keys
            (``*.key`` certificates, see :mod:`pyfleet.service.auth`); needs
            ``curve_secret_key``. A ZAP authenticator thread then refuses the
            handshake of any other client. The server uses its own ZeroMQ
            context (ZAP handlers are per context) unless ``context`` is given.
        ipc_dir: a directory of this user closed to everyone else (mode 0700):
            a server bound to a loopback host also listens on a Unix socket in
            it (``ipc_dir/HOST-PORT``), unencrypted, so clients on this machine
            given the same directory skip TCP and CURVE (whoever may enter the
            directory may connect; a directory open to others is refused).
            Ignored for other hosts: they are reached over TCP. Default:
            environment ``PYFLEET_IPC_DIR`` through ``fleet.init_server``.

    ``listen_fd``: a bound, listening TCP socket to accept on (default: a launcher's
    ``PYFLEET_LISTEN_FD`` for this port); ``job_token`` (default ``PYFLEET_JOB_TOKEN``)
    answers clients' challenges (``auth.job_proof``). A taken port: EndpointInUse.

    Binding a host other than loopback without ``curve_client_keys`` is
    refused (ValueError) unless ``insecure=True`` (default: environment
    ``PYFLEET_INSECURE=1``), which logs a warning: anyone who can reach the
    port can then read and change the model.

    Thread safety: :meth:`stop` may be called from any thread (or a signal
    handler); everything else is driven by :meth:`run`.
    """

    def __init__(self, endpoint, server_index, server_num, worker_num, mode="async",
                 tables=None, handler_threads=2, max_message_bytes=256 << 20,
                 heartbeat_timeout=10.0, barrier_timeout=300.0, checkpoint_dir=None,
                 inline_limit=INLINE_LIMIT, curve_secret_key=None, curve_client_keys=None,
                 context=None, split_pull_keys=SPLIT_PULL_KEYS, insecure=None,
                 spill_root=None, ipc_dir=None, listen_fd=None, job_token=None,
                 **limits):
        self.server_index, self.server_num = int(server_index), int(server_num)
        self.worker_num = int(worker_num)
        if not 0 <= self.server_index < self.server_num:
            raise ValueError(f"server_index must be in [0, {self.server_num}), "
                             f"got {server_index!r}")
        if self.worker_num < 1:
            raise ValueError(f"worker_num must be >= 1, got {worker_num!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if int(handler_threads) < 1:
            raise ValueError(f"handler_threads must be >= 1, got {handler_threads!r}")
        self.mode = mode
        self.handler_threads = int(handler_threads)
        extra = set(limits) - set(Limits._fields)
        if extra:
            raise TypeError(f"Server() got unexpected keyword argument(s) {sorted(extra)}")
        self.limits = Limits.make(max_message_bytes=max_message_bytes, **limits)
        self.max_message_bytes = self.limits.max_message_bytes
        self.heartbeat_timeout = float(heartbeat_timeout)
        self.barrier_timeout = float(barrier_timeout)
        self.checkpoint_dir = None if checkpoint_dir is None else os.path.realpath(
            str(checkpoint_dir))
        self.inline_limit = int(inline_limit)
        self.split_pull_keys = int(split_pull_keys)
        if self.split_pull_keys < 0:
            raise ValueError(f"split_pull_keys must be >= 0, got {split_pull_keys!r}")

        self._lock = threading.RLock()           # tables, sync buffers, barrier, workers
        self.registry = Registry(self.server_index, self.server_num, self.max_message_bytes,
                                 self._lock, spill_root=None if spill_root is None
                                 else os.path.realpath(os.fspath(spill_root)))
        self.barriers = Barriers(self.worker_num, self.heartbeat_timeout, self.barrier_timeout,
                                 sync=(mode == "sync"),
                                 max_step_bytes=self.limits.max_step_bytes)
        self._counters = Counters()
        self._recent = RecentRequests(self.worker_num + 1)  # push ids, per sender
        self._owners = Owners(self.worker_num, self.heartbeat_timeout)  # who speaks for whom
        self._data = TableOps(self.registry, self.barriers, mode, self._counters.add,
                             self.handler_threads, self.split_pull_keys, self.limits)
        self._ops = {**self._data.ops(),
                     Op.BARRIER: self._barrier, Op.HEARTBEAT: self._heartbeat,
                     Op.STOP_WORKER: self._stop_worker, Op.JOIN: self._join, Op.SAVE: self._save,
                     Op.LOAD: self._load, Op.STATS: self._stats}
        self._ticks = Ticks()
        self._done = threading.Event()
        self._ran = False
        self.failure = None  # why run() ended before every worker stopped (None: it did not)
        self._job_token = job_token or os.environ.get(_auth.JOB_TOKEN_VAR) or None

        host, port = split_endpoint(endpoint, "server endpoint", allow_zero=True)
        if ipc_dir is not None:
            ipc_dir = Z.check_ipc_dir(os.fspath(ipc_dir), "ipc_dir")
        self.ipc_dir = ipc_dir if ipc_dir is not None and _auth.is_loopback_host(host) else None
        _auth.check_exposure(host, curve_secret_key, curve_client_keys, insecure)
        self._own_ctx = context is None and curve_client_keys is not None
        self._ctx = zmq.Context() if self._own_ctx else (context or zmq.Context.instance())
        self._zap = None
        self._frontend = self._ctx.socket(zmq.ROUTER)
        self._loop = self._guard = None
        try:
            if curve_client_keys is not None:
                self._zap = _auth.ZapAuthenticator(self._ctx, curve_client_keys).start()
            if listen_fd is None:
                listen_fd = Z.inherited_listener(port)
            self._held_fd = listen_fd is not None
            try:
                port, self._guard = _inbound.serve(
                    self._frontend, host, port, self.max_message_bytes, self.limits,
                    curve_secret_key, self.ipc_dir, listen_fd, self._cut, give_back_memory)
            except (zmq.ZMQError, OSError) as e:
                where = f"{host}:{port}" + (f" and in {self.ipc_dir}" if self.ipc_dir else "")
                taken = e.errno in (zmq.EADDRINUSE, errno.EADDRINUSE)  # exit 75: try again
                hint = " (another process listens there: stop it or choose another port)"
                raise (EndpointInUse if taken else PyfleetError)(
                    f"server {server_index}: cannot serve on {where}: {e.strerror}"
                    f"{hint if taken else ''}") from None
            self.endpoint = f"{host}:{port}"
            self._loop = SocketLoop(self._ctx, self._frontend,
                                    f"inproc://pyfleet-server-{id(self):x}", self._handle,
                                    self._housekeeping, self.handler_threads,
                                    self.inline_limit, self._done, on_drop=self._dropped,
                                    max_backlog_bytes=self.limits.max_backlog_bytes,
                                    max_buffer_bytes=self.limits.max_buffer_bytes,
                                    guard=self._guard)
            if tables:
                self.create_tables(tables)
        except BaseException:
            if self._guard is not None:
                self._guard.stop()
            self._frontend.close(linger=0)
            if self._loop is not None:
                self._loop.close()
            self._close_auth()
            raise

    def _close_auth(self):
        if self._zap is not None:
            self._zap.stop()
            self._zap = None
        if self._own_ctx:
            self._own_ctx = False
            self._ctx.term()

    # ---------------------------------------------------------------- lifecycle

    def run(self):
        """Serve until every worker has called ``stop_worker`` or :meth:`stop`,
        or until every worker has stopped or died, one at least dead (then
        :attr:`failure` says which; ``python -m pyfleet.server`` exits 1). A
        worker that stopped with ``may_return`` (Fluid's lifecycle) keeps the
        server serving while its process lives (see :meth:`Barriers.finished`).
        Blocks; returns normally (closing the sockets) in every case."""
        if self._ran:
            raise RuntimeError("Server.run() may be called once")
        self._ran = True
        with self._lock:
            self.barriers.start(time.monotonic())
        self._ticks.start()
        log.info("server %d/%d serving %s (%s mode)", self.server_index, self.server_num,
                 self.endpoint, self.mode)
        if self._loop.run(on_exit=self._data.close):  # term() would wait for their sockets
            self._close_auth()

    def stop(self):
        """Make :meth:`run` return. Thread-safe and idempotent."""
        self._done.set()

    def close(self):
        """Let go of a server that will not :meth:`run` (its setup failed after it was
        made: a checkpoint that did not load): its port, sockets and helper threads.
        :meth:`run` does this itself when it ends. Idempotent; a closed server cannot run."""
        if self._ran:
            return
        self._ran = True
        self._done.set()
        self._data.close()
        if self._guard is not None:
            self._guard.stop()
        self._frontend.close(linger=0)
        self._loop.close()
        self._close_auth()
        if not self._held_fd:  # a launcher's port stays held; ours is free when this returns
            Z.wait_released(*split_endpoint(self.endpoint, "server endpoint"))

    def _cut(self, peer, held, why):
        _log_bad(self._counters.add("cut_connections"),
                 f"from {peer}: {why} ({held} bytes held)", "cut connection")

    def _dropped(self, why, ident):
        self._counters.add("dropped_replies")
        _log_bad(self._counters.get("dropped_replies", 0),
                 f"reply to peer {ident.hex()} dropped: {why}")

    # ---------------------------------------------------------------- dispatch

    def _handle(self, msg):
        """Replies (each a frame list starting with the identity) for one message."""
        ident, frames = msg[0], msg[1:]
        if not frames:
            self._counters.add("protocol_errors")
            return [[ident] + P.error_reply(0, 0, "empty message: no header frame")]
        try:
            h = P.unpack_header(frames[0].buffer)
        except ProtocolError as e:
            self._counters.add("protocol_errors")
            _log_bad(self._counters.get("protocol_errors", 0), e)
            return [[ident] + P.error_reply(0, 0, e)]
        try:
            op = _OP_BY_INT.get(h.op)
            if op is None:
                raise ProtocolError(f"unknown op {h.op}")
            total = sum(len(f) for f in frames) if len(frames) > 2 else 0
            if total > self.max_message_bytes:
                raise ProtocolError(f"message of {total} bytes exceeds max_message_bytes="
                                    f"{self.max_message_bytes}")
            if h.status and h.status - 1 < self.worker_num:
                now = time.monotonic()
                if self._owners.heard(h.status - 1, h.request, now):  # not a stranger's
                    self.barriers.seen(h.status - 1, now)
            self._counters.add(_OP_COUNTER[op])
            if op in _PUSH_OPS:
                sender = h.status
                if not 0 < sender <= self.worker_num:
                    raise Refused(not_a_worker(sender, self.worker_num))
                self._claim(sender - 1, h, op.name)  # only the client owning the index
                if not self._recent.first(sender, h.request):
                    self._counters.add("duplicate_pushes")  # a retry: applied once already
                    return self._data.repeat_reply(h, op, frames[1:], ident)
                try:
                    return self._ops[op](h, op, frames[1:], ident)
                except BaseException:
                    self._recent.forget(sender, h.request)  # refused: a retry may try again
                    raise
            out = self._ops[op](h, op, frames[1:], ident)
            return [] if out is None else out
        except (ProtocolError, Refused, ValueError, TypeError, KeyError, OSError) as e:
            kind = "protocol_errors" if isinstance(e, ProtocolError) else "refused_requests"
            self._counters.add(kind)
            _log_bad(self._counters.get(kind, 0), e)
            msg = str(e) if not isinstance(e, KeyError) else f"missing field {e}"
            return [[ident] + P.error_reply(h.op, h.request, f"{_op_name(h.op)}: {msg}",
                                            table=h.table)]
        except Exception as e:  # a server bug must not end the server
            out = _table_ops.spill_reply(e, h, ident, self._counters.add, self.server_index)
            if out is not None:
                return out
            self._counters.add("internal_errors")
            log.exception("internal error on %s", _op_name(h.op))
            return [[ident] + P.error_reply(h.op, h.request,
                                            f"{_op_name(h.op)}: internal error: {e!r}")]

    # ------------------------------------------------------------ control ops

    def _worker_of(self, payload):
        w = payload.get("worker")
        if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w < self.worker_num:
            raise Refused(f"worker must be an integer in [0, {self.worker_num}), got {w!r}")
        return w

    def _claim(self, w, h, what, refuse=True, take=True):
        """Whether request ``h`` may speak for worker ``w`` (see
        :mod:`pyfleet.service.owners`; thread-safe)."""
        return self._owners.claim(w, h.request, time.monotonic(), w in self.barriers.stopped,
                                  what, refuse, take)

    def _release(self, rel):
        """The replies of a completed barrier (sync mode: its step applied
        first); caller holds the lock."""
        if rel is None:
            return []
        if rel.sync:
            try:
                self._data.apply_sync(rel.sync, rel.workers)
            except (Refused, ValueError) as e:
                # The step is refused as a whole (its buffers are gone with
                # rel): every worker at the barrier gets its error.
                msg = (f"server {self.server_index} ({self.endpoint}) refused step "
                       f"{rel.count}: {e}")
                log.error("%s", msg)
                return [[ident] + P.error_reply(hh.op, hh.request, msg)
                        for ident, hh in rel.tokens]
        return [[ident] + P.reply(hh, payload={"barrier": rel.count}) for ident, hh in rel.tokens]

    def _barrier(self, h, op, frames, ident):
        payload = control_payload(frames, op)
        w = self._worker_of(payload)
        kind = payload.get("kind", "step")
        with self._lock:
            self._claim(w, h, "BARRIER")
            return self._release(self.barriers.arrive(w, (ident, h), kind,
                                                      time.monotonic())) or None

    def _housekeeping(self, sock):
        """Fail a barrier whose missing worker died or that waited too long, and
        give up once every worker stopped or died. Called by the ROUTER
        thread only (``sock`` is the ROUTER)."""
        with self._lock:
            # Measured under the lock: a wait for it is a stall too.
            now = time.monotonic()
            gap = self._ticks.gap(now)
            if gap > _STALL_SECONDS:
                # This thread was not running (the process stopped or starved,
                # or the lock held): nobody could be heard, so the gap is the
                # server's own silence, not the workers'.
                self.barriers.pause(gap, now)
                self._owners.pause(gap)
                log.warning("server %d did not serve for %.1f s; liveness clocks moved on "
                            "by that", self.server_index, gap)
                return  # read what waits in the socket before judging anyone
        if not self._ticks.due(now):
            return
        with self._lock:
            self._end_if_finished(now)
            if self.failure is None:
                why = self.barriers.abandoned(now)
                if why is not None:
                    self.failure = (f"server {self.server_index} ({self.endpoint}) gives up: "
                                    f"{why}")
                    log.error("%s", self.failure)
                    self._done.set()
            failed = self.barriers.check(now)
            if failed is None:
                return
            msg = f"barrier failed on server {self.server_index} ({self.endpoint}): {failed.why}"
            log.error("%s", msg)
            self._counters.add("barrier_failures")
            out = [[ident] + P.error_reply(hh.op, hh.request, msg, Status.BARRIER_FAILED)
                   for ident, hh in failed.tokens]
        for m in out:
            self._loop.reply(m, copy=False)

    def _heartbeat(self, h, op, frames, ident):
        payload = control_payload(frames, op)
        if "worker" in payload:
            w = self._worker_of(payload)
            with self._lock:  # answered whoever asks; it claims nothing
                if self._claim(w, h, "HEARTBEAT", refuse=False, take=False):
                    self.barriers.seen(w, time.monotonic())
        out = {"server_index": self.server_index, "server_num": self.server_num,
               "worker_num": self.worker_num, "mode": self.mode,
               "heartbeat_timeout": self.heartbeat_timeout, "barrier_timeout": self.barrier_timeout}
        if isinstance(payload.get("challenge"), str) and self._job_token is not None:
            out["proof"] = _auth.job_proof(self._job_token, payload["challenge"][:128])
        return [[ident] + P.reply(h, payload=out)]

    def _save(self, h, op, frames, ident):
        payload = control_payload(frames, op)
        out = self.save_checkpoint(payload.get("dir"), payload.get("mode", "full"))
        return [[ident] + P.reply(h, payload=out)]

    def save_checkpoint(self, rel, mode="full"):
        """Save every table under ``<checkpoint_dir>/<rel>``; see
        :func:`pyfleet.service.checkpoint.save_server`. Thread-safe."""
        return _checkpoint.save_server(self.registry, self.checkpoint_dir, rel, mode)

    def _load(self, h, op, frames, ident):
        payload = control_payload(frames, op)
        rows = self.load_checkpoint(payload.get("dir"))
        return [[ident] + P.reply(h, payload={"rows": rows})]

    def load_checkpoint(self, rel, root=None):
        """Load every table from ``<checkpoint_dir>/<rel>``; see
        :func:`pyfleet.service.checkpoint.load_server`. Thread-safe.

        ``root``: the directory ``rel`` is relative to, for a load this
        process asks for itself (``fleet.init_server(model_dir)``); a LOAD
        request from the network is always confined to ``checkpoint_dir``."""
        root = self.checkpoint_dir if root is None else os.path.realpath(os.fspath(root))
        return _checkpoint.load_server(self.registry, root, rel)

    def _stats(self, h, op, frames, ident):
        control_payload(frames, op)
        return [[ident] + P.reply(h, payload=self.stats())]

    def stats(self):
        """Counters of this server and of each table (JSON-friendly). Thread-safe."""
        counters = self._counters.snapshot()
        with self._lock:
            return {"server_index": self.server_index, "server_num": self.server_num,
                    "endpoint": self.endpoint, "mode": self.mode, "counters": counters,
                    "tables": self.registry.table_stats(),
                    "stopped_workers": sorted(self.barriers.stopped),
                    "barriers": self.barriers.count, "rss_bytes": rss_bytes(),
                    "peak_rss_bytes": peak_rss_bytes(), **_inbound.figures(self._guard)}

    def create_tables(self, configs):
        """Create tables from JSON configs; see
        :meth:`pyfleet.service.registry.Registry.create_tables`. Thread-safe.
        Returns the name -> id map."""
        return self.registry.create_tables(configs)


def _op_name(op):
    try:
        return Op(op).name
    except ValueError:
        return f"op {op}"


def _log_bad(n, err, what="refused request"):
    # Hostile peers must not flood the log: the first few, then every power of two.
    if n <= 10 or (n & (n - 1)) == 0:
        log.warning("%s (#%d): %s", what, n, err)
