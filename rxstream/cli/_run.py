"""``rxstream run APP``: the app on its ranks, headless or serving a web page, stopped by
SIGINT, SIGTERM or SIGHUP; a status line on a terminal; per-rank statistics at the end."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

if TYPE_CHECKING:
    from rxstream.pipeline import Pipeline
    from rxstream.ranks._app import App, AppContext
    from rxstream.runtime import StageStatistics

__all__ = [
    "INTERRUPTED",
    "SERVE_GRACE_S",
    "SIGPIPE_STATUS",
    "idle_ranks",
    "not_secure_line",
    "opened_line",
    "run",
]

SERVE_GRACE_S = 5.0
"""``--serve``'s default ``--grace``: how long the session waits for its page after the last
one left. Longer than a typical outage (a Wi-Fi hand-over, a tunnel's restart: the page
reconnects and resumes the same session), short enough that closing the page ends the run
soon after."""

INTERRUPTED = 130
"""The exit status after Ctrl-C (128 + SIGINT), as shells report it; SIGTERM gives 143 and
SIGHUP 129 (128 + the signal's number)."""


SIGPIPE_STATUS = 141
"""The exit status once stdout's reader left (``rxstream topology APP | head -1``): 128 +
SIGPIPE, as ``yes | head -1`` reports it under ``set -o pipefail``; no traceback."""


def run(args: argparse.Namespace) -> int:
    """``rxstream run``: the exit status (0, 1 a failure, 2 a usage error, 128 + a signal;
    141 when the run went well but stdout's reader left)."""
    from rxstream._util import StdoutGuard
    from rxstream.ranks._torchrun import torchrun_env

    guard = StdoutGuard(sys.stdout)
    sys.stdout = cast(TextIO, guard)
    try:
        with (
            _StopSignals(enabled=torchrun_env() is None) as signals,
            contextlib.ExitStack() as cleanup,
        ):
            status = _run_app(args, signals, cleanup)
    finally:
        sys.stdout = guard.stream
    return SIGPIPE_STATUS if guard.broken and status == 0 else status


def _run_app(args: argparse.Namespace, signals: _StopSignals, cleanup: contextlib.ExitStack) -> int:
    from rxstream._exceptions import ArgumentTypeError, RxStreamError, SettingError
    from rxstream._settings import split_setting
    from rxstream.cli._failure import (
        app_failure,
        app_files,
        app_frame,
        describe,
        show_traceback,
        typed,
    )
    from rxstream.ranks._app import load_app
    from rxstream.ranks._common import OutStreamRefused
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
    if args.grace is not None and not args.serve:
        return fail("--grace goes with --serve (how long the session waits for its page)", 2)
    tls_flags = args.tls_cert is not None or args.tls_key is not None or args.tls_self_signed
    if tls_flags and not args.serve:
        return fail("--tls-cert, --tls-key and --tls-self-signed go with --serve", 2)
    if (args.tls_cert is None) != (args.tls_key is None):
        given, missing = ("--tls-cert", "--tls-key")[:: 1 if args.tls_key is None else -1]
        return fail(
            f"--tls-cert and --tls-key go together: {given} was given without {missing} "
            "(the certificate and its private key)",
            2,
        )
    if args.tls_self_signed and args.tls_cert is not None:
        return fail(
            "--tls-self-signed makes its own certificate: give it or --tls-cert/--tls-key, "
            "not both",
            2,
        )
    if args.no_token != args.insecure:
        return fail(
            "--no-token and --insecure go together: without the token any process that reaches "
            "the port (any machine, with --allow-remote) may watch and steer the session",
            2,
        )
    if args.no_token and not args.serve:
        return fail("--no-token goes with --serve", 2)
    if args.metrics and not args.serve:
        return fail(
            "--metrics goes with --serve (the session server's /metrics); a headless run: "
            "--metrics-port N",
            2,
        )
    if args.out_stream is not None and args.out is None:
        return fail("--out-stream names the stream --out writes: give --out too", 2)
    otel, said = _otel_asked(args.otel)
    if said and otel:
        return fail(said, 1)
    if said:
        print(f"rxstream run: warning: {said}", file=sys.stderr, flush=True)
    serving = None
    if args.config is not None:
        try:
            serving = load_serving_config(args.config)
        except OSError as exc:
            return fail(f"cannot read {args.config}: {exc.strerror}", 2)
        except DeploymentError as exc:
            return fail(str(exc), 2)
    outputs = [(f, p) for f, p in (("--out", args.out), ("--log", args.log)) if p is not None]
    for flag, path in outputs:
        problem = _check_output(flag, path)
        if problem is not None:
            return fail(problem, 2)
    if args.serve and args.port not in (None, 0):
        problem = _port_taken(args.host or "127.0.0.1", args.port)
        if problem is not None:
            return fail(problem, 2)
    tls: Any = None
    if args.serve and tls_flags:
        from rxstream.transport._tls import SelfSigned, server_context

        if args.tls_self_signed:  # made here, before the app loads: its key never outlives us
            made = SelfSigned(args.host or "127.0.0.1")
            cleanup.callback(made.close)
            tls = made.context
            print(
                "rxstream run: TLS: a fresh self-signed certificate (development only; browsers "
                f"warn until told to trust it), SHA-256 fingerprint {made.sha256}",
                file=sys.stderr,
                flush=True,
            )
            print(
                f"rxstream run: TLS: the certificate is {made.cert} (removed at exit); its "
                f"SPKI pin, for chromium --ignore-certificate-errors-spki-list=PIN: {made.spki}",
                file=sys.stderr,
                flush=True,
            )
        else:
            try:
                tls = server_context(
                    args.tls_cert, args.tls_key, cert_name="--tls-cert", key_name="--tls-key"
                )
            except ValueError as exc:
                return fail(str(exc), 2)
    try:
        app = load_app(args.app)
    except Exception as exc:  # a missing file, a syntax error: as they read; the app's raise named
        show_traceback(args, exc)
        return fail(app_failure(exc, args.app), 1)
    files = app_files(args.app, app)
    try:
        app.check_ranks(args.ranks)
    except ValueError as exc:
        return fail(str(exc), 2)
    try:
        built = _build_app(app, args)
    except (ArgumentTypeError, SettingError) as exc:  # no Pipeline returned; a --set refused
        return fail(str(exc), 2)
    except Exception as exc:  # the app's build failed: name the app, what it raised, where
        show_traceback(args, exc)
        where = app_frame(exc, files)
        said = typed(exc) if where is None else f"{typed(exc)} ({where})"
        return fail(f"app {app.entry!r}: build(ctx) raised {said}", 1)
    try:
        problem = None if built is None else _check_app(app, *built, args)
    except SettingError as exc:
        return fail(str(exc), 2)
    except Exception as exc:  # build returned; the pipeline it returned breaks a rule
        show_traceback(args, exc)
        said = str(exc) if isinstance(exc, RxStreamError) else typed(exc)
        return fail(f"app {app.entry!r}: {said}", 1)
    if problem is not None:
        return fail(problem, 2)
    if signals.signum is not None:  # Ctrl-C while the app loaded: no self test, no run
        return fail(f"interrupted before the run started ({signals.name})", 128 + signals.signum)
    try:
        for flag, path in outputs:
            _make_folder(flag, path)
    except OSError as exc:
        return fail(f"cannot create the folder {exc.filename}: {exc.strerror}", 2)
    transport: Any = None
    if args.serve:
        from rxstream.transport import WebTransport

        host = "127.0.0.1" if args.host is None else args.host
        port = 8765 if args.port is None else args.port
        try:
            transport = WebTransport(
                host=host,
                port=port,
                allow_remote=args.allow_remote,
                token=not args.no_token,
                grace_s=SERVE_GRACE_S if args.grace is None else args.grace,
                tls=tls,
                metrics=args.metrics,
            )
        except ValueError as exc:
            return fail(str(exc), 2)
        if not transport.secure_context:
            print(f"rxstream run: warning: {not_secure_line(host)}", file=sys.stderr, flush=True)
        if args.no_token:
            print(
                "rxstream run: warning: serving without a token (--no-token --insecure): any "
                "process that reaches the port may watch and steer this session",
                file=sys.stderr,
                flush=True,
            )

    started: list[bool] = []  # set once the session opened (the start line said)

    def opened() -> None:
        started.append(True)
        job = torchrun_env()
        ranks = f"{args.ranks} rank(s)" if job is None else f"rank {job.rank} of {job.world}"
        url = None if transport is None else transport.url
        print(opened_line(args.app, ranks, url), file=sys.stderr, flush=True)
        metrics = None
        if args.metrics_port is not None:
            metrics = f"http://127.0.0.1:{args.metrics_port}/metrics"
        elif transport is not None and args.metrics:
            metrics = transport.metrics_url
        if metrics is not None:
            print(f"rxstream run: Prometheus metrics at {metrics}", file=sys.stderr, flush=True)

    status = _StatusLine(sys.stderr) if sys.stderr.isatty() else None
    before = _stamp(args.out)  # an older file there is not what this run kept
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
            otel=otel,
            metrics_port=args.metrics_port,
        )
    except KeyboardInterrupt:
        _clear(status)
        _say_kept(args, before)
        return fail("interrupted, stopped", INTERRUPTED)
    except (SettingError, DeploymentError) as exc:
        _clear(status)
        return fail(str(exc), 2)
    except OutStreamRefused as exc:  # a main app's streams, known once its session opened
        _clear(status)
        _say_kept(args, before)
        return fail(f"--out-stream {exc.rule}", 1)
    except Exception as exc:
        _clear(status)
        _say_kept(args, before)  # a stage failed: what the run wrote is finished and stays
        show_traceback(args, exc)
        if signals.signum is not None:  # what the stop left behind it: said, then the stop
            fail(describe(exc, files), 1)
            return fail(f"interrupted, stopped ({signals.name})", 128 + signals.signum)
        return fail(describe(exc, files), 1)
    _clear(status)
    if signals.signum is not None and not started:  # stopped as the ranks came up: no run
        _say_kept(args, before)
        return fail(f"interrupted before the run started ({signals.name})", 128 + signals.signum)
    job = torchrun_env()
    if job is not None and job.rank != 0:
        return 0  # under torchrun, rank 0 alone prints the summary of every rank
    from rxstream._kernel._stats import hung, summarize
    from rxstream.runtime import format_statistics

    refused = f" ({result.refused} of them past --frames, refused)" if result.refused else ""
    repeats = result.repeats
    if repeats:
        new = result.egressed - repeats
        repeats_said = (
            f"; {repeats} of them idle repeats (pace's last frame again, no new one in time), "
            f"{new} new"
        )
    else:
        repeats_said = ""
    print(f"{result.egressed} items egressed on {result.ranks} rank(s){refused}{repeats_said}")
    _say_kept(args, before, result.run_id)
    for rank in range(result.ranks):
        stats = result.statistics.get(rank, {})
        print(f"\nrank {rank}")
        print(format_statistics(stats) if stats else "no stages")
    findings = summarize(result.statistics)
    if findings:
        print()
        for line in findings:
            print(line)
    if signals.signum is not None:
        sys.stdout.flush()
        return fail(f"interrupted, stopped ({signals.name})", 128 + signals.signum)
    stuck = hung(result.statistics)
    if stuck is not None:  # exit 0 means the output is what the app asked for: not here
        sys.stdout.flush()
        return fail(stuck, 1)
    return 0


