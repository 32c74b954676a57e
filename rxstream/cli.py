"""The ``rxstream`` command (also ``python -m rxstream``).

- ``rxstream run APP.py [--ranks N] [--frames M] [--set key=value …] [--timeout S]`` runs an
  app's ``build(ctx)`` on N rank processes (SPMD, see :mod:`rxstream.launch`) and prints
  per-rank statistics at the end.
- ``rxstream timing LOG [--plot out.png] [--json] [--stream NAME]`` summarises a timing log
  per hop (count, p50/p95/p99 of queue-wait and compute), end to end, and names the slowest
  inputs; malformed lines are reported with their line numbers.
- ``rxstream topology APP [--config serving.yaml]`` prints the app's partitions, connections
  and client streams, checks its walk-driving connections and, with ``--config``, validates
  the serving config against it; exits 1 listing every problem.
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
    run = commands.add_parser("run", help="run an app on one or more rank processes")
    run.add_argument("app", help="path/to/app.py[:build] or module:build")
    run.add_argument("--ranks", type=int, default=1, help="rank processes (default 1)")
    run.add_argument("--frames", type=int, help="stop after this many egressed items")
    run.add_argument("--timeout", type=float, help="stop after this many seconds")
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="initial desired state (VALUE is JSON, else a string); repeatable",
    )
    timing = commands.add_parser("timing", help="summarise a [timing:<stream>] log")
    timing.add_argument("log", help="a JSON-lines log written by rxstream")
    timing.add_argument("--plot", metavar="PNG", help="also draw per-hop bars and the CDF")
    timing.add_argument("--json", action="store_true", help="print the summary as JSON")
    timing.add_argument("--stream", help="only this stream's records")
    topology = commands.add_parser("topology", help="print an app's partition topology")
    topology.add_argument("app", help="path/to/app.py[:build] or module:build")
    topology.add_argument("--config", metavar="YAML", help="a serving config to validate")
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "topology":
        return _topology(args)

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


def _run(args: argparse.Namespace) -> int:
    from rxstream.launch import launch
    from rxstream.runtime._stats import format_statistics

    config: dict[str, object] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"rxstream run: --set takes KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        try:
            config[key] = json.loads(value)
        except json.JSONDecodeError:
            config[key] = value
    try:
        result = launch(
            args.app, args.ranks, frames=args.frames, config=config, timeout=args.timeout
        )
    except KeyboardInterrupt:
        print("rxstream run: interrupted, stopped", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"rxstream run: {exc}", file=sys.stderr)
        return 1
    print(f"{result.egressed} items egressed on {result.ranks} rank(s)")
    for rank, stats in sorted(result.statistics.items()):
        print(f"\nrank {rank}")
        print(format_statistics(stats))
    return 0


def _topology(args: argparse.Namespace) -> int:
    from rxstream.context import Context
    from rxstream.launch import load_app
    from rxstream.topology import (
        DeploymentError,
        find_client_streams,
        format_topology,
        load_serving_config,
        model_of,
        validate_deployment,
    )

    try:
        model = model_of(load_app(args.app)(Context()))
        streams = find_client_streams(model)
    except Exception as exc:
        print(f"rxstream topology: {exc}", file=sys.stderr)
        return 1
    print(format_topology(model.topology, streams))
    try:
        config = None if args.config is None else load_serving_config(args.config)
        validate_deployment(model.topology, config)
    except OSError as exc:
        print(f"rxstream topology: cannot read {args.config}: {exc.strerror}", file=sys.stderr)
        return 2
    except DeploymentError as exc:
        print(f"rxstream topology: {exc}", file=sys.stderr)
        return 1
    print("checks: ok" if args.config is None else f"checks: ok (serving config {args.config})")
    return 0
