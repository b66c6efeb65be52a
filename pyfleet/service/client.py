"""The worker side of the parameter-server service: :class:`Client`.

A :class:`Client` talks to S servers (:mod:`pyfleet.service.server`) over
ZeroMQ DEALER sockets (:mod:`pyfleet.service.channel`), with the frames of
:mod:`pyfleet.service.protocol`; where keys and dense blocks go is
:mod:`pyfleet.service.routing`. Geo-SGD training wraps a client in a
:class:`pyfleet.service.geo.GeoClient`.

Sparse keys are deduplicated and routed with ``pyfleet.route(key, S)`` in one
O(n) hash pass (``pyfleet._core.unique_route``), each server's share sent as
contiguous requests in parallel (views of one buffer, no copy), and the answers
gathered into the caller's order by one C++ pass over the reply buffers; a
push sums the gradients of equal keys first (``_core.sum_rows``). Dense
parameters are split by a block placement ``(name, start, end, server_index)``
over the flattened parameter, learned from the servers (``create_tables``
places them).

Threads and sockets: sockets are never shared between threads. Each thread
that makes requests gets its own DEALER sockets (a "channel"), so a trainer's
synchronous pull goes straight from the calling thread to the wire. Pushes go
through one background pusher thread with a bounded queue: pushes queued to
the same table while the previous one is on the wire are merged (gradients of
equal keys summed) into one request. A heartbeat thread pings every server
every third of its heartbeat timeout.

Blocking: every request has a deadline (``timeout`` seconds; barriers wait for
the server's barrier timeout plus ``timeout``). A server that does not answer
in time raises :class:`pyfleet.errors.PeerTimeout` naming its endpoint and the
operation; an error reply raises :class:`pyfleet.errors.RemoteError` (a failed
barrier :class:`pyfleet.errors.BarrierError`) with the server's message.
A client started before its servers waits for them up to ``connect_deadline``.

Thread safety: every public method may be called from any thread. A future
returned by ``pull_sparse_async`` may be resolved from any thread.
"""


import os
import secrets

import numpy as np

from pyfleet import _core
from pyfleet.errors import PyfleetError, RemoteError
from pyfleet.service import auth as _auth
from pyfleet.service import protocol as P
from pyfleet.service.channel import Connection, Done, PullFuture, ReplyFuture, pull_rows
from pyfleet.service.protocol import Op
from pyfleet.service.pusher import Pusher
from pyfleet.service.routing import (
    TableMap,
    check_keys,
    check_values,
    gather_dense,
    plan_keys,
    split_configs,
    unique_keys,
)

__all__ = ["Client", "PullFuture", "unique_keys"]

_NO_CREATE = int(P.Flag.NO_CREATE)


