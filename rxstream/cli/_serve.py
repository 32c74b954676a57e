"""``rxstream serve APP``: a session per visitor on ``--workers`` warm workers (docs/serving.md)."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["ROUTE", "TOKEN", "TOKEN_ENV", "add_parser", "serve"]

TOKEN_ENV = "RXSTREAM_SERVE_TOKEN"
"""The server's token when set (every server behind one balancer accepts the same link)."""
TOKEN = re.compile(r"[A-Za-z0-9_-]{16,128}")
ROUTE = re.compile(r"[a-z0-9]{1,32}")


def add_parser(commands: Any, count: Callable[[str], int], seconds: Callable[[str], float]) -> None:
    """Add ``serve`` and its flags to the command line's subparsers."""
    serve = commands.add_parser("serve", help="serve an app to many visitors, a session each")
    serve.add_argument("app", help="path/to/app.py[:func] or module[:func]")
    serve.add_argument("--workers", type=count, default=2, help="warm workers (default 2)")
    serve.add_argument("--ranks", type=count, default=1, help="rank processes per session")
    serve.add_argument("--host", default="127.0.0.1", help="the address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8765, help="the port (default 8765; 0: any)")
    serve.add_argument(
        "--allow-remote", action="store_true", help="allow a --host that is not loopback"
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a name a visitor's Host header may carry (a proxy's, a DNS name); repeatable",
    )
    serve.add_argument(
        "--route",
        default="",
        metavar="NAME",
        help="this server's name behind a load balancer: its session ids, session tokens and "
        "queue tickets start with NAME- (letters and digits)",
    )
    serve.add_argument(
        "--public",
        action="store_true",
        help="anyone who reaches the port gets a session (no server token), rate-limited per "
        "client address",
    )
    serve.add_argument("--queue", type=int, default=16, help="visitors that may wait (default 16)")
    serve.add_argument(
        "--idle-s", type=seconds, default=120.0, help="end a session after this long without input"
    )
    serve.add_argument("--max-session-s", type=seconds, help="end a session after this long")
    serve.add_argument(
        "--grace",
        type=float,
        default=2.0,
        metavar="S",
        help="how long a session outlives its page (a reload within it keeps it; default 2)",
    )
    serve.add_argument("--tls-cert", metavar="PEM", help="serve over https with this certificate")
    serve.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    serve.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="write this into every session's control doc (repeatable)",
    )
    serve.add_argument(
        "--log",
        metavar="JSONL",
        help="the timing log every session appends to (each line carries its session)",
    )
    serve.add_argument(
        "--metrics",
        action="store_true",
        help="serve Prometheus metrics at /metrics behind the server's token: the server's "
        "and every live session's, each labelled with its session",
    )


def serve(args: argparse.Namespace) -> int:
    """``rxstream serve``: 0, 1 (the app would not load), 2 (a usage error), 128 + a signal."""
    from rxstream._exceptions import SettingError
    from rxstream._settings import split_setting
    from rxstream.serve import ServeOptions, WorkerSpec
    from rxstream.serve import serve as run_front
    from rxstream.transport._guard import is_loopback

    def fail(message: str, status: int) -> int:
        print(f"rxstream serve: {message}", file=sys.stderr, flush=True)
        return status

    try:
        for text in args.set:
            split_setting(text)
    except SettingError as exc:
        return fail(str(exc), 2)
    if not is_loopback(args.host) and not args.allow_remote:
        return fail(
            f"--host must be a loopback address unless --allow-remote, got {args.host!r}", 2
        )
    if args.route and not ROUTE.fullmatch(args.route):
        return fail(f"--route must be 1 to 32 lowercase letters and digits, got {args.route!r}", 2)
    token = os.environ.get(TOKEN_ENV) or None
    if token is not None and not TOKEN.fullmatch(token):
        return fail(
            f"{TOKEN_ENV} must be 16 to 128 of A-Z a-z 0-9 - _, got {len(token)} characters", 2
        )
    if not 0 <= args.port <= 65535:
        return fail(f"--port must be in 0..65535, got {args.port}", 2)
    if args.queue < 0:
        return fail(f"--queue must be >= 0, got {args.queue}", 2)
    if args.grace < 0:
        return fail(f"--grace must be >= 0 seconds, got {args.grace}", 2)
    if (args.tls_cert is None) != (args.tls_key is None):
        return fail("--tls-cert and --tls-key go together", 2)
    tls = None
    if args.tls_cert is not None:
        from rxstream.transport._tls import server_context

        try:
            tls = server_context(
                args.tls_cert, args.tls_key, cert_name="--tls-cert", key_name="--tls-key"
            )
        except ValueError as exc:
            return fail(str(exc), 2)
    spec = WorkerSpec(
        entry=args.app,
        ranks=args.ranks,
        settings=tuple(args.set),
        grace_s=args.grace,
        log=args.log,
        metrics=args.metrics,
    )
    options = ServeOptions(
        host=args.host,
        port=args.port,
        workers=args.workers,
        queue=args.queue,
        idle_s=args.idle_s,
        max_session_s=args.max_session_s,
        public=args.public,
        tls=tls,
        allowed_hosts=tuple(args.allowed_host),
        allow_remote=args.allow_remote,
        route=args.route,
        token=token,
        metrics=args.metrics,
    )

    def ready(front: Any) -> None:
        who = "anyone (--public)" if args.public else "whoever has the link"
        print(
            f"rxstream serve: {args.app} on {args.workers} warm worker(s), a session for "
            f"{who}; Ctrl-C stops; serving at {front.url}",
            file=sys.stderr,
            flush=True,
        )
        if args.public:
            listing = front.url + f"sessions?token={front.token}"
            print(f"rxstream serve: the sessions at {listing}", file=sys.stderr, flush=True)

    try:
        signum, failed = run_front(spec, options, on_ready=ready)
    except OSError as exc:
        return fail(f"cannot listen on {args.host}:{args.port}: {exc.strerror}", 2)
    if failed is not None and failed.startswith("usage: "):
        return fail(failed.removeprefix("usage: "), 2)
    if failed is not None:
        return fail(failed, 1)
    if signum:
        import signal

        with contextlib.suppress(ValueError):
            name = signal.Signals(signum).name
            return fail(f"{name}: every session ended, every worker stopped", 128 + signum)
    return 0
