"""The ``pyfleet`` command line.

    pyfleet train [options]      train a CTR model on a local cluster (the main job)
    pyfleet gen-data [options]   write the synthetic Criteo-format data set
    pyfleet predict [options]    score a data file with a saved inference model
    pyfleet export [options]     write the inference model of a checkpoint
    pyfleet plan [options]       bytes a row, rows a server holds, servers needed
    pyfleet serve [options]      answer prediction requests over HTTP
    pyfleet server [options]     run one parameter server (as python -m pyfleet.service)
    pyfleet keygen DIR           write CURVE key pairs for authenticated clusters
    pyfleet run SCRIPT [ARGS]    run Fleet-era code unchanged (`paddle` is pyfleet)

`pyfleet train` with no argument is the embedded default: it generates a
synthetic data set with a known ground truth, starts 1 server and 2 workers on
127.0.0.1, trains the DNN for one pass, evaluates on the held-out split, and
prints a summary (also in RUN_DIR/summary.json).

One module per command (``train``, ``predict``, ``export``, ``plan``, ``data`` for
gen-data and the data checks, ``keygen``), with ``parser`` (the options), ``resume`` and ``report``. The
trainer and Fluid are imported inside the commands that need them, never here:
``pyfleet --help`` and ``pyfleet gen-data`` do not pay for them.
"""

import difflib
import sys

from pyfleet.cli.data import cmd_gen_data
from pyfleet.cli.export import cmd_export
from pyfleet.cli.keygen import cmd_keygen
from pyfleet.cli.parser import build_parser, subcommand_parser, unknown_options_message
from pyfleet.cli.plan import cmd_plan
from pyfleet.cli.predict import cmd_predict
from pyfleet.cli.serve import cmd_serve
from pyfleet.cli.train import cmd_train

__all__ = ["main"]


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:   # everything after it is the script's: no option parsing
        from pyfleet.cli.run import cmd_run
        return cmd_run(argv[1:])
    if argv[:1] == ["server"]:  # one parameter server: the service's own options
        from pyfleet.service.command import main as server_main
        return server_main(argv[1:], prog="pyfleet server")
    parser, train = build_parser()
    commands = subcommand_parser(parser, None, every=True)
    if argv and not argv[0].startswith("-") and argv[0] not in commands:
        close = difflib.get_close_matches(argv[0], list(commands), n=1)
        parser.error(f"no command {argv[0]!r}" + (f": did you mean {close[0]}?" if close else
                                                   f" (commands: {', '.join(commands)})"))
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the command's own parser, with the nearest option suggested
        command = subcommand_parser(parser, args.command) or parser
        command.error(unknown_options_message(command, extra))
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command == "train":
            rest = argv[argv.index("train") + 1:]
            if args.config is not None or args.overrides:
                from pyfleet.cli.config import config_argv
                tokens, record = config_argv(train, args.config, args.overrides)
                rest = tokens + rest  # typed options come later: they win
                args = train.parse_args(rest)
                args.command, args._config = "train", record
            args._parser = train
            return cmd_train(args, rest)
        return {"gen-data": cmd_gen_data, "predict": cmd_predict, "plan": cmd_plan,
                "export": cmd_export,
                "serve": cmd_serve,
                "keygen": cmd_keygen}[args.command](args)
    except KeyboardInterrupt:  # (pyfleet train's roles are stopped by its launcher)
        print(f"pyfleet {args.command}: interrupted", file=sys.stderr)
        return 130