class Client:
    """A worker's connection to every server.

    Args:
        endpoints: ``["host:port", ...]``, server ``i`` at index ``i``.
        worker_index: this worker's index (barriers, heartbeats, sync pushes).
        timeout: seconds any one request may take.
        connect_deadline: seconds to wait for servers that are not up yet.
        heartbeat_interval: seconds between heartbeats; default a third of the
            servers' heartbeat timeout; 0 disables the heartbeat thread.
        max_queued_pushes: pushes that may wait for the pusher thread before
            ``push_sparse_async`` blocks.
        max_request_keys: larger shares of a push are cut into several
            requests to the same server, so its handler threads apply them in
            parallel while later ones travel.
        max_pull_keys: the same for pulls. Larger by default: a server pulls
            a big request over its handler threads itself, and the rows of a
            share sent in one request come back without a copy (measured:
            128k keys to one server 15% faster in one request than in four).
        push_retries: how many times a push (sparse, dense, show/click) left
            unanswered for ``timeout`` seconds is sent again, with the same
            request id on a new socket, before :class:`PeerTimeout`: a server
            applies each request id once (a slow first copy arriving too is
            answered, not applied again). Default 0: fail at the first timeout.
        curve_server_keys: the servers' Z85 CURVE public keys (one, or one per
            endpoint) when they run with ``curve_secret_key``.
        curve_client_key: this client's ``(public, secret)`` Z85 key pair, or
            the path of its secret certificate (``pyfleet keygen``); needed by
            servers that authenticate clients (``curve_client_keys``). Default:
            a throwaway pair (enough for encryption only).
        ipc_dir: the directory servers on this machine listen in on Unix
            sockets (``Server(ipc_dir=...)``): a loopback endpoint whose socket
            is there is reached through it (no TCP, no CURVE); others over TCP.
        job_token: the job's secret (default: ``PYFLEET_JOB_TOKEN``, which a
            launcher gives every role): each server must answer a challenge
            with it (:func:`pyfleet.service.auth.job_proof`) before anything
            else is sent, else :class:`PyfleetError` names the endpoint.

    The constructor returns once every server answered (or raises PeerTimeout).
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, endpoints, worker_index=0, timeout=30.0, connect_deadline=60.0,
                 heartbeat_interval=None, max_queued_pushes=16, max_request_keys=32768,
                 curve_server_keys=None, curve_client_key=None, context=None,
                 max_pull_keys=1 << 20, push_retries=0, ipc_dir=None, job_token=None):
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e]
        self.endpoints = [e.removeprefix("tcp://") for e in endpoints]
        if not self.endpoints:
            raise ValueError("endpoints must name at least one server")
        self.worker_index = int(worker_index)
        self.timeout = float(timeout)
        self.connect_deadline = float(connect_deadline)
        self.num_servers = len(self.endpoints)
        self.max_request_keys = int(max_request_keys)
        if self.max_request_keys < 1:
            raise ValueError(f"max_request_keys must be >= 1, got {max_request_keys!r}")
        self.max_pull_keys = int(max_pull_keys)
        self.push_retries = int(push_retries)
        if self.push_retries < 0:
            raise ValueError(f"push_retries must be >= 0, got {push_retries!r}")
        if self.max_pull_keys < 1:
            raise ValueError(f"max_pull_keys must be >= 1, got {max_pull_keys!r}")
        curve = _auth.client_curve_keys(curve_server_keys, curve_client_key,
                                        self.num_servers)
        self._conn = Connection(self.endpoints, self.worker_index, self.timeout, curve, context,
                                ipc_dir)
        self._map = TableMap(self.num_servers, lambda: self._control_all(Op.TABLES, {}))
        token = os.environ.get(_auth.JOB_TOKEN_VAR) if job_token is None else job_token
        try:
            hello_payload = {"worker": self.worker_index}
            if token:  # servers must prove they belong to this job before anything else
                hello_payload["challenge"] = secrets.token_hex(16)
            hello = self._control_all(Op.HEARTBEAT, hello_payload,
                                      timeout=self.connect_deadline)
            _check_hello(self.endpoints, hello, token, hello_payload.get("challenge"))
        except BaseException:
            self._conn.close_channels()
            raise
        self.server_info = hello
        self._conn.reopen_near()   # the servers answered: their Unix sockets are bound
        self.mode = hello[0].get("mode")
        self.barrier_timeout = max(float(h.get("barrier_timeout", 300.0)) for h in hello)
        hb = min(float(h.get("heartbeat_timeout", 10.0)) for h in hello)
        self.heartbeat_interval = hb / 3.0 if heartbeat_interval is None else float(
            heartbeat_interval)
        self._pusher = Pusher(self._push_now, max(1, int(max_queued_pushes)),
                              self.timeout + 1.0)
        self._conn.start_heartbeats(self.heartbeat_interval)

    # ------------------------------------------------------------- plumbing

    @property
    def _ids(self):
        """Per server, ``{table key: id}`` (what requests name)."""
        return self._map.ids

    def _channel(self):
        return self._conn.channel()

    def _send(self, ch, server, op, timeout=None, **kw):
        return self._conn.send(ch, server, op, timeout, **kw)

    def _control_all(self, op, payload, timeout=None, servers=None):
        return self._conn.control_all(op, payload, timeout, servers)

    def _sparse_dim(self, table):
        return self._map.sparse_dim(table)

    def sparse_dim(self, name):
        """The row width of sparse table ``name``; ValueError if no server has it."""
        return self._map.sparse_dim(name)

    def dense_shape(self, name):
        """The shape of dense parameter ``name``; ValueError unless fully placed."""
        return self._map.dense_blocks(name)[0]

    def _sparse_configs(self):
        """``{name: config}`` of every sparse table the servers hold."""
        self._map.refresh()
        return dict(self._map.sparse_cfg)

    def _dense_blocks(self, name):
        return self._map.dense_blocks(name)

    # ---------------------------------------------------------- sparse data

    def pull_sparse_async(self, table, keys, unique=False, create=True):
        """Send the pull now; the rows (float32 ``[len(keys), dim]``, in the
        order of ``keys``) come from ``.result()``. Lets a trainer prefetch.
        ``keys`` must not be modified until the result is taken.
        ``unique=True``: the caller already deduplicated ``keys``, so the
        client may skip its own dedup (see :func:`~pyfleet.service.routing.plan_keys`). ``create=False``:
        keys without a row get their initial row and the servers make none
        (evaluation: test-only ids do not grow the tables)."""
        ch, calls, parts, inverse, dim = self._send_pull(table, keys, unique, create)
        if not calls:  # no keys at all
            return Done(np.empty((0, dim), dtype=np.float32))
        return PullFuture(ch, calls, parts, inverse, dim)

    def pull_sparse(self, table, keys, unique=False, create=True):
        """Rows of ``keys`` (uint64 1-D) as float32 ``[len(keys), dim]``. Blocks.
        ``unique`` and ``create``: as :meth:`pull_sparse_async`."""
        ch, calls, parts, inverse, dim = self._send_pull(table, keys, unique, create)
        if not calls:
            return np.empty((0, dim), dtype=np.float32)
        # No future to build: its bookkeeping is a tenth of a 1-key pull here.
        return pull_rows(ch.wait(calls), parts, inverse, dim)

    def _send_pull(self, table, keys, unique, create=True):
        """``(channel, calls, parts, inverse, dim)`` of a pull sent now."""
        keys = check_keys(keys)
        dim = self._sparse_dim(table)
        grouped, inverse, parts = plan_keys(keys, self.num_servers, unique, self.max_pull_keys)
        ch = self._channel()
        flags = 0 if create else _NO_CREATE
        calls = [self._send(ch, s, Op.PULL_SPARSE, table=self._ids[s][table],
                            keys=grouped[a:b], dim=dim, flags=flags) for s, a, b in parts]
        return ch, calls, parts, inverse, dim

    def push_sparse_async(self, table, keys, grads, delta=False, unique=False, copy=True):
        """Queue a push (gradients, or with ``delta=True`` geo deltas); returns a
        ``concurrent.futures.Future`` set when every server applied it. Blocks
        only while the push queue is full.

        Ownership: with ``copy=True`` the arrays are copied when queued, so the
        caller may reuse them at once. ``copy=False`` hands them over: the
        caller must not modify them until the future is done (they may be
        sent as they are). ``unique=True``: ``keys`` are distinct (no dedup
        needed; see :func:`~pyfleet.service.routing.plan_keys`)."""
        keys = check_keys(keys)
        dim = self._sparse_dim(table)
        grads = check_values(grads, (keys.shape[0], dim), "grads")
        if copy:
            keys, grads = keys.copy(), grads.copy()
        return self._pusher.submit(table, P.Flag.ADD_DELTA if delta else 0, keys, grads,
                                   unique)

    def push_sparse(self, table, keys, grads, delta=False, unique=False):
        """Push and wait until every server applied it (or raise)."""
        keys = check_keys(keys)
        dim = self._sparse_dim(table)
        grads = check_values(grads, (keys.shape[0], dim), "grads")
        self._pusher.submit(table, P.Flag.ADD_DELTA if delta else 0, keys, grads,
                            unique).result()

    def push_show_click(self, table, keys, shows, clicks):
        """Add show and click counts (float32 ``[n]`` each) to the rows of ``keys``
        (equal keys summed first); the servers' ``shrink(min_score=...)`` reads
        them. Waits until every server applied them."""
        keys = check_keys(keys)
        self._sparse_dim(table)
        n = keys.shape[0]
        values = np.stack([check_values(shows, (n,), "shows"),
                           check_values(clicks, (n,), "clicks")], axis=1)
        self._send_rows(Op.PUSH_SHOW_CLICK, table, keys, values, 0)

    def _push_now(self, table, keys, grads, flags, unique=False):
        self._send_rows(Op.PUSH_SPARSE, table, keys, grads, flags, unique)

    def _send_rows(self, op, table, keys, values, flags, unique=False):
        """Send rows of ``values`` (those of equal keys summed) to their
        servers, and wait until every server applied them."""
        grouped, inverse, parts = plan_keys(keys, self.num_servers, unique, self.max_request_keys)
        if inverse is not None:
            values = _core.sum_rows(values, inverse, grouped.shape[0])
        dim = values.shape[1]
        ch = self._channel()
        calls = [self._send(ch, s, op, table=self._ids[s][table], keys=grouped[a:b],
                            values=values[a:b], dim=dim, flags=flags,
                            retries=self.push_retries) for s, a, b in parts]
        ch.wait(calls)

    def flush(self):
        """Wait until every queued push is applied; raise the first push error
        since the previous flush (each error is also set on its future)."""
        self._pusher.flush()

    def export_sparse(self, table, page_rows=65536):
        """Every row of sparse table ``table`` on every server, weights only:
        yields ``(keys uint64[n], weights float32[n, dim])`` pages of at most
        ``page_rows`` rows (server by server, keys ascending within a server),
        so a huge table streams in bounded messages. Pending pushes are flushed
        first; rows created or changed during the export may or may not appear.
        Blocks per page."""
        if isinstance(page_rows, bool) or not isinstance(page_rows, int) or page_rows < 1:
            raise ValueError(f"page_rows must be a positive integer, got {page_rows!r}")
        dim = self._sparse_dim(table)
        self.flush()
        ch = self._channel()
        for s in range(self.num_servers):
            after = None
            while True:
                call = self._send(ch, s, Op.EXPORT_SPARSE, table=self._ids[s][table],
                                  dim=dim, payload={"after": after, "limit": page_rows})
                ((h, frames),) = ch.wait([call])
                if len(frames) != 3 or h.dim != dim:
                    raise RemoteError(f"server {s} ({self.endpoints[s]}) sent a malformed "
                                      f"EXPORT_SPARSE reply")
                yield (P.keys_from(frames[0], h.count).copy(),
                       P.values_from(frames[1], h.count, dim).copy())
                after = P.parse_json(frames[2]).get("next")
                if after is None:
                    break

    # ----------------------------------------------------------- dense data

    def pull_dense(self, name):
        """The whole dense parameter ``name`` (float32, its shape), gathered from
        its blocks (one request per server holding some)."""
        return self.pull_dense_many([name])[name]

    def push_dense(self, name, grad, delta=False):
        """Send each block of ``grad`` (float32, the parameter's shape) to its
        server and wait until applied (``delta=True``: geo deltas, added)."""
        self.push_dense_many({name: grad}, delta=delta)

    def pull_dense_many(self, names):
        """``{name: value}`` of several dense parameters: one PULL_DENSE_MANY
        request per server carries every block it holds, all in flight at once,
        so the step pays one round trip. Blocks.

        A parameter held whole by one server is returned as a view of the reply
        message (no copy): the caller owns it (nothing else refers to that
        buffer) and may modify it; it keeps the reply's memory alive."""
        shapes, plan = self._map.dense_plan(names)
        ch = self._channel()
        calls = [self._conn.send_dense_many(ch, s, Op.PULL_DENSE_MANY, blocks)
                 for s, blocks in plan.items()]
        return gather_dense(shapes, plan, ch.wait(calls), self.endpoints)

    def push_dense_many(self, grads, delta=False):
        """Push every ``{name: grad}`` (as :meth:`push_dense`): one
        PUSH_DENSE_MANY request per server with every block it holds, all in
        flight at once; returns when every block is applied (or raises). The
        gradients are sent without a copy: do not modify them until it returns."""
        self._push_dense(grads, P.Flag.ADD_DELTA if delta else 0)

    def push_pull_dense_many(self, grads):
        """Push every ``{name: grad}`` and return ``{name: value}``, each
        parameter's value right after this push was applied (other workers'
        pushes may interleave): push and pull in one round trip per server
        (Flag.PULL_AFTER). Not in sync mode (values change at the barrier).
        Values are views of the replies as in :meth:`pull_dense_many`."""
        return self.push_pull_dense_many_async(grads).result()

    def push_pull_dense_many_async(self, grads):
        """:meth:`push_pull_dense_many` sent now; ``.result()`` waits for the
        values (and raises the push's error). The requests leave from this
        thread's sockets with no thread hand-off, and the replies wait in
        them meanwhile. The gradients must not be modified until
        ``.result()`` returned (large ones are sent without a copy)."""
        shapes, plan, ch, calls = self._send_dense_push(grads, P.Flag.PULL_AFTER)
        return ReplyFuture(ch, calls, lambda replies: gather_dense(shapes, plan, replies,
                                                                     self.endpoints))

    def _push_dense(self, grads, flags):
        _, _, ch, calls = self._send_dense_push(grads, flags)
        ch.wait(calls)

    def _send_dense_push(self, grads, flags):
        shapes, plan = self._map.dense_plan(grads)
        flat = {name: check_values(g, shapes[name], f"gradient of {name!r}").reshape(-1)
                for name, g in grads.items()}
        ch = self._channel()
        calls = [self._conn.send_dense_many(ch, s, Op.PUSH_DENSE_MANY, blocks, flat, flags,
                                            self.push_retries)
                 for s, blocks in plan.items()]
        return shapes, plan, ch, calls

    def dense_placement(self):
        """``[(name, start, end, server_index)]`` of every known dense block."""
        self._map.refresh()
        return [(n, a, b, s) for n, (_, blocks) in sorted(self._map.dense.items())
                for a, b, s, _ in blocks]

    # -------------------------------------------------------------- control

    def create_tables(self, configs, placement=None):
        """Create tables on the servers (idempotent; every worker may call it).

        Sparse configs go to every server. A dense config goes to the servers
        its blocks name: ``placement`` is a list of ``(name, start, end,
        server_index)`` over the flattened parameter (as computed by
        ``pyfleet.config``); a dense parameter it does not mention is placed
        whole on server ``i % S`` for the ``i``-th dense config."""
        per_server = split_configs(configs, placement, self.num_servers)
        ch = self._channel()
        calls = [self._send(ch, s, Op.CREATE_TABLES, payload={"tables": lst})
                 for s, lst in enumerate(per_server)]
        self._map.learn([P.parse_json(frames[0]) for _, frames in ch.wait(calls)])

    def barrier(self, kind="step", flush=True):
        """Flush pushes, then wait until every live worker reached the barrier on
        every server (sync mode: the step's averaged update is applied). Raises
        BarrierError naming a missing worker when the servers give up.

        ``kind="pass"`` (``fleet.barrier_worker``): this worker is done with
        its share; the others' step barriers go on without it, and this one
        returns once every live worker is at a pass barrier. ``flush=False``:
        the caller flushed (and took the errors of) the pushes itself."""
        if flush:
            self.flush()
        return self._control_all(Op.BARRIER, {"worker": self.worker_index, "kind": kind},
                                 timeout=self.barrier_timeout + self.timeout)

    def heartbeat(self):
        return self._control_all(Op.HEARTBEAT, {"worker": self.worker_index})

    def stop_worker(self, may_return=False, timeout=None):
        """Flush pushes and tell every server this worker is done (a server exits once
        all its workers are). Stops the heartbeats, unless ``may_return`` (then
        :meth:`join`; see :mod:`pyfleet.distributed.worker_return`)."""
        self.flush()
        if not may_return:
            self._conn.stop_heartbeats()
        return self._control_all(Op.STOP_WORKER, {"worker": self.worker_index,
                                                  "may_return": may_return}, timeout=timeout)

    def join(self):  # after stop_worker(may_return=True): a worker again
        return self._control_all(Op.JOIN, {"worker": self.worker_index})

    def save(self, dirname, mode="full", timeout=None):
        """Every server saves its shards under ``<checkpoint_dir>/<dirname>``;
        returns each server's ``{"rows", "files", "file_info"}``. ``timeout``:
        seconds the save may take (default: 10 x the request timeout, since a
        big table takes long to write); a server that dies meanwhile still
        fails the call within the request timeout (it stops answering
        heartbeats)."""
        if mode not in ("full", "delta"):
            raise ValueError(f"mode must be 'full' or 'delta', got {mode!r}")
        self.flush()
        return self._control_all(Op.SAVE, {"dir": str(dirname), "mode": mode},
                                 timeout=10 * self.timeout if timeout is None else timeout)

    def load(self, dirname, timeout=None):
        """Every server loads its keys from ``<checkpoint_dir>/<dirname>``
        (written by any number of servers; a ``fleet.save_persistables``
        directory, or a list of them, is verified first, see
        ``Server.load_checkpoint``). ``timeout`` as for :meth:`save`."""
        self.flush()
        dirs = [str(d) for d in dirname] if isinstance(dirname, (list, tuple)) else str(dirname)
        return self._control_all(Op.LOAD, {"dir": dirs},
                                 timeout=10 * self.timeout if timeout is None else timeout)

    def shrink(self, max_unseen_passes=None, min_update_count=None, min_score=None,
               decay=None, tables=None):
        """End a pass on every sparse table (see ``SparseTable.shrink``); returns
        each server's ``{"dropped": {table: rows}}``."""
        self.flush()
        args = {"max_unseen_passes": max_unseen_passes, "min_update_count": min_update_count,
                "min_score": min_score, "decay": decay, "tables": tables}
        args = {k: v for k, v in args.items() if v is not None}
        return self._control_all(Op.SHRINK, args)

    def stats(self):
        """Each server's counters and table stats (a list, by server index)."""
        return self._control_all(Op.STATS, {})

    def close(self):
        """Flush nothing more, stop the threads, close the sockets. Idempotent."""
        if self._conn.closed:
            return
        self._conn.closed = True  # no new channel: pushes still queued fail
        self._conn.stop_heartbeats()
        self._pusher.close()
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _check_hello(endpoints, hello, token, challenge):
    """The servers' answers to a connecting client's HEARTBEAT: with a job token, each
    proves it belongs to the job; each is the server its place in ``endpoints`` says."""
    for i, info in enumerate(hello):
        if token and info.get("proof") != _auth.job_proof(token, challenge):
            raise PyfleetError(
                f"server at {endpoints[i]} cannot prove it belongs to this job "
                f"(its answer to {_auth.JOB_TOKEN_VAR}'s challenge is "
                f"{'missing' if 'proof' not in info else 'wrong'}): another process "
                f"may hold that port; nothing else was sent to it")
        if info.get("server_index") != i or info.get("server_num") != len(endpoints):
            raise PyfleetError(
                f"server at {endpoints[i]} says it is server "
                f"{info.get('server_index')} of {info.get('server_num')}, expected "
                f"{i} of {len(endpoints)}: check the endpoint order")
