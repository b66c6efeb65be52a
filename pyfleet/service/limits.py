"""What a peer may make one server hold: :class:`Limits` (docs/service.md, "Limits").

A server's memory must not grow with what an untrusted or broken peer sends.
Each limit is a ``Server(...)`` argument and a ``python -m pyfleet.server``
flag (the same name with dashes):

- ``max_message_bytes`` (default 1 GiB): the largest message. libzmq enforces
  it per frame (``ZMQ_MAXMSGSIZE``: a peer sending a larger frame is
  disconnected); a message whose frames add up to more is refused once
  received. libzmq delivers a multipart message whole, so a peer can make the
  server buffer several frames of up to this size before the server sees any
  of them: against a hostile peer the bound is authentication
  (``curve_client_keys``), which keeps unlisted peers from sending anything.
- ``max_queued_replies`` (default 16) and ``max_backlog_bytes`` (default
  64 MiB): replies waiting for one peer that does not read them: that many in
  libzmq's queue (``ZMQ_SNDHWM`` with ``ZMQ_ROUTER_MANDATORY``), then up to
  that many bytes in the server's backlog for the peer (a burst of small
  replies can outrun libzmq's count of what left); a reply beyond is dropped,
  logged and counted (``dropped_replies``). A pyfleet client's I/O thread
  reads its replies as they come, whatever its program does.
- ``max_request_keys`` (default 2^20, the client's largest pull): keys in one
  sparse request; a pull's reply (keys x dim floats) must also fit
  ``max_message_bytes``. Checked before any row is made.
- ``max_dense_floats`` (default 2^26), ``max_sparse_dim`` (default 4096),
  ``max_tables`` (default 1024): what a ``CREATE_TABLES`` request may add:
  dense blocks up to that many floats on this server in all, sparse rows up
  to that dim, tables up to that count. Tables given to the server itself
  (``Server(tables=...)``, ``--tables``, Fleet's ``init_server``) are the
  operator's and not capped; a request repeating an existing config is a
  no-op and never refused.
"""

from typing import NamedTuple

from pyfleet.service.protocol import Refused

__all__ = ["DEFAULTS", "Limits", "add_arguments"]


class Limits(NamedTuple):
    max_message_bytes: int = 1 << 30
    max_queued_replies: int = 16
    max_backlog_bytes: int = 64 << 20
    max_request_keys: int = 1 << 20
    max_dense_floats: int = 1 << 26
    max_sparse_dim: int = 4096
    max_tables: int = 1024

    @classmethod
    def make(cls, **values):
        """Limits from keyword values (None: the default); each must be an int >= 1."""
        out = {}
        for name, default in cls._field_defaults.items():
            v = values.get(name)
            v = default if v is None else v
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
            out[name] = v
        return cls(**out)

    def check_keys(self, op, count, dim):
        """Refuse a sparse request of ``count`` keys of ``dim`` floats (before
        anything is pulled, pushed or created)."""
        if count > self.max_request_keys:
            raise Refused(f"{op.name} of {count} keys exceeds this server's max_request_keys="
                          f"{self.max_request_keys} (--max-request-keys; a client cuts its "
                          f"requests at max_pull_keys/max_request_keys, which must not be "
                          f"larger)")
        if 4 * count * dim > self.max_message_bytes:
            raise Refused(f"{op.name} of {count} keys x dim {dim} needs a message of "
                          f"{4 * count * dim} bytes, over max_message_bytes="
                          f"{self.max_message_bytes}")

    def check_new_tables(self, new, existing):
        """Refuse a CREATE_TABLES request whose ``new`` configs (tables not yet
        held) would take this server beyond the table limits; ``existing``: the
        entries held. Each config is ``(key, cfg, dense floats)``."""
        if len(existing) + len(new) > self.max_tables:
            raise Refused(f"CREATE_TABLES would make {len(existing) + len(new)} tables, over "
                          f"this server's max_tables={self.max_tables} (--max-tables)")
        held = sum(e.end - e.start for e in existing if e.kind == "dense")
        for key, cfg, floats in new:
            if cfg["kind"] == "sparse":
                dim = cfg.get("dim")
                if isinstance(dim, int) and dim > self.max_sparse_dim:
                    raise Refused(f"CREATE_TABLES: sparse table {key!r} of dim {dim} is over "
                                  f"this server's max_sparse_dim={self.max_sparse_dim} "
                                  f"(--max-sparse-dim)")
            held += floats
        if held > self.max_dense_floats:
            raise Refused(f"CREATE_TABLES would hold {held} dense floats on this server, over "
                          f"max_dense_floats={self.max_dense_floats} (--max-dense-floats)")


DEFAULTS = Limits()


def add_arguments(parser):
    """The ``--max-*`` flags of ``python -m pyfleet.server`` (read them back
    with ``Limits.make(**vars(args))``)."""
    helps = {
        "max_message_bytes": "largest message: per frame by libzmq, whole messages once "
                             "received (default 1 GiB)",
        "max_queued_replies": "replies kept for a peer that does not read them; more are "
                              "dropped (default 16)",
        "max_backlog_bytes": "bytes of replies kept for a peer beyond --max-queued-replies "
                             "(default 64 MiB)",
        "max_request_keys": "keys in one sparse request (default 1048576)",
        "max_dense_floats": "dense floats CREATE_TABLES requests may make on this server "
                            "(default 67108864)",
        "max_sparse_dim": "largest sparse dim a CREATE_TABLES request may make (default 4096)",
        "max_tables": "tables a CREATE_TABLES request may bring this server to (default 1024)",
    }
    for name, default in Limits._field_defaults.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=default,
                            help=helps[name])
