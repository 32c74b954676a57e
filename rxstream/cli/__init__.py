"""The ``rxstream`` command (also ``python -m rxstream``).

- ``rxstream run APP`` runs an app — ``build(ctx)`` on ``--ranks N`` rank processes (SPMD,
  see :mod:`rxstream.launch`), or its ``async def main(ctx)`` in this process (rank 0) — headless or
  serving a web page (``--serve``), optionally writing the egress to an MP4 (``--out``) and
  the timing log (``--log``); a status line on a terminal; per-rank statistics at the end.
- ``rxstream test APP`` runs the app's ``with ctx.self_test():`` block alone under the CPU
  harness (a ``main`` app stops at the block's end); exit status 0 when it passed, 1 when it
  failed (the failure shown), 2 when there is none.
- ``rxstream timing LOG [--plot out.png] [--json] [--stream NAME] [--include-self-test]
  [--run ID|last|all]`` summarises a timing log per hop (count, p50/p95/p99 of queue-wait and
  compute), end to end, and names the slowest inputs; malformed lines are summarised in one
  line, the self test's records are left out; of a log of several runs, the last run to start
  (a first line names them all; ``--run`` picks one by id or prefix, ``(no id)``, ``id:ID``,
  or pools ``all``; ``--stream`` keeps one stream's records of it); a log with
  nothing to summarise is a one-line error (exit 1); a ``--plot`` in no format matplotlib writes
  (the suffix's; none: ``.png``) one too, and a ``--run`` naming no run of the log (exit 2).
- ``rxstream topology APP [--config serving.yaml]`` prints the app's partitions, connections
  and client streams, checks its walk-driving connections and, with ``--config``, validates
  the serving config against it; exits 1 listing every problem.

A failure of the app's own code is one line naming its type, message and the app's line
(``KeyError: 'b' (app.py:14 in main)``); ``--traceback`` (or ``RXSTREAM_TRACEBACK=1``) also
prints the whole traceback. Every command stops quietly when its stdout's reader leaves
(``| head -1``: exit 141) and after Ctrl-C (exit 130), without a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rxstream._exceptions import ArgumentError
from rxstream.cli._failure import (
    TRACEBACK_ENV,
    app_failure,
    app_files,
    describe,
    show_traceback,
    wants_traceback,
)
from rxstream.cli._run import INTERRUPTED, SERVE_GRACE_S, SIGPIPE_STATUS, run
from rxstream.timing import TimingLog, TimingRecord, format_summary, load, plot, summarize
from rxstream.timing._analysis import describe_malformed
from rxstream.timing._runs import listing, run_label

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    command = "rxstream"
    try:
        args = _parser().parse_args(argv)
        command = f"rxstream {args.command}"
        return _command(args)
    except BrokenPipeError:
        # the reader of stdout is gone (`| head -1`): what is left to print goes nowhere, and
        # the interpreter's own flush at exit finds devnull, not a second error (Python's
        # "Note on SIGPIPE"); a run has ended by then, its file finished
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return SIGPIPE_STATUS
    except KeyboardInterrupt:  # Ctrl-C before `run` took SIGINT over (or in another command)
        print(f"\n{command}: interrupted", file=sys.stderr)
        return INTERRUPTED


def _command(args: argparse.Namespace) -> int:
    if args.command == "timing":
        return _timing(args)
    import structlog

    # a run configures the logs; a caller's stay theirs (and an unconfigured structlog stays
    # unconfigured: rxstream's loggers print nothing then, see rxstream._util.LibraryLogger)
    configured, logging = structlog.is_configured(), structlog.get_config()
    try:
        if args.command == "run":
            return run(args)
        if args.command == "test":
            return _test(args)
        return _topology(args)
    finally:
        structlog.reset_defaults()
        if configured:
            structlog.configure(**logging)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rxstream", description="rxstream tools")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run an app, headless or serving a web page")
    run.add_argument("app", help="path/to/app.py[:func] or module[:func]")
    run.add_argument("--ranks", type=_count, default=1, help="rank processes (default 1)")
    run.add_argument("--frames", type=_count, help="stop after this many egressed frames")
    run.add_argument("--timeout", type=_seconds, help="stop after this many seconds")
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="initial desired state of the control doc (KEY dotted, VALUE typed by the doc); "
        "repeatable",
    )
    run.add_argument("--config", metavar="YAML", help="a serving config: checked, then applied")
    run.add_argument("--serve", action="store_true", help="serve the session on a web page")
    run.add_argument("--host", help="the page's address (default 127.0.0.1)")
    run.add_argument("--port", type=int, help="the page's port (default 8765; 0: any free one)")
    run.add_argument(
        "--allow-remote", action="store_true", help="let --host be a non-loopback address"
    )
    run.add_argument(
        "--grace",
        type=_seconds,
        metavar="SECONDS",
        help=f"how long the session waits for its page after the last one left (a reload, "
        f"an outage: the page reconnects and resumes) before the run stops (default "
        f"{SERVE_GRACE_S:g})",
    )
    run.add_argument(
        "--tls-cert",
        metavar="PEM",
        help="serve the page over https with this certificate (chain); needs --tls-key",
    )
    run.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert (unencrypted)")
    run.add_argument(
        "--tls-self-signed",
        action="store_true",
        help="serve over https with a fresh self-signed certificate (development; its "
        "fingerprint is printed)",
    )
    run.add_argument(
        "--no-token",
        action="store_true",
        help="serve without the per-run token (needs --insecure: anyone who reaches the port "
        "may then watch and steer)",
    )
    run.add_argument(
        "--insecure", action="store_true", help="confirm --no-token (a warning is printed)"
    )
    run.add_argument("--out", metavar="MP4", help="also write the egress to this MP4 (h264)")
    run.add_argument("--out-stream", metavar="NAME", help="the stream --out writes")
    run.add_argument(
        "--log",
        "--timing-log",
        dest="log",
        metavar="JSONL",
        help="write the timing log here (started afresh; --timing-log under torchrun, whose "
        "own parser takes --log for its --log-dir)",
    )
    run.add_argument(
        "--otel",
        action="store_true",
        help="export each timing record as an OpenTelemetry trace (OTLP/HTTP as OTEL_* say; "
        "the otel extra); also on when OTEL_TRACES_EXPORTER or OTEL_EXPORTER_OTLP_ENDPOINT is set",
    )
    run.add_argument(
        "--metrics-port",
        type=_tcp_port,
        metavar="N",
        help="serve the run's Prometheus metrics at http://127.0.0.1:N/metrics",
    )
    run.add_argument(
        "--metrics",
        action="store_true",
        help="with --serve: serve the run's Prometheus metrics at the session server's "
        "/metrics, behind its token (?token=… or Authorization: Bearer)",
    )
    _traceback_flag(run)
    test = commands.add_parser("test", help="run an app's self test under the CPU harness")
    test.add_argument("app", help="path/to/app.py[:func] or module[:func]")
    _traceback_flag(test)
    test.add_argument(
        "--timeout", type=_seconds, default=60.0, help="fail after this many seconds (60)"
    )
    timing = commands.add_parser("timing", help="summarise a [timing:<stream>] log")
    timing.add_argument("log", help="a JSON-lines log written by rxstream")
    timing.add_argument(
        "--plot",
        metavar="PNG",
        help="also draw per-hop bars and the CDF (the suffix's format: png, svg, pdf…; "
        "no suffix: .png is added)",
    )
    timing.add_argument("--json", action="store_true", help="print the summary as JSON")
    timing.add_argument("--stream", help="only this stream's records")
    timing.add_argument(
        "--run",
        default="last",
        metavar="ID",
        help="the run to summarise when the log holds several: its id (a unique prefix is "
        "enough; 'id:ID' for an id named all or last), '(no id)' for lines written without "
        "one, 'last' (the default: the run that started last) or 'all' (pooled)",
    )
    timing.add_argument(
        "--include-self-test",
        action="store_true",
        help="keep the records of the app's self test (left out by default)",
    )
    topology = commands.add_parser("topology", help="print an app's partition topology")
    topology.add_argument("app", help="path/to/app.py[:build] or module:build")
    topology.add_argument(
        "--config", metavar="YAML", help="a serving config: validated, its limits shown applied"
    )
    topology.add_argument(
        "--ranks", type=_count, default=1, help="build as `run --ranks N` would (default 1)"
    )
    _traceback_flag(topology)
    return parser


def _traceback_flag(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--traceback",
        action="store_true",
        help="on a failure, also print its whole traceback (as does the environment variable "
        f"{TRACEBACK_ENV}=1); without it, one line names the error and the app's line",
    )


def _tcp_port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port from 1 to 65535, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


# --- rxstream test ------------------------------------------------------------------------------

TRACEBACK_LINES = 20
"""How much of a failing self test's traceback ``rxstream test`` shows (its last lines)."""


