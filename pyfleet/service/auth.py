"""CURVE keys and client authentication for pyfleet clusters across hosts.

Two levels of protection, both ZeroMQ CURVE (see ``docs/operations.md``,
"Secure a cluster"):

- *encryption* only: the server has a key pair; any client that knows the
  server's public key can connect (``Server(curve_secret_key=...)``).
- *authentication*: in addition, the server admits only clients whose public
  keys are listed in a directory (``Server(curve_client_keys=DIR)``). A ZAP
  authenticator thread (pyzmq's ``ThreadAuthenticator``) checks every
  handshake; a client without a listed key never gets a connection, so none of
  its requests (pull, push, save, stop...) reach the server, which keeps
  serving the authorized clients.

Key files are the ZeroMQ certificate format written by
``zmq.auth.create_certificates``: ``NAME.key`` holds the public key,
``NAME.key_secret`` both keys (mode 0600). :func:`keygen` writes a cluster's
keys in one directory::

    DIR/server.key  DIR/server.key_secret      the servers' pair (one for all servers)
    DIR/client.key  DIR/client.key_secret      a client's pair (one per name)
    DIR/authorized_clients/client.key          public keys the servers admit

Environment contract (read by ``fleet.init_server``/``fleet.init_worker``;
values are file paths, or a 40-character Z85 key where a public key is asked):

======================================  =======  ==================================================
variable                                role     meaning
======================================  =======  ==================================================
``PYFLEET_CURVE_DIR``                   both     a :func:`keygen` directory: default for every
                                                 variable below (files missing there are skipped)
``PYFLEET_CURVE_SERVER_SECRET``         server   the servers' secret certificate: turns CURVE on
``PYFLEET_CURVE_CLIENT_KEYS_DIR``       server   directory of admitted client public keys
                                                 (``*.key``): turns authentication on
``PYFLEET_CURVE_SERVER_PUBLIC``         worker   the servers' public key (certificate or Z85)
``PYFLEET_CURVE_CLIENT_SECRET``         worker   this client's secret certificate (without it a
                                                 throwaway pair is used: fine for encryption only)
``PYFLEET_IPC_DIR``                     both     a directory of this user, mode 0700: servers on
                                                 loopback also listen on Unix sockets there, and
                                                 clients on this machine use them (no TCP, no
                                                 CURVE: the directory admits). The launcher
                                                 sets one per job; empty: off
======================================  =======  ==================================================

A job a launcher starts also carries ``PYFLEET_JOB_TOKEN`` (a random secret
per job, in every role's environment): a client that has one challenges each
server when it connects (a random nonce in its first ``HEARTBEAT``) and talks
on only to servers that answer with :func:`job_proof` of it, so a process
that took a dead server's port cannot pass for that server, with or without
CURVE keys.

Everything here is stateless apart from :class:`ZapAuthenticator`, whose
start/stop must be paired (use it as a context manager).
"""

import hashlib
import hmac
import ipaddress
import logging
import os

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from pyfleet.service.wire import check_ipc_dir

__all__ = [
    "ENV_VARS",
    "JOB_TOKEN_VAR",
    "ZapAuthenticator",
    "check_exposure",
    "client_curve_keys",
    "client_options_from_env",
    "is_loopback_host",
    "job_proof",
    "keygen",
    "load_keypair",
    "load_public_key",
    "server_options_from_env",
]

log = logging.getLogger("pyfleet.auth")

ENV_VARS = ("PYFLEET_CURVE_DIR", "PYFLEET_CURVE_SERVER_SECRET", "PYFLEET_CURVE_CLIENT_KEYS_DIR",
            "PYFLEET_CURVE_SERVER_PUBLIC", "PYFLEET_CURVE_CLIENT_SECRET", "PYFLEET_IPC_DIR")
AUTHORIZED_DIR = "authorized_clients"
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


JOB_TOKEN_VAR = "PYFLEET_JOB_TOKEN"


def job_proof(token, challenge):
    """A server's answer to a client's ``challenge`` (hex) under the job's
    ``token``: HMAC-SHA256, hex. Only a process given the token can make it."""
    return hmac.new(str(token).encode(), str(challenge).encode(), hashlib.sha256).hexdigest()


