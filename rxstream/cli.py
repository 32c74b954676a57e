"""The ``rxstream`` command (also ``python -m rxstream``).

So far one subcommand: ``rxstream timing LOG [--plot out.png] [--json] [--stream NAME]``
summarises a timing log per hop (count, p50/p95/p99 of queue-wait and compute), end to end,
and names the slowest inputs; malformed lines are reported with their line numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from rxstream.timing import format_summary, load, plot, summarize

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="rxstream", description="rxstream tools")
    commands = parser.add_subparsers(dest="command", required=True)
    timing = commands.add_parser("timing", help="summarise a [timing:<stream>] log")
    timing.add_argument("log", help="a JSON-lines log written by rxstream")
    timing.add_argument("--plot", metavar="PNG", help="also draw per-hop bars and the CDF")
    timing.add_argument("--json", action="store_true", help="print the summary as JSON")
    timing.add_argument("--stream", help="only this stream's records")
    args = parser.parse_args(argv)

    try:
        log = load(args.log, stream=args.stream)
    except OSError as exc:
        print(f"rxstream timing: cannot read {args.log}: {exc.strerror}", file=sys.stderr)
        return 2
    summary = summarize(log)
    if args.json:
        print(json.dumps(summary.to_json(), indent=2))
    else:
        print(format_summary(summary))
    if args.plot:
        plot(summary, log.records, args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0 if log.records or not log.malformed else 1
