"""The ``rxstream`` command (also ``python -m rxstream``).

- ``rxstream run APP`` runs an app — ``build(ctx)`` on ``--ranks N`` rank processes (SPMD,
  see :mod:`rxstream.launch`), or its ``async def main(ctx)`` in this process (rank 0) — headless or
  serving a web page (``--serve``), optionally writing the egress to an MP4 (``--out``) and
  the timing log (``--log``); a status line on a terminal; per-rank statistics at the end.
- ``rxstream test APP`` runs the app's ``with ctx.self_test():`` block under the CPU harness;
  exit status 0 when it passed, 1 when it failed (the failure shown), 2 when there is none.
- ``rxstream timing LOG [--plot out.png] [--json] [--stream NAME] [--include-self-test]``
  summarises a timing log per hop (count, p50/p95/p99 of queue-wait and compute), end to end,
  and names the slowest inputs; malformed lines are summarised in one line, the self test's
  records are left out; a log with nothing to summarise is a one-line error (exit 1).
- ``rxstream topology APP [--config serving.yaml]`` prints the app's partitions, connections
  and client streams, checks its walk-driving connections and, with ``--config``, validates
  the serving config against it; exits 1 listing every problem.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rxstream.timing import TimingLog, format_summary, load, plot, summarize
from rxstream.timing._analysis import describe_malformed

if TYPE_CHECKING:
    from rxstream.runtime import StageStatistics

__all__ = ["main"]

INTERRUPTED = 130
"""The exit status after Ctrl-C (128 + SIGINT), as shells report it; SIGTERM gives 143 and
SIGHUP 129 (128 + the signal's number)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "timing":
        return _timing(args)
    import structlog

    logging = structlog.get_config()  # a run configures the logs; a caller's stay theirs
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "test":
            return _test(args)
        return _topology(args)
    finally:
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
    test = commands.add_parser("test", help="run an app's self test under the CPU harness")
    test.add_argument("app", help="path/to/app.py[:func] or module[:func]")
    test.add_argument(
        "--timeout", type=_seconds, default=60.0, help="fail after this many seconds (60)"
    )
    timing = commands.add_parser("timing", help="summarise a [timing:<stream>] log")
    timing.add_argument("log", help="a JSON-lines log written by rxstream")
    timing.add_argument("--plot", metavar="PNG", help="also draw per-hop bars and the CDF")
    timing.add_argument("--json", action="store_true", help="print the summary as JSON")
    timing.add_argument("--stream", help="only this stream's records")
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
    return parser


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


# --- rxstream run -------------------------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    from rxstream.ranks._torchrun import torchrun_env

    with _StopSignals(enabled=torchrun_env() is None) as signals:
        return _run_app(args, signals)


def _run_app(args: argparse.Namespace, signals: _StopSignals) -> int:
    from rxstream._exceptions import SettingError
    from rxstream._settings import split_setting
    from rxstream.ranks._app import load_app
    from rxstream.ranks._launch import launch
    from rxstream.ranks._torchrun import torchrun_env
    from rxstream.topology import DeploymentError, load_serving_config

    def fail(message: str, status: int) -> int:
        print(f"rxstream run: {message}", file=sys.stderr)
        return status

    try:
        for text in args.set:
            split_setting(text)
    except SettingError as exc:
        return fail(str(exc), 2)
    if not args.serve and (args.host is not None or args.port is not None or args.allow_remote):
        return fail("--host, --port and --allow-remote go with --serve", 2)
    if args.no_token != args.insecure:
        return fail(
            "--no-token and --insecure go together: without the token any process that reaches "
            "the port (any machine, with --allow-remote) may watch and steer the session",
            2,
        )
    if args.no_token and not args.serve:
        return fail("--no-token goes with --serve", 2)
    if args.out_stream is not None and args.out is None:
        return fail("--out-stream names the stream --out writes: give --out too", 2)
    serving = None
    if args.config is not None:
        try:
            serving = load_serving_config(args.config)
        except OSError as exc:
            return fail(f"cannot read {args.config}: {exc.strerror}", 2)
        except DeploymentError as exc:
            return fail(str(exc), 2)
    for flag, path in (("--out", args.out), ("--log", args.log)):
        problem = None if path is None else _prepare_output(flag, path)
        if problem is not None:
            return fail(problem, 2)
    if args.serve and args.port not in (None, 0):
        problem = _port_taken(args.host or "127.0.0.1", args.port)
        if problem is not None:
            return fail(problem, 2)
    try:
        app = load_app(args.app)
    except Exception as exc:
        return fail(str(exc), 1)
    try:
        app.check_ranks(args.ranks)
    except ValueError as exc:
        return fail(str(exc), 2)
    transport: Any = None
    if args.serve:
        from rxstream.transport import WebTransport

        host = "127.0.0.1" if args.host is None else args.host
        port = 8765 if args.port is None else args.port
        try:
            transport = WebTransport(
                host=host, port=port, allow_remote=args.allow_remote, token=not args.no_token
            )
        except ValueError as exc:
            return fail(str(exc), 2)
        if args.no_token:
            print(
                "rxstream run: warning: serving without a token (--no-token --insecure): any "
                "process that reaches the port may watch and steer this session",
                file=sys.stderr,
                flush=True,
            )

    def opened() -> None:
        where = f"serving {transport.url}" if transport is not None else "headless"
        job = torchrun_env()
        ranks = f"{args.ranks} rank(s)" if job is None else f"rank {job.rank} of {job.world}"
        print(
            f"rxstream run: {args.app} on {ranks}, {where}; Ctrl-C stops",
            file=sys.stderr,
            flush=True,
        )

    status = _StatusLine(sys.stderr) if sys.stderr.isatty() else None
    try:
        result = launch(
            args.app,
            args.ranks,
            frames=args.frames,
            timeout=args.timeout,
            settings=args.set,
            serving=serving,
            transport=transport,
            out=args.out,
            out_stream=args.out_stream,
            log=args.log,
            on_open=opened,
            on_status=status,
            quiet=True,
            stop=signals.event,
        )
    except KeyboardInterrupt:
        _clear(status)
        return fail("interrupted, stopped", INTERRUPTED)
    except (SettingError, DeploymentError) as exc:
        _clear(status)
        return fail(str(exc), 2)
    except Exception as exc:
        _clear(status)
        if signals.signum is not None:  # what the stop left behind it: said, then the stop
            fail(str(exc), 1)
            return fail(f"interrupted, stopped ({signals.name})", 128 + signals.signum)
        return fail(str(exc), 1)
    _clear(status)
    job = torchrun_env()
    if job is not None and job.rank != 0:
        return 0  # under torchrun, rank 0 alone prints the summary of every rank
    from rxstream.runtime import format_statistics

    print(f"{result.egressed} items egressed on {result.ranks} rank(s)")
    if args.out is not None:
        print(f"video: {args.out}")
    if args.log is not None:
        print(f"timing log: {args.log} (summarise it with: rxstream timing {args.log})")
    for rank in range(result.ranks):
        stats = result.statistics.get(rank, {})
        print(f"\nrank {rank}")
        print(format_statistics(stats) if stats else "no stages")
    if signals.signum is not None:
        sys.stdout.flush()
        return fail(f"interrupted, stopped ({signals.name})", 128 + signals.signum)
    return 0


class _StopSignals:
    """SIGINT, SIGTERM and SIGHUP while ``rxstream run`` runs (what a terminal, docker,
    systemd and Kubernetes send).

    The first one sets :attr:`event`, the launch's ``stop``: the run ends as at its
    ``--timeout`` — every rank stops, the file is finished, the statistics are printed — and
    the exit status is 128 + the signal's number (130, 143, 129). A second one forces: every
    rank process is killed (SIGKILL) and this process exits at once with 128 + its number (the
    rings have no names left by then; the MP4 keeps its complete fragments). Installed only on
    the main thread, not under torchrun (which stops its workers with SIGTERM itself), and not
    for a signal this process inherited as ignored (``nohup`` ignores SIGHUP, a background job
    of a non-interactive shell SIGINT).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, *, enabled: bool = True) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self._enabled = enabled and threading.current_thread() is threading.main_thread()
        self._previous: dict[int, Any] = {}

    @property
    def name(self) -> str:
        """The first signal's name (``SIGTERM``)."""
        return "" if self.signum is None else signal.Signals(self.signum).name

    def __enter__(self) -> _StopSignals:
        if self._enabled:
            for signum in self.SIGNALS:
                if signal.getsignal(signum) is signal.SIG_IGN:
                    continue  # ignored by whoever started us (nohup, a background job): it stays
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self.signum is None:
            self.signum = signum
            self.event.set()
            _say(f"\nrxstream run: {name}: stopping (the same again forces an exit)\n")
            return
        from rxstream.ranks._common import kill_ranks

        kill_ranks()
        _say(f"rxstream run: {name} again: forced exit, rank processes killed\n")
        os._exit(128 + signum)


def _say(text: str) -> None:
    """Write to stderr from a signal handler (``print`` may be in the middle of a write)."""
    with contextlib.suppress(OSError):
        os.write(sys.stderr.fileno(), text.encode())


def _prepare_output(flag: str, path: str) -> str | None:
    """Check an output file's place before anything runs: ``None`` when it can be written.

    A missing folder is created, and the command says so; a folder that is a file, or a path
    that is a folder, is refused."""
    target = Path(path)
    if target.is_dir():
        return f"{flag} {path} is a folder; give a file name"
    folder = target.parent
    for above in (folder, *folder.parents):
        if above.exists() and not above.is_dir():
            return f"{flag} {path}: {above} is a file, not a folder"
    if not folder.exists():
        try:
            folder.mkdir(parents=True)
        except OSError as exc:
            return f"{flag} {path}: cannot create the folder {folder}: {exc.strerror}"
        print(f"rxstream run: created the folder {folder}/ for {flag}", file=sys.stderr)
    if not os.access(folder, os.W_OK):
        return f"{flag} {path}: the folder {folder} is not writable"
    return None


def _port_taken(host: str, port: int) -> str | None:
    """``None`` when ``--serve`` can listen on ``host:port``, else why not (before the run)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return f"--host {host}: cannot resolve it: {exc}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return f"--port {port}: cannot listen on {host}:{port}: {exc.strerror}"
    return None


class _StatusLine:
    """One line on a terminal, rewritten in place: each stage's fps, inbox depth and drops."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._started = time.monotonic()
        self._last: dict[tuple[int, str], tuple[float, int]] = {}
        self.shown = False

    def __call__(self, statistics: Mapping[int, Mapping[str, StageStatistics]]) -> None:
        now = time.monotonic()
        parts = []
        for rank, stages in sorted(statistics.items()):
            for index, (name, stats) in enumerate(stages.items()):
                since, before = self._last.get((rank, name), (self._started, 0))
                self._last[(rank, name)] = (now, stats.items_out)
                fps = (stats.items_out - before) / max(now - since, 1e-9)
                part = f"{name} {fps:.1f} fps" if fps < 10 else f"{name} {fps:.0f} fps"
                if stats.inbox_capacity:
                    part += f" q{stats.inbox_depth}/{stats.inbox_capacity}"
                if stats.dropped_total:
                    part += f" drop {stats.dropped_total}"
                if index == 0 and len(statistics) > 1:
                    part = f"[rank {rank}] {part}"
                parts.append(part)
        line = " | ".join(parts)
        width = max(shutil.get_terminal_size((120, 24)).columns - 1, 20)
        if len(line) > width:
            line = line[: width - 1] + "…"
        self._stream.write(f"\r{line}\x1b[K")
        self._stream.flush()
        self.shown = True

    def clear(self) -> None:
        """Erase the line (before anything else is printed)."""
        if self.shown:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self.shown = False


def _clear(status: _StatusLine | None) -> None:
    if status is not None:
        status.clear()


# --- rxstream test ------------------------------------------------------------------------------

TRACEBACK_LINES = 20
"""How much of a failing self test's traceback ``rxstream test`` shows (its last lines)."""


def _test(args: argparse.Namespace) -> int:
    from rxstream._exceptions import SelfTestError
    from rxstream.ranks._app import load_app
    from rxstream.ranks._selftest import run_self_test

    try:
        load_app(args.app)  # a missing file, a syntax error, no build/main: one line, as `run`
    except Exception as exc:
        print(f"rxstream test: {exc}", file=sys.stderr)
        return 1
    try:
        passed = run_self_test(args.app, timeout=args.timeout)
    except SelfTestError as exc:
        print(f"rxstream test: {args.app}: {exc}", file=sys.stderr)
        _print_tail(exc.__cause__ or exc)
        return 1
    except Exception as exc:
        print(f"rxstream test: {args.app} failed outside its self test: {exc}", file=sys.stderr)
        _print_tail(exc)
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
    try:
        log = load(args.log, include_self_test=args.include_self_test)
    except OSError as exc:
        print(f"rxstream timing: cannot read {args.log}: {exc.strerror}", file=sys.stderr)
        return 2
    problem = _no_records(args, log)
    if problem is not None:  # one line, and no table of nan nor an empty plot
        print(f"rxstream timing: {args.log}: {problem}", file=sys.stderr)
        return 1
    if args.stream is not None:
        kept = tuple(r for r in log.records if r.stream == args.stream)
        log = replace(log, records=kept)
    summary = summarize(log)
    if args.json:
        print(json.dumps(summary.to_json(), indent=2))
    else:
        print(format_summary(summary))
        if log.self_tests:
            print(
                f"left out: {log.self_tests} self-test record{'s' * (log.self_tests != 1)} "
                "(--include-self-test keeps them)"
            )
    if args.plot:
        try:
            plot(summary, log.records, args.plot)
        except OSError as exc:
            print(f"rxstream timing: cannot write {args.plot}: {exc.strerror}", file=sys.stderr)
            return 2
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


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
    except Exception as exc:
        return fail(str(exc), 1)
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
