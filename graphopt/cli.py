"""The `graphopt` command."""
from __future__ import annotations

import argparse
import sys

from .errors import GraphoptError


def _demo(args: argparse.Namespace) -> int:
    from .demo import run
    return run(args.out, args.steps)


def _ir(args: argparse.Namespace) -> int:
    """Read IR text, verify it, print it back (with locations)."""
    from .ir import parse
    with open(args.file) if args.file != "-" else sys.stdin as f:
        graph = parse(f.read())
    graph.verify()
    print(graph.format(locs=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="graphopt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="compile an Adam step, print its IR, run it, draw it")
    p.add_argument("--out", default="graphopt_demo_out", help="folder for the dumps")
    p.add_argument("--steps", type=int, default=5)
    p.set_defaults(run=_demo)
    p = sub.add_parser("ir", help="parse and verify an IR text file, print it back")
    p.add_argument("file", help="a .ir file, or - for standard input")
    p.set_defaults(run=_ir)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except GraphoptError as e:
        print(f"graphopt: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"graphopt: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
