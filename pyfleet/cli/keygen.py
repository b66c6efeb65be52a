"""``pyfleet keygen``: CURVE key pairs for authenticated clusters (docs/operations.md)."""

from pyfleet.service import auth


def cmd_keygen(args):
    paths = auth.keygen(args.dir, names=args.names)
    for p in paths:
        print(p)
    return 0