def keygen(directory, names=("server", "client")):
    """Write a key pair per name in ``directory`` (created if missing) and copy
    every public key except ``"server"``'s into ``directory/authorized_clients``.
    Refuses to overwrite an existing pair. Returns the paths written, in order
    (public, secret per name, then the authorized copies)."""
    directory = os.fspath(directory)
    names = list(names)
    if not names:
        raise ValueError("keygen needs at least one name")
    for n in names:
        if not isinstance(n, str) or not n or not set(n) <= _NAME_CHARS or n.startswith("."):
            raise ValueError(f"key name {n!r} must be letters, digits, '_', '-' or '.'")
    if len(set(names)) != len(names):
        raise ValueError(f"key names must be distinct, got {names}")
    for n in names:
        if os.path.exists(os.path.join(directory, n + ".key_secret")):
            raise ValueError(f"{os.path.join(directory, n + '.key_secret')} exists; "
                             f"refusing to overwrite a key")
    os.makedirs(os.path.join(directory, AUTHORIZED_DIR), exist_ok=True)
    os.chmod(directory, 0o700)
    paths, authorized = [], []
    for n in names:
        public, secret = zmq.auth.create_certificates(directory, n)
        os.chmod(secret, 0o600)
        paths += [public, secret]
        if n != "server":
            copy = os.path.join(directory, AUTHORIZED_DIR, n + ".key")
            with open(public, "rb") as src, open(copy, "wb") as dst:
                dst.write(src.read())
            authorized.append(copy)
    return paths + authorized


def load_keypair(path):
    """``(public, secret)`` Z85 bytes from a secret certificate file."""
    public, secret = _load(path)
    if secret is None:
        raise ValueError(f"{path} holds no secret key (use the NAME.key_secret file)")
    return public, secret


def load_public_key(value):
    """A Z85 public key from a certificate file, or ``value`` itself when it is a
    40-character Z85 key."""
    if isinstance(value, bytes):
        value = value.decode("ascii")
    value = os.fspath(value)
    if len(value) == 40 and not os.path.exists(value):
        try:
            zmq.utils.z85.decode(value)
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{value!r} is neither a key file nor a Z85 key") from None
        return value.encode("ascii")
    return _load(value)[0]


def _load(path):
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"CURVE key file {path!r} does not exist")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (ValueError, OSError) as e:
        raise ValueError(f"CURVE key file {path!r} is not a ZeroMQ certificate: {e}") from None
    if public is None or len(public) != 40:
        raise ValueError(f"CURVE key file {path!r} holds no public key")
    return public, secret


def _env_path(env, var, default_name):
    value = env.get(var)
    if value:
        return value
    base = env.get("PYFLEET_CURVE_DIR")
    if base:
        path = os.path.join(base, default_name)
        if os.path.exists(path):
            return path
    return None


def _ipc_from_env(env):
    """``{"ipc_dir": ...}`` from ``PYFLEET_IPC_DIR`` (checked), or {}."""
    path = env.get("PYFLEET_IPC_DIR", "")
    return {"ipc_dir": check_ipc_dir(path, "PYFLEET_IPC_DIR")} if path else {}


def server_options_from_env(env=None):
    """``Server`` keyword arguments (``curve_secret_key``, ``curve_client_keys``,
    ``ipc_dir``)
    from the environment contract; empty when no variable is set. A variable
    naming a missing or bad file is a ValueError naming the variable."""
    env = os.environ if env is None else env
    out = _ipc_from_env(env)
    secret = _env_path(env, "PYFLEET_CURVE_SERVER_SECRET", "server.key_secret")
    clients = _env_path(env, "PYFLEET_CURVE_CLIENT_KEYS_DIR", AUTHORIZED_DIR)
    base = env.get("PYFLEET_CURVE_DIR")
    if base:
        # A key directory given to a server means authentication: without its
        # secret or its client list the server would run in the clear, or
        # admit any client key, while the operator believes it authenticates.
        if not secret:
            raise ValueError(f"PYFLEET_CURVE_DIR: {base!r} holds no server.key_secret (and "
                             f"PYFLEET_CURVE_SERVER_SECRET is not set): a server cannot "
                             f"authenticate without its key pair ('pyfleet keygen DIR')")
        if not clients:
            raise ValueError(f"PYFLEET_CURVE_DIR: {base!r} has no {AUTHORIZED_DIR}/ directory "
                             f"(and PYFLEET_CURVE_CLIENT_KEYS_DIR is not set): the server "
                             f"would admit any client key. Copy the clients' public keys "
                             f"(NAME.key) into {os.path.join(base, AUTHORIZED_DIR)}/ "
                             f"('pyfleet keygen DIR' makes it)")
    if secret:
        try:
            out["curve_secret_key"] = load_keypair(secret)[1]
        except ValueError as e:
            raise ValueError(f"PYFLEET_CURVE_SERVER_SECRET: {e}") from None
    if clients:
        if not secret:
            raise ValueError("PYFLEET_CURVE_CLIENT_KEYS_DIR is set but "
                             "PYFLEET_CURVE_SERVER_SECRET is not: authentication needs the "
                             "server's key pair")
        if not os.path.isdir(clients):
            raise ValueError(f"PYFLEET_CURVE_CLIENT_KEYS_DIR: {clients!r} is not a directory")
        out["curve_client_keys"] = clients
    return out