def _test(args: argparse.Namespace) -> int:
    from rxstream._exceptions import SelfTestError
    from rxstream.ranks._app import load_app
    from rxstream.ranks._selftest import run_self_test
    from rxstream.timing._emit import configure_quiet_logging

    configure_quiet_logging()  # as a run's: the failure is said once, below
    try:
        app = load_app(args.app)  # a missing file, a syntax error, no build/main: one line
    except Exception as exc:
        show_traceback(args, exc)
        print(f"rxstream test: {app_failure(exc, args.app)}", file=sys.stderr)
        return 1
    try:
        passed = run_self_test(args.app, timeout=args.timeout)
    except SelfTestError as exc:  # the app's check failed: the line, then where (its tail)
        print(f"rxstream test: {args.app}: {exc}", file=sys.stderr)
        if wants_traceback(args):
            show_traceback(args, exc)
        else:
            _print_tail(exc.__cause__ or exc)
        return 1
    except Exception as exc:  # the app's own code failed: one line naming the type and line
        show_traceback(args, exc)
        said = describe(exc, app_files(args.app, app))
        print(f"rxstream test: {args.app} failed outside its self test: {said}", file=sys.stderr)
        return 1
    if passed is None:
        print(
            f"rxstream test: {args.app} has no self test (a `with ctx.self_test():` block)",
            file=sys.stderr,
        )
        return 2
    if not passed:
        print(f"rxstream test: {args.app}: self test failed (the app caught it)", file=sys.stderr)
        return 1
    print(f"rxstream test: {args.app}: self test passed")
    return 0