def _otel_asked(flag: bool) -> tuple[bool, str]:
    """Whether the run makes traces (``--otel``, or the ``OTEL_*`` environment alone), and
    what to say: with ``--otel``, the failure when the otel extra is missing; without, the
    warning when the environment asks for traces the run cannot make (it runs without)."""
    from rxstream.ranks._torchrun import torchrun_env
    from rxstream.timing._otel import EXTRA_HINT, env_asker, env_ignored, missing_extra

    if flag:
        missing = missing_extra()
        if missing:
            return True, (
                f"--otel: OpenTelemetry traces need the otel extra, which is not installed "
                f"(missing: {missing}): {EXTRA_HINT}"
            )
        return True, ""
    asker = env_asker()
    if not asker:
        return False, ""
    said = env_ignored(asker, torchrun=torchrun_env() is not None)
    return not said, said


def not_secure_line(host: str) -> str:
    """Why a page served over plain http on ``host`` (not loopback) is worse for a remote
    visitor, and what to do."""
    return (
        f"serving http:// on {host}, not loopback, without TLS: a remote visitor's page is not "
        "a secure context (no WebCodecs: JPEG at several times the bytes; no pointer raw "
        "updates); give --tls-cert/--tls-key or --tls-self-signed, or put a TLS proxy or an "
        'SSH tunnel in front (docs/session.md, "Serving to remote visitors")'
    )


