"""``pyfleet serve``: an inference model behind HTTP (docs/serving.md)."""

import asyncio
import logging
import os
import signal
import sys

from pyfleet.cli.units import byte_count

__all__ = ["add_serve_parser", "cmd_serve"]


def add_serve_parser(sub, add_parser):
    p = add_parser(sub, "serve", "answer prediction requests over HTTP",
                    "Serve an inference model over HTTP: POST /predict (JSON rows, Criteo\n"
                    "TSV, CSV, slot-format lines or a numpy .npz), GET /healthz, GET /metrics\n"
                    "(Prometheus), GET /model. With --follow, each newly committed model\n"
                    "version is swapped in while serving (docs/serving.md).")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="the model/ directory of a pyfleet train run, or "
                        "fleet.save_inference_model's (default: the newest under --follow)")
    p.add_argument("--follow", default=None, metavar="DIR",
                   help="a pyfleet train run directory, a model directory or a directory of "
                        "versions (subdirectories 1, 2, ...): serve the newest committed "
                        "model and swap in each new one (default: serve --model only)")
    p.add_argument("--poll-interval", type=float, default=2.0, metavar="SECONDS",
                   help="how often --follow looks for a new version")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8080, help="the port (0: a free one, printed)")
    p.add_argument("--storage", default="auto", choices=["auto", "fp32", "fp16", "bf16"],
                   help="how the sparse tables hold rows (auto: as they were trained; "
                        "fp16/bf16 halve their memory)")
    p.add_argument("--memory-budget", type=byte_count, default=None, metavar="BYTES",
                   help="RAM for the sparse rows and their index (e.g. 4G, split evenly among "
                        "the sparse tables); rows beyond it are served from --spill-dir "
                        "(default: all in RAM)")
    p.add_argument("--spill-dir", default=None, metavar="DIR",
                   help="the directory for the rows beyond --memory-budget (unnamed files, "
                        "nothing left after the server stops; required with --memory-budget)")
    p.add_argument("--slots", default=None, metavar="NAMES",
                   help="slot names of slot-format requests, comma-separated, in the model's "
                        "slot order (default: 1,2,...,N as PaddleRec's data)")
    p.add_argument("--max-body-bytes", type=byte_count, default=16 << 20, metavar="BYTES",
                   help="largest request body (larger: 413)")
    p.add_argument("--max-rows", type=int, default=16384,
                   help="most rows in one request (more: 413)")
    p.add_argument("--max-concurrent", type=int, default=256,
                   help="most requests answered at once (more: 429)")
    p.add_argument("--read-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="how long a request's body may take to arrive (longer: 408)")
    p.add_argument("--batch-wait-ms", type=float, default=1.0, metavar="MS",
                   help="how long a model step waits for requests still arriving, to answer "
                        "them together (0: never waits)")
    p.add_argument("--max-batch-rows", type=int, default=4096,
                   help="most rows of one model step")
    p.add_argument("--front", choices=("native", "python"), default="native",
                   help="who reads the requests: native (C++: single-row requests cost no "
                        "Python each; other kinds of request are handed to the Python "
                        "server) or python (every request in Python); default native")
    p.add_argument("--unchecked-model", action="store_true",
                   help="serve models that carry no checksums (Fluid's layout written by "
                        "Paddle, or one whose __model__.json is gone); default: refused")
    return p


def _fail(text):
    raise SystemExit(f"pyfleet serve: {text}")


def _check(args):
    if args.model is None and args.follow is None:
        _fail("give --model DIR, --follow DIR, or both")
    for flag, path in (("--model", args.model), ("--follow", args.follow)):
        if path is not None and not os.path.isdir(path):
            _fail(f"{flag} {path}: no such directory")
    if (args.memory_budget is None) != (args.spill_dir is None):
        _fail("--memory-budget and --spill-dir go together (the disk tier needs both)")
    if not args.poll_interval > 0:
        _fail(f"--poll-interval must be > 0 seconds, got {args.poll_interval}")
    if not 0 <= args.port <= 65535:
        _fail(f"--port must be in 0..65535, got {args.port}")
    if args.spill_dir is not None and os.path.exists(args.spill_dir) and \
            not os.path.isdir(args.spill_dir):
        _fail(f"--spill-dir {args.spill_dir} is not a directory")


def cmd_serve(args):
    _check(args)
    try:
        from pyfleet.serving.app import ServeOptions, Server
    except ImportError as e:
        _fail(f"needs httptools ({e}): pip install \".[serve]\"")
    try:
        options = ServeOptions(args.max_body_bytes, args.max_rows, args.max_concurrent,
                               args.batch_wait_ms / 1000.0, args.max_batch_rows,
                               None if args.slots is None else args.slots.split(","),
                               args.read_timeout, args.front)
    except ValueError as e:
        _fail(str(e).replace("_", "-"))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s pyfleet serve: %(message)s")
    from pyfleet.serving.blas import one_blas_thread
    if one_blas_thread():
        logging.getLogger("pyfleet.serve").info(
            "model steps on one OpenBLAS thread (OPENBLAS_NUM_THREADS is unset)")
    run = _event_loop_run()
    logging.getLogger("pyfleet.serve").info(
        "event loop: %s", "uvloop" if run is not asyncio.run else "asyncio's own")
    return run(_serve(args, Server(options)))


def _event_loop_run():
    """uvloop's ``run`` where uvloop is installed (libuv's loop: a fifth less CPU a
    request than asyncio's own), else ``asyncio.run``."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return getattr(uvloop, "run", asyncio.run)


async def _serve(args, server):
    from pyfleet.serving.model import ModelVersion
    from pyfleet.serving.versions import Follower
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    load = {"storage": None if args.storage == "auto" else args.storage,
            "memory_budget": args.memory_budget, "spill_dir": args.spill_dir,
            "unchecked_ok": args.unchecked_model}
    try:
        port = await server.start(args.host, args.port)
    except OSError as e:
        _fail(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}")
    print(f"pyfleet serve: listening on http://{args.host}:{port}", flush=True)
    follower = None
    try:
        if args.model is not None:
            try:
                version = await loop.run_in_executor(None, lambda: ModelVersion(args.model,
                                                                                **load))
            except (OSError, ValueError) as e:
                print(f"pyfleet serve: --model {args.model}: {e}", file=sys.stderr)
                return 1
            server.swap(version)
        if args.follow is not None:
            follower = Follower(
                args.follow, args.poll_interval, server.current,
                lambda v: loop.call_soon_threadsafe(server.swap, v),
                lambda where, e: loop.call_soon_threadsafe(server.refused, where, e),
                load).start()
        await stop.wait()
        return 0
    finally:
        if follower is not None:
            follower.stop()
        await server.stop()