def _print_tail(exc: BaseException) -> None:
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).splitlines()
    shown = lines[-TRACEBACK_LINES:]
    if len(lines) > len(shown):
        shown.insert(0, "  …")
    print("\n".join(shown), file=sys.stderr)


# --- rxstream timing, rxstream topology ---------------------------------------------------------


def _timing(args: argparse.Namespace) -> int:
    target = None
    if args.plot:
        target, problem = _plot_target(args.plot)
        if target is None:  # before the log is read: one line, no table, no traceback
            print(f"rxstream timing: {problem}", file=sys.stderr)
            return 2
    try:
        log = load(args.log, include_self_test=args.include_self_test)
    except OSError as exc:
        print(f"rxstream timing: cannot read {args.log}: {exc.strerror}", file=sys.stderr)
        return 2
    problem = _no_records(args, log)
    if problem is not None:  # one line, and no table of nan nor an empty plot
        print(f"rxstream timing: {args.log}: {problem}", file=sys.stderr)
        return 1
    try:  # the run is picked among every stream's runs, then --stream kept of it
        summary = summarize(log, run=args.run, stream=args.stream)
    except ArgumentError as exc:  # a run the log does not hold: name the ones it does
        print(f"rxstream timing: {args.log}: {exc}", file=sys.stderr)
        return 2
    if not summary.records:  # a run of the log, without a record of --stream
        having = [r.id for r in summary.runs if any(x.run == r.id for x in _of(log, args.stream))]
        print(
            f"rxstream timing: {args.log}: run {run_label(summary.run)}"
            f"{' (the last)' * (args.run == 'last')} has no records of stream {args.stream!r}; "
            f"the runs with some: {listing(having)} (--run ID picks one)",
            file=sys.stderr,
        )
        return 1
    left_out = log.self_tests_of(args.run)
    unjoined = sum(log.unjoined.values())
    of_run = sum(log.unjoined.get(i, 0) for i in summary.included or log.unjoined)
    if args.json:  # the text's two closing lines, as fields
        shown = summary.to_json()
        shown["self_tests_left_out"] = left_out
        shown["photon_unjoined"] = {"run": of_run, "log": unjoined}
        print(json.dumps(shown, indent=2))
    else:
        print(format_summary(summary))
        if left_out:
            print(
                f"left out: {left_out} self-test record{'s' * (left_out != 1)} "
                "(--include-self-test keeps them)"
            )
        if unjoined:
            whole = f" of the run shown, {unjoined} in the whole log" * (of_run != unjoined)
            print(f"photon lines joined to no record: {of_run}{whole}")
    if target is not None:
        try:
            plot(summary, log.records, target)
        except OSError as exc:
            print(f"rxstream timing: cannot write {target}: {exc.strerror}", file=sys.stderr)
            return 2
        if not args.json:
            print(f"plot written to {target}")
    return 0