def opened_line(app: str, ranks: str, url: str | None) -> str:
    """The line a run prints once its session opened: the app, its ranks and, when it serves
    a page, the page's ``url`` last, after a space and with nothing after it (a ``;`` glued
    to it was copied with it: the page refused the token)."""
    if url is None:
        return f"rxstream run: {app} on {ranks}, headless; Ctrl-C stops"
    return f"rxstream run: {app} on {ranks}, Ctrl-C stops; serving the page at {url}"


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


def _build_app(app: App, args: argparse.Namespace) -> tuple[Pipeline, AppContext] | None:
    """A ``build(ctx)`` app built once in a scratch context, as ``rxstream topology`` builds
    it (a build is cheap: stages are made, nothing runs — but a ``ctx.self_test()`` block
    inside ``build`` runs here too), for :func:`_check_app`; ``None`` for an
    ``async def main(ctx)`` app without a build (it builds its pipeline in ``main``: its
    problems are found when its run opens). What this raises, ``build`` raised (or it
    returned no Pipeline: :class:`ArgumentTypeError`)."""
    from rxstream.ranks._app import AppContext
    from rxstream.ranks._torchrun import torchrun_env
    from rxstream.timing._emit import configure_quiet_logging

    if app.build is None:
        return None
    configure_quiet_logging()  # as the run's (quiet=True)
    job = torchrun_env()
    world = args.ranks if job is None else job.world
    ctx = AppContext(settings=args.set, rank=0, world=world)
    return app(ctx), ctx  # refuses a non-Pipeline


