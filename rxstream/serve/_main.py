"""Running the front until a signal: what ``rxstream serve`` does once its flags are read."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable

from rxstream.serve._front import Front, ServeOptions
from rxstream.serve._worker import WorkerSpec

__all__ = ["STOP_SIGNALS", "serve"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What stops the server: every session ends, every worker exits, then the front."""


def serve(
    spec: WorkerSpec,
    options: ServeOptions,
    *,
    on_ready: Callable[[Front], None] | None = None,
    status: bool | None = None,
) -> tuple[int, str | None]:
    """Serve until SIGINT, SIGTERM or SIGHUP: the signal's number (0 when none came) and why
    the workers could not start (``None`` when they did). ``on_ready(front)`` is called once
    every worker is warm; ``status`` draws the status line (default: on a terminal)."""
    draw = sys.stderr.isatty() if status is None else status
    return asyncio.run(_serve(spec, options, on_ready, draw))


async def _serve(
    spec: WorkerSpec,
    options: ServeOptions,
    on_ready: Callable[[Front], None] | None,
    draw: bool,
) -> tuple[int, str | None]:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    came: list[int] = []

    def stopping(signum: int) -> None:
        if came:  # the same again: the workers are killed at once
            front.pool.quitting = True
            for worker in front.pool.workers:
                worker.process.kill()
        came.append(signum)
        stop.set()

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stopping, signum)
    front = Front(spec, options, status=sys.stderr if draw else None)
    try:
        await front.start()
        waiting = asyncio.ensure_future(front.ready.wait())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([waiting, stopped], return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if front.failed is not None:
            return 0, front.failed if not front.usage else f"usage: {front.failed}"
        if not stop.is_set():
            if on_ready is not None:
                on_ready(front)
            await stop.wait()
        stopped.cancel()
        return (came[0] if came else 0), None
    finally:
        await front.close()
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
