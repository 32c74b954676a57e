"""Ranks beyond one host: ``torch.distributed`` ranks, launched by ``torchrun``.

Under ``torchrun`` every process runs one rank, and :func:`rxstream.launch` (so ``rxstream run
app.py``) hands over to :func:`launch_torchrun` when it finds torchrun's environment::

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        -m rxstream run app.py --frames 1000

Each rank joins the gloo process group torchrun's rendezvous describes, rank 0 (the
controller) builds the app first and hands its docs to the others, which build the same
graph. The ranks tell each other their host (hostname and boot id): a boundary between two
ranks of one host keeps the shared-memory ring (its upstream rank makes it and passes its file
descriptors over a Unix socket), a boundary between hosts crosses over ``torch.distributed``
point-to-point (:class:`DistChannel`: gloo, and NCCL for CUDA tensors when every rank has it).
``RXSTREAM_CROSS_HOST`` forces the cross-host transport on one host (``all``, or edge names).

The controller replicates every doc write and generation change to the other ranks over a
gloo group of its own, gathers their egress counts, ends the run (``frames``, ``timeout``,
every rank completed, or the first error) and stops every rank. Each side of a control link
sends a beat every 0.25 s and ranks report every 50 ms: a rank (or a host's ranks) not heard
from for 2 s, or whose connection breaks, ends the run on every other rank with a
:class:`RankLost` naming it.
"""

from __future__ import annotations

import atexit
import datetime
import os
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rxstream._exceptions import ArgumentError, PipelineError, PipelineStateError
from rxstream.ranks._common import LaunchOptions, LaunchResult, Statistics
from rxstream.ranks._distboundary import DistChannel, RankLost
from rxstream.ranks._distlaunch import (
    BACKEND_ENV,
    CROSS_HOST_ENV,
    SETUP_S,
    Launch,
    estimate_offset,
    exit_now,
    terminate_as_interrupt,
)
from rxstream.timing._emit import configure_quiet_logging

__all__ = [
    "BACKEND_ENV",
    "CROSS_HOST_ENV",
    "DistChannel",
    "RankLost",
    "TorchrunEnv",
    "estimate_offset",
    "launch_torchrun",
    "loopback_groups",
    "open_group",
    "torchrun_env",
]

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class TorchrunEnv:
    """What torchrun tells a worker process about its place in the job."""

    rank: int
    """This process's rank in the job (``RANK``)."""
    world: int
    """How many ranks the job has (``WORLD_SIZE``)."""
    local_rank: int
    """This process's rank on its host (``LOCAL_RANK``; its GPU, when it has one)."""
    master_addr: str
    """Where the rendezvous store listens (``MASTER_ADDR``)."""
    master_port: int
    """Its port (``MASTER_PORT``)."""


def torchrun_env(environ: Mapping[str, str] | None = None) -> TorchrunEnv | None:
    """The torchrun environment of this process; ``None`` unless all five variables are set.

    Raises ``ValueError`` naming the variable for a value that is not what torchrun sets.
    """
    env = os.environ if environ is None else environ
    if not all(name in env for name in _TORCHRUN_VARS):
        return None

    def number(name: str, low: int, high: int | None = None) -> int:
        raw = env[name]
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if value < low or (high is not None and value >= high):
            bound = f">= {low}" if high is None else f"in [{low}, {high})"
            raise ArgumentError(f"{name} must be an int {bound}, got {raw!r}")
        return value

    world = number("WORLD_SIZE", 1)
    return TorchrunEnv(
        rank=number("RANK", 0, world),
        world=world,
        local_rank=number("LOCAL_RANK", 0),
        master_addr=env["MASTER_ADDR"],
        master_port=number("MASTER_PORT", 1, 65536),
    )


def loopback_groups(world: int, *, timeout: float = 30.0) -> list[Any]:
    """``world`` gloo process groups of one job, every rank in this process, over 127.0.0.1.

    Group ``r`` is rank ``r``'s view. For testing and measuring boundaries without torchrun:
    ``DistChannel(name, groups[0], 1, side="writer")`` talks to ``DistChannel(name,
    groups[1], 0, side="reader")``.
    """
    if isinstance(world, bool) or not isinstance(world, int) or world < 2:
        raise ArgumentError(f"world must be an int >= 2, got {world!r}")
    from torch._C._distributed_c10d import HashStore, PrefixStore

    store = PrefixStore(secrets.token_hex(4), HashStore())
    groups: list[Any] = [None] * world
    errors: list[BaseException] = []

    def make(rank: int) -> None:
        try:
            groups[rank] = _gloo(store, rank, world, "127.0.0.1", timeout)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=make, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return groups