def _check_app(
    app: App, pipeline: Pipeline, ctx: AppContext, args: argparse.Namespace
) -> str | None:
    """What the command line asks of the app that it cannot do, found before anything runs
    (no self test, no rank, no file): ``None`` when nothing. ``pipeline`` is what the app's
    build returned in ``ctx`` (:func:`_build_app`); the rules its graph breaks raise here
    (:class:`StageBuildError`: it is compiled here, after the build returned), and a ``--set``
    with no control doc to write to (:class:`SettingError`)."""
    from rxstream.ranks._torchrun import torchrun_env

    job = torchrun_env()
    if app.main is None:  # (a main may make the control doc itself)
        ctx.check_settings()  # --set with no control doc to write to
    placed = pipeline.plan.world
    if job is None and placed > args.ranks:
        return (
            f"--ranks must be at least the ranks the app places stages on ({placed}), got "
            f"{args.ranks}: run it with --ranks {placed}"
        )
    problem = _out_problem(pipeline, args)
    idle = idle_ranks(set(pipeline.plan.ranks.values()), args.ranks)
    if problem is None and job is None and idle is not None:  # said; the run goes on
        print(f"rxstream run: warning: {idle}", file=sys.stderr, flush=True)
    return problem


def _out_problem(pipeline: Pipeline, args: argparse.Namespace) -> str | None:
    """What ``--out``/``--out-stream`` ask of the app's streams that it cannot do, or ``None``."""
    if args.out is None:
        return None
    streams = sorted(pipeline.session().streams)
    shown = ", ".join(map(repr, streams))
    if not streams:
        return (
            f"--out {args.out}: the app has no ctx.stream sink, so nothing would be written "
            "(--out writes one of its streams)"
        )
    if args.out_stream is not None and args.out_stream not in streams:
        return f"--out-stream must be one of the app's streams ({shown}), got {args.out_stream!r}"
    if args.out_stream is None and len(streams) > 1:
        return (
            f"--out {args.out}: the app has {len(streams)} streams ({shown}); "
            "pick the one to write with --out-stream"
        )
    return None


def idle_ranks(used: set[int], ranks: int) -> str | None:
    """Which of ``--ranks`` ``ranks`` no stage is placed on (``used``: the ranks that have
    one) and what to do, or ``None`` when each has a stage."""
    idle = [rank for rank in range(ranks) if rank not in used]
    if not idle:
        return None
    named = f"rank {idle[0]}" if len(idle) == 1 else f"ranks {', '.join(map(str, idle))}"
    fix = f"give a stage rank={idle[0]}"
    top = max(used, default=0)
    if idle[0] > top:  # fewer ranks would do
        fix += ", or drop --ranks" if top == 0 else f", or run it with --ranks {top + 1}"
    return f"--ranks {ranks}: no stage is placed on {named} ({fix})"