def client_options_from_env(env=None):
    """``Client`` keyword arguments (``curve_server_keys``, ``curve_client_key``,
    ``ipc_dir``)
    from the environment contract; empty when no variable is set."""
    env = os.environ if env is None else env
    out = _ipc_from_env(env)
    public = _env_path(env, "PYFLEET_CURVE_SERVER_PUBLIC", "server.key")
    secret = _env_path(env, "PYFLEET_CURVE_CLIENT_SECRET", "client.key_secret")
    if public:
        try:
            out["curve_server_keys"] = load_public_key(public)
        except ValueError as e:
            raise ValueError(f"PYFLEET_CURVE_SERVER_PUBLIC: {e}") from None
    if secret:
        if not public:
            raise ValueError("PYFLEET_CURVE_CLIENT_SECRET is set but PYFLEET_CURVE_SERVER_PUBLIC "
                             "is not: a client key needs the server's public key")
        try:
            out["curve_client_key"] = load_keypair(secret)
        except ValueError as e:
            raise ValueError(f"PYFLEET_CURVE_CLIENT_SECRET: {e}") from None
    return out


def check_exposure(host, secret_key, client_keys, insecure):
    """Refuse (ValueError) a server on ``host`` that anyone could reach and change:
    a non-loopback host without client authentication (``client_keys``, which needs
    the server's ``secret_key``), unless ``insecure`` (None: environment
    ``PYFLEET_INSECURE=1``), which logs a warning instead."""
    if client_keys is not None and secret_key is None:
        raise ValueError("curve_client_keys needs curve_secret_key (the server's key pair)")
    if insecure is None:
        insecure = os.environ.get("PYFLEET_INSECURE", "") == "1"
    if client_keys is not None or is_loopback_host(host):
        return
    if not insecure:
        raise ValueError(
            f"refusing to serve {host} without client authentication: anyone who "
            f"can reach this port could read and change the model. Give CURVE keys "
            f"(curve_secret_key and curve_client_keys; --curve-secret-key-file and "
            f"--curve-client-keys, see docs/operations.md, 'Secure a cluster'), bind "
            f"127.0.0.1, or accept the risk with insecure=True (--insecure, "
            f"PYFLEET_INSECURE=1)")
    logging.getLogger("pyfleet.server").warning(
        "binding %s without client authentication (insecure): anyone who can reach this "
        "port can read and change the model (see docs/operations.md, 'Secure a cluster')", host)


def is_loopback_host(host):
    """Whether binding ``host`` exposes the endpoint to this machine only."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", a hostname or an interface name: assume reachable


class ZapAuthenticator:
    """A ZAP handler admitting CURVE clients whose public keys are in a directory.

    ZAP handlers are per ZeroMQ context (one ``inproc://zeromq.zap.01`` each),
    so give every authenticating server its own context. The key directory is
    read at :meth:`start`; restart to pick up new keys. ``start``/``stop`` must
    be called from one thread; the handler runs on its own thread."""

    def __init__(self, context, client_keys_dir):
        self.client_keys_dir = os.fspath(client_keys_dir)
        if not os.path.isdir(self.client_keys_dir):
            raise ValueError(f"client keys directory {self.client_keys_dir!r} does not exist")
        if not any(n.endswith(".key") for n in os.listdir(self.client_keys_dir)):
            raise ValueError(f"client keys directory {self.client_keys_dir!r} holds no "
                             f"*.key file: no client could connect")
        self._context = context
        self._auth = None

    def start(self):
        auth = ThreadAuthenticator(self._context, log=logging.getLogger("pyfleet.auth.zap"))
        auth.start()
        try:
            auth.configure_curve(domain="*", location=self.client_keys_dir)
        except BaseException:
            auth.stop()
            raise
        self._auth = auth
        return self

    def stop(self):
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def client_curve_keys(server_keys, client_key, num_servers):
    """The CURVE keys of a client of ``num_servers`` servers: None (plain TCP)
    when ``server_keys`` is None, else ``([server public key per server],
    (public, secret))`` as Z85 bytes. ``server_keys``: one key, or one per
    server; ``client_key``: a ``(public, secret)`` pair, the path of a secret
    certificate (``pyfleet keygen``), or None for a throwaway pair (enough
    unless the servers check a client list)."""
    if server_keys is None:
        if client_key is not None:
            raise ValueError("curve_client_key needs curve_server_keys")
        return None
    if isinstance(server_keys, (str, bytes)):
        server_keys = [server_keys] * num_servers
    if len(server_keys) != num_servers:
        raise ValueError(f"curve_server_keys needs one key per endpoint "
                         f"({num_servers}), got {len(server_keys)}")
    if client_key is None:
        client_key = zmq.curve_keypair()
    elif not isinstance(client_key, (tuple, list)):
        client_key = load_keypair(client_key)
    pair = tuple(k.encode() if isinstance(k, str) else bytes(k) for k in client_key)
    if len(pair) != 2 or any(len(k) != 40 for k in pair):
        raise ValueError("curve_client_key must be a (public, secret) pair of "
                         "40-character Z85 keys or a secret certificate path")
    return [k.encode() if isinstance(k, str) else bytes(k) for k in server_keys], pair