def open_group(
    rank: int, world: int, *, port: int, host: str = "127.0.0.1", timeout: float = 30.0
) -> Any:
    """Rank ``rank``'s gloo process group of ``world`` processes meeting at ``host:port``.

    Rank 0 hosts the store there; every rank blocks until all have joined. For testing and
    measuring boundaries between processes without torchrun.
    """
    from torch._C._distributed_c10d import PrefixStore, TCPStore

    span = datetime.timedelta(seconds=timeout)
    store = TCPStore(host, port, world, rank == 0, span)
    return _gloo(PrefixStore("rxstream", store), rank, world, host, timeout)


def _gloo(store: Any, rank: int, world: int, host: str, timeout: float) -> Any:
    """A gloo group on ``host``'s interface."""
    from torch._C._distributed_c10d import ProcessGroupGloo

    # ``_Options`` is how a device is given to the constructor (no public spelling)
    options = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._devices = [ProcessGroupGloo.create_device(hostname=host)]
    options._timeout = datetime.timedelta(seconds=timeout)
    return ProcessGroupGloo(store, rank, world, options)


# --- the launch -----------------------------------------------------------------------------------


def launch_torchrun(
    entry: str,
    ranks: int = 1,
    *,
    frames: int | None = None,
    config: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    settings: Sequence[str] = (),
    serving: Mapping[str, Any] | None = None,
    transport: Any = None,
    out: str | Path | None = None,
    out_stream: str | None = None,
    log: str | Path | None = None,
    on_open: Callable[[], None] | None = None,
    on_status: Callable[[Statistics], None] | None = None,
    quiet: bool = False,
) -> LaunchResult:
    """Run this process's rank of the app ``entry`` under torchrun until the job ends.

    Arguments as :func:`rxstream.launch`, which calls this when it finds torchrun's
    environment. The world size is torchrun's, so ``ranks`` must be 1 (the default) or that
    size. ``config`` and ``settings`` are rank 0's (the others get its docs); ``on_open`` and
    ``on_status`` are called on rank 0; ``log`` is written by every rank that has a sink (on
    its own host). A session transport, ``out`` and ``serving`` are not supported under
    torchrun (``ValueError``). Rank 0 returns every rank's statistics, the others their own.
    A failure anywhere raises :class:`PipelineError` on every rank that is left, naming the
    rank (for a rank or host that went away, caused by :class:`RankLost`).
    """
    options = LaunchOptions(
        frames=frames,
        config=config,
        timeout=timeout,
        settings=tuple(settings),
        serving=serving,
        transport=transport,
        out=out,
        out_stream=out_stream,
        log=log,
        on_open=on_open,
        on_status=on_status,
        quiet=quiet,
    )
    return run_torchrun(entry, ranks, options)


def run_torchrun(entry: str, ranks: int, options: LaunchOptions) -> LaunchResult:
    """:func:`launch_torchrun` with ``options``."""
    env = torchrun_env()
    if env is None:
        raise PipelineStateError(
            "launch_torchrun runs under torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR "
            "and MASTER_PORT must be set (torchrun --nproc-per-node N -m rxstream run APP)"
        )
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks not in (1, env.world):
        raise ArgumentError(
            f"ranks must be 1 or torchrun's WORLD_SIZE ({env.world}) under torchrun, got {ranks!r}"
        )
    given = {
        "transport": options.transport,
        "out": options.out,
        "out_stream": options.out_stream,
        "serving": options.serving,
    }
    for name, value in given.items():
        if value is not None:
            raise ArgumentError(f"{name} is not supported under torchrun yet, got {value!r}")
    quiet = options.quiet
    import torch
    import torch.distributed as dist

    if quiet:
        configure_quiet_logging()
    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
    dist.init_process_group(
        "gloo",
        init_method="env://",
        rank=env.rank,
        world_size=env.world,
        timeout=datetime.timedelta(seconds=SETUP_S),
    )
    launch: Launch | None = None
    try:
        with terminate_as_interrupt(lambda: None if launch is None else launch.verdict(0.5)):
            launch = Launch(env, entry, options)
            return launch.run()
    except PipelineError as exc:
        if isinstance(exc.cause, RankLost):
            # a wait on a peer that went silent never ends, and gloo's teardown at the
            # interpreter's exit would hang on it, then abort: end the process without it
            atexit.register(exit_now, 1)
        raise
    finally:
        dist.destroy_process_group()  # left to the interpreter's exit, it aborts the process