def _stamp(path: str | None) -> tuple[int, int] | None:
    """The (inode, modification time) of the file at ``path``; ``None`` when there is none."""
    try:
        found = os.stat(path) if path is not None else None
    except OSError:
        return None
    return None if found is None else (found.st_ino, found.st_mtime_ns)


def _say_kept(args: argparse.Namespace, before: tuple[int, int] | None, run_id: str = "") -> None:
    """Name the files the run wrote (finished, also when it failed): the MP4 and its frames,
    the timing log (and ``run_id``, the run's id in it, when known); ``before`` is the
    ``--out`` file's :func:`_stamp` before the run. Under
    torchrun, rank 0 alone (it writes the file)."""
    from rxstream.ranks._torchrun import torchrun_env

    job = torchrun_env()
    if job is not None and job.rank != 0:
        return
    if args.out is not None:
        frames = _video_frames(args.out)
        if frames is not None and before is not None and _stamp(args.out) == before:
            print(f"video: {args.out} not written (no frame reached it; the file is an older one)")
        elif frames is None:
            print(f"video: {args.out} not written (no frame reached it)")
        else:
            print(f"video: {args.out} ({frames} frame{'s' * (frames != 1)})")
    if args.log is not None and Path(args.log).exists():
        written = _timing_records(args.log)
        if written is not None:  # `rxstream timing` would find nothing: suggest nothing
            print(f"timing log: {args.log}: {written}")
            return
        of_run = f", run {run_id}" if run_id else ""
        print(f"timing log: {args.log}{of_run} (summarise it with: rxstream timing {args.log})")


def _timing_records(path: str) -> str | None:
    """``None`` when the timing log at ``path`` holds a record of the run (what
    ``rxstream timing`` summarises), else what it lacks (it is started afresh by the run)."""
    from rxstream.timing import load

    try:
        log = load(path)
    except OSError:
        return None  # (it was there a moment ago: named as before, its reader says why)
    if log.records:
        return None
    why = "no input or steer reached a sink"
    if log.self_tests:
        return f"no timing record of the run written ({why}; only the self test's)"
    return f"no timing record written ({why})"


def _video_frames(path: str) -> int | None:
    """How many frames the MP4 at ``path`` holds (its packets, nothing decoded); ``None``
    when there is no file, or none a demuxer can read."""
    if not Path(path).is_file():
        return None
    import av

    try:
        with av.open(path) as container:
            video = container.streams.video[0]
            return sum(1 for packet in container.demux(video) if packet.size)
    except (av.error.FFmpegError, IndexError):
        return None


def _check_output(flag: str, path: str) -> str | None:
    """Check an output file's place before anything runs: ``None`` when it can be written.

    A folder that is a file, or a path that is a folder, is refused; so is a place where the
    file cannot be made — tried, not guessed from permission bits (root passes those even on
    ``/proc``). The probe never touches the target's own name: a unique temporary file is made
    in the folder and removed (``mkstemp``), or, for a missing folder, a unique temporary
    folder under its first existing parent (``mkdtemp``). So every rank may check at once
    (torchrun's ranks on one host race on one ``--out``: a probe by the target's name refused
    the other rank, "File exists"), and a dangling symlink is checked where it points, as
    writing through it does. An existing file is checked by its bits. Nothing is left behind:
    a missing folder is made by :func:`_make_folder` once every check passed."""
    target = Path(path)
    if target.is_symlink() and not target.exists():  # dangling: the file is made where it points
        target = Path(os.path.realpath(target))
    if target.is_dir():
        return f"{flag} {path} is a folder; give a file name"
    folder = target.parent
    for above in (folder, *folder.parents):
        if above.exists() and not above.is_dir():
            return f"{flag} {path}: {above} is a file, not a folder"
    if target.exists():  # (a FIFO is not opened: that would wait for its reader)
        if not os.access(target, os.W_OK):
            return f"{flag} {path}: the file is not writable"
        return None
    where = next(p for p in (folder, *folder.parents) if p.exists())
    try:
        if where == folder:
            handle, probe = tempfile.mkstemp(prefix=".rxstream-probe-", dir=folder)
            os.close(handle)
            os.unlink(probe)
        else:
            os.rmdir(tempfile.mkdtemp(prefix=".rxstream-probe-", dir=where))
    except OSError as exc:
        return f"{flag} {path}: cannot write in the folder {where}: {exc.strerror}"
    return None