def _plot_target(text: str) -> tuple[Path, None] | tuple[None, str]:
    """Where ``--plot TEXT`` draws, or why it cannot (a folder, a format matplotlib lacks).

    The format is the suffix's, as matplotlib reads it; a name without a suffix gets ``.png``
    (``--plot report`` writes ``report.png``), and the line printed names the file written."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    path = Path(text)
    if path.is_dir():
        return None, f"--plot {text} is a folder; give a file name (such as {path / 'plot.png'})"
    if not path.suffix:
        path = path.with_name(f"{path.name}.png")
    formats = sorted(FigureCanvasAgg.get_supported_filetypes())
    kind = path.suffix[1:].lower()
    if kind not in formats:
        return None, (
            f"--plot must end in one of the formats {', '.join(formats)}, got {text!r} "
            f"(format {kind!r})"
        )
    return path, None


def _of(log: TimingLog, stream: str | None) -> tuple[TimingRecord, ...]:
    """The records of ``log`` of ``stream`` (every one for ``None``)."""
    return tuple(r for r in log.records if stream is None or r.stream == stream)


def _no_records(args: argparse.Namespace, log: TimingLog) -> str | None:
    """Why ``log`` has nothing to summarise (for ``--stream``: of that stream), or ``None``."""
    streams = sorted({record.stream for record in log.records})
    if args.stream is not None and args.stream in streams:
        return None
    if args.stream is None and streams:
        return None
    why = [describe_malformed(log.malformed)] if log.malformed else []
    if log.self_tests:
        why.append(f"{log.self_tests} self-test record(s) left out: --include-self-test keeps them")
    if streams:
        found = f"no records of stream {args.stream!r}; its streams are: {', '.join(streams)}"
    elif log.malformed or log.other_events or log.self_tests:
        found = "no timing records"
        if log.other_events:
            why.insert(0, f"{log.other_events} other log event(s)")
    else:
        found = "no timing records (the file is empty)"
    return "; ".join([found, *why])


def _topology(args: argparse.Namespace) -> int:
    from rxstream._exceptions import ArgumentTypeError
    from rxstream.context import Context
    from rxstream.ranks._app import load_app
    from rxstream.topology import (
        DeploymentError,
        client_stream_limits,
        find_client_streams,
        format_topology,
        load_serving_config,
        model_of,
        validate_deployment,
    )

    def fail(message: str, status: int) -> int:
        print(f"rxstream topology: {message}", file=sys.stderr)
        return status

    try:
        config = None if args.config is None else load_serving_config(args.config)
    except OSError as exc:
        return fail(f"cannot read {args.config}: {exc.strerror}", 2)
    except DeploymentError as exc:
        return fail(str(exc), 1)
    try:
        app = load_app(args.app)
        app.check_ranks(args.ranks)
        pipeline = app(Context(world=args.ranks))
    except ArgumentTypeError as exc:  # build(ctx) returned no Pipeline
        return fail(str(exc), 2)
    except Exception as exc:  # as `run` says it: the app's own raise with its type and line
        show_traceback(args, exc)
        return fail(app_failure(exc, args.app), 1)
    try:
        model = model_of(pipeline)
        streams = find_client_streams(model)
    except Exception as exc:
        return fail(str(exc), 1)
    try:
        validate_deployment(model.topology, config)  # every problem listed
    except DeploymentError as exc:
        print(format_topology(model, streams))
        print(format_layout(pipeline, args.ranks))
        return fail(str(exc), 1)
    limits = None if config is None else client_stream_limits(model.topology, config)
    print(format_topology(model, streams, limits))
    print(format_layout(pipeline, args.ranks))
    print("checks: ok" if args.config is None else f"checks: ok (serving config {args.config})")
    return 0


def format_layout(pipeline: Any, ranks: int) -> str:
    """Which stages each of ``ranks`` rank processes runs ("no stages" for an idle rank)."""
    plan = pipeline.plan
    world = max(ranks, plan.world)
    lines = [f"layout on {world} rank(s):"]
    for rank in range(world):
        names = [plan.names[node] for node in plan.nodes if plan.ranks[node] == rank]
        lines.append(f"  rank {rank}: {', '.join(names) if names else 'no stages'}")
    return "\n".join(lines)
