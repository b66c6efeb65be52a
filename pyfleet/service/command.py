"""``pyfleet server`` (or ``python -m pyfleet.service``): run one parameter server from the command line.

``pyfleet server --endpoint HOST:PORT --index I --num-servers S
--workers W --mode MODE`` runs one :class:`~pyfleet.service.server.Server`
and exits 0 once every worker has called ``stop_worker``, 1 when the server
gave up (its reason on stderr) or could not start (a taken port, a bad table
config, a refused bind), 2 for a bad option. Port 0 picks a free port; the
line ``pyfleet.server ready on HOST:PORT`` is printed when it serves. Every
option: ``--help`` and docs/service.md.
"""

import argparse
import json
import logging
import os
import signal
import sys

from pyfleet.config import MODES
from pyfleet.errors import EndpointInUse, PyfleetError
from pyfleet.service import auth as _auth
from pyfleet.service import limits
from pyfleet.service.limits import Limits
from pyfleet.service.loop import INLINE_LIMIT
from pyfleet.service.server import Server
from pyfleet.service.table_ops import SPLIT_PULL_KEYS

__all__ = ["main"]


def main(argv=None, prog="python -m pyfleet.service"):
    p = argparse.ArgumentParser(prog=prog, description="Run one pyfleet parameter server.")
    p.add_argument("--endpoint", default="127.0.0.1:0",
                   help="host:port to bind (port 0: any free port; default 127.0.0.1:0)")
    p.add_argument("--index", type=int, required=True, help="this server's index")
    p.add_argument("--num-servers", type=int, required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--mode", choices=MODES, default="async")
    p.add_argument("--handler-threads", type=int, default=2)
    p.add_argument("--inline-limit", type=int, default=INLINE_LIMIT,
                   help="requests of at most this many floats are served by the socket thread")
    p.add_argument("--split-pull-keys", type=int, default=SPLIT_PULL_KEYS,
                   help="pull sparse requests of at least this many keys in up to "
                        "--handler-threads parts at once (0: never)")
    p.add_argument("--heartbeat-timeout", type=float, default=10.0)
    p.add_argument("--barrier-timeout", type=float, default=300.0)
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--tables", default=None, help="JSON file: a list of table configs")
    p.add_argument("--spill-dir", default=None, metavar="DIR",
                   help="the directory under which workers' table configs may place a disk "
                        "tier (spill_dir); without it a peer cannot ask for one")
    p.add_argument("--curve-secret-key-file", default=None,
                   help="file holding a Z85 CURVE secret key, or a certificate from "
                        "'pyfleet keygen' (NAME.key_secret): encrypt the endpoint "
                        "(default: $PYFLEET_CURVE_SERVER_SECRET)")
    p.add_argument("--curve-client-keys", default=None,
                   help="directory of admitted client public keys (*.key): authenticate "
                        "clients (default: $PYFLEET_CURVE_CLIENT_KEYS_DIR)")
    p.add_argument("--insecure", action="store_true",
                   help="serve a non-loopback address without client authentication "
                        "(refused otherwise)")
    limits.add_arguments(p)
    p.add_argument("--log-level", default="WARNING")
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        env_auth = _auth.server_options_from_env()
    except ValueError as e:  # a key variable naming a missing or incomplete key set
        print(f"pyfleet.server: {e}", file=sys.stderr)
        return 2
    curve = env_auth.get("curve_secret_key")
    clients = a.curve_client_keys or env_auth.get("curve_client_keys")
    if a.curve_secret_key_file:
        with open(a.curve_secret_key_file) as f:
            text = f.read().strip()
        curve = text if len(text) == 40 else _auth.load_keypair(a.curve_secret_key_file)[1]
    tables = None
    if a.tables:
        with open(a.tables) as f:
            tables = json.load(f)
    if a.checkpoint_dir is not None and not os.path.isdir(a.checkpoint_dir):
        print(f"pyfleet.server: --checkpoint-dir {a.checkpoint_dir} is not a directory",
              file=sys.stderr)
        return 2
    try:
        server = Server(a.endpoint, a.index, a.num_servers, a.workers, mode=a.mode,
                        tables=tables, handler_threads=a.handler_threads,
                        max_message_bytes=a.max_message_bytes,
                        heartbeat_timeout=a.heartbeat_timeout,
                        barrier_timeout=a.barrier_timeout, checkpoint_dir=a.checkpoint_dir,
                        inline_limit=a.inline_limit, curve_secret_key=curve,
                        curve_client_keys=clients, split_pull_keys=a.split_pull_keys,
                        insecure=a.insecure or None, spill_root=a.spill_dir,
                        ipc_dir=env_auth.get("ipc_dir"),
                        **{k: getattr(a, k) for k in Limits._fields if k != "max_message_bytes"})
    except (PyfleetError, ValueError) as e:  # a taken port, a bad table config
        print(f"pyfleet.server: {e}", file=sys.stderr)
        # A taken port is worth trying again (a launcher does not count it as a death).
        return EndpointInUse.EXIT_CODE if isinstance(e, EndpointInUse) else 1
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    signal.signal(signal.SIGINT, lambda *_: server.stop())
    print(f"pyfleet.server ready on {server.endpoint}", flush=True)
    server.run()
    if server.failure is not None:
        print(f"pyfleet.server: {server.failure}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