def _make_folder(flag: str, path: str) -> None:
    """Make the missing folder of an output file (checked by :func:`_check_output`); say so.
    Another rank may make it at the same time: the one that made it says so."""
    target = Path(path)
    if target.is_symlink() and not target.exists():
        target = Path(os.path.realpath(target))
    folder = target.parent
    if not folder.exists():
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            if not folder.is_dir():
                raise
            return
        print(f"rxstream run: created the folder {folder}/ for {flag}", file=sys.stderr)


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
    """One line on a terminal, rewritten in place: each stage's fps, inbox depth and drops, and
    a stage busy on one item past its bound (``decode BUSY 5.2 s pts=12``).

    The line fits the terminal's width: when it would not, each rank gets an equal share of
    it, its busy stages first, each part cut short (``…``), so every rank's part shows.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._started = time.monotonic()
        self._last: dict[tuple[int, str], tuple[float, int]] = {}
        self.shown = False

    def __call__(self, statistics: Mapping[int, Mapping[str, StageStatistics]]) -> None:
        width = max(shutil.get_terminal_size((120, 24)).columns - 1, 20)
        self._stream.write(f"\r{self.line(statistics, width)}\x1b[K")
        self._stream.flush()
        self.shown = True

    def line(self, statistics: Mapping[int, Mapping[str, StageStatistics]], width: int) -> str:
        """The status line for ``statistics`` (by rank), at most ``width`` characters."""
        now = time.monotonic()
        ranks: list[tuple[str, list[str], list[str]]] = []  # (prefix, busy parts, the others)
        for rank, stages in sorted(statistics.items()):
            busy, others = [], []
            for name, stats in stages.items():
                since, before = self._last.get((rank, name), (self._started, 0))
                self._last[(rank, name)] = (now, stats.items_out)
                fps = max(stats.items_out - before, 0) / max(now - since, 1e-9)  # (a stop
                # takes back an item it counted out: never a negative rate)
                part = f"{name} {fps:.1f} fps" if fps < 10 else f"{name} {fps:.0f} fps"
                if stats.inbox_capacity:
                    part += f" q{stats.inbox_depth}/{stats.inbox_capacity}"
                if stats.dropped_total:
                    part += f" drop {stats.dropped_total}"
                if stats.overdue_now:
                    part = f"{name} BUSY {stats.busy_s:.1f} s {stats.busy_on.split(',')[0]}"
                    busy.append(part)
                others.append(part)
            prefix = f"[rank {rank}] " if len(statistics) > 1 else ""
            ranks.append((prefix, busy, others))
        line = " | ".join(prefix + " | ".join(others) for prefix, _, others in ranks)
        if len(line) <= width:
            return line
        texts = []
        for prefix, busy, others in ranks:
            prefix = prefix.replace("[rank ", "[")  # "[1] " when space is short
            texts.append(prefix + " | ".join(busy + [part for part in others if part not in busy]))
        shares = _shares([len(text) for text in texts], width - 3 * (len(texts) - 1))
        return _cut(" | ".join(map(_cut, texts, shares)), width)

    def clear(self) -> None:
        """Erase the line (before anything else is printed)."""
        if self.shown:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self.shown = False


def _shares(wanted: list[int], room: int) -> list[int]:
    """Each rank's share of ``room`` characters: an equal share each, what a short part leaves
    going to the others (at least 8 each)."""
    shares = [0] * len(wanted)
    left = sorted(range(len(wanted)), key=wanted.__getitem__)
    while left:
        equal = max(room // len(left), 8)
        index = left.pop(0)
        shares[index] = min(wanted[index], equal)
        room -= shares[index]
    return shares


def _cut(text: str, width: int) -> str:
    """``text``, cut to ``width`` characters with a ``…``."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _clear(status: _StatusLine | None) -> None:
    if status is not None:
        status.clear()
