"""The process environment of a :class:`~rxstream.Context`: what one process's pipelines share.

The session transport, the harness and timing flags, the rank and world, the docs and their
generations, the rings' geometry, the launcher hook, and ``self_test``. The stage builders
(``ctx.source``, ``ctx.pipe``…) are :class:`~rxstream.Context`'s own, over this.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from rxstream._exceptions import ArgumentError, ArgumentTypeError, SelfTestError
from rxstream._kernel._resources import Resource, declare, self_testing
from rxstream._util import library_logger
from rxstream.doc import Doc, Generations, Snapshot
from rxstream.ipc import RingSpec
from rxstream.runtime import _crossings
from rxstream.runtime._tasks import AppTasks
from rxstream.transport import MemoryTransport, Transport

if TYPE_CHECKING:
    from rxstream.context import Context
    from rxstream.pipeline import Launcher, Pipeline

__all__ = ["Environment"]

_log = library_logger("rxstream")
T = TypeVar("T")


class Environment:
    """What one process's pipelines share: the transport, flags, rank and world, the docs.

    ``transport`` receives what ``ctx.stream`` sinks egress (default: a
    :class:`~rxstream.transport.MemoryTransport` keeping the last 256 items per stream);
    ``harness=True`` marks a run under the CPU harness (``rxstream test``); ``timing=False``
    turns the per-hop stamps and the timing records off (for measuring what they cost).
    ``config`` is the initial desired state of the control doc, written as the app makes it
    (so ``build(ctx)`` already reads it); the launcher passes ``rank``, ``world`` and, on
    ranks > 0, ``replicas`` (the controller's doc states).
    """

    def __init__(
        self,
        *,
        transport: Transport | None = None,
        harness: bool = False,
        timing: bool = True,
        rank: int = 0,
        world: int = 1,
        config: Mapping[str, Any] | None = None,
        replicas: Mapping[str, tuple[Mapping[str, Any], int]] | None = None,
        cuda_api: Any = None,
        nvtx: bool | None = None,
    ) -> None:
        self.transport: Transport = transport if transport is not None else MemoryTransport(256)
        self.harness = harness
        self.timing = timing
        self.rank = rank
        """This process's rank (0: the controller); the launcher sets it."""
        self.world = world
        """How many ranks the app runs on."""
        self.cuda_api = cuda_api
        """How CUDA tensors cross rank boundaries (``None``: torch's CUDA IPC when there is a
        GPU; tests pass ``rxstream.ipc.FakeCudaApi()``)."""
        self.nvtx = nvtx
        """Whether every stage call of a run with a CUDA api is an NVTX range named
        ``<stage> input_seq=<n>`` (``None``: the ``RXSTREAM_NVTX`` environment variable)."""
        self.self_test_passed: bool | None = None
        self.self_testing = False
        """Whether a ``with ctx.self_test():`` block is running (its timing records are tagged
        ``self_test``)."""
        self._self_test_drives: list[Pipeline] = []
        """The pipelines driven inside the running self test: their sessions end with it."""
        self._self_test_docs: dict[str, tuple[Snapshot, int, int]] | None = None
        """While a self test runs: each doc's state (snapshot, version, how many bind
        failures it held) before the block (or as it was made, for a doc made in the block),
        put back when it ends."""
        self.generations = Generations()
        self.docs: dict[str, Doc] = {}
        self._config = dict(config or {})
        self._replicas = dict(replicas or {})
        self._launcher: Launcher | None = None
        """Set by ``rxstream run`` for a main app on several ranks: starts a run's other ranks."""
        self._ring_spec = RingSpec()
        self._busy_limit_s: float | None = None
        self._tasks = AppTasks()
        """The app's tasks (``ctx.spawn``): a failure ends ``pipeline.run()``."""

    @property
    def busy_limit_s(self) -> float | None:
        """Seconds a stage may be busy on one item before its run warns (``stage_busy``) and
        counts it in its statistics (``overdue``); ``None`` (the default) leaves the bound to
        the environment variable ``RXSTREAM_BUSY_S``, else to each stage's own history:
        ``max(1 s, 20 x`` its mean work an item``)`` (10 s for its first item). Set it in
        ``build(ctx)`` (every rank builds, so every rank takes it): ``ctx.busy_limit_s = 0.5``.
        """
        return self._busy_limit_s

    @busy_limit_s.setter
    def busy_limit_s(self, seconds: float | None) -> None:
        if seconds is not None and (
            isinstance(seconds, bool) or not isinstance(seconds, int | float)
        ):
            raise ArgumentTypeError(
                f"ctx.busy_limit_s must be a number of seconds or None, got {seconds!r} "
                f"({type(seconds).__name__})"
            )
        if seconds is not None and not 0 < seconds < float("inf"):
            raise ArgumentError(f"ctx.busy_limit_s must be > 0 seconds, got {seconds!r}")
        self._busy_limit_s = None if seconds is None else float(seconds)

    @property
    def ring_spec(self) -> RingSpec:
        """The geometry of every rank boundary's shared-memory ring (default: 4 slots of 8 MiB).

        Set it in ``build(ctx)`` for items a slot cannot hold, e.g. 4K frames:
        ``ctx.ring_spec = RingSpec(slot_bytes=32 << 20)``. Rank 0's setting makes the rings of
        a launch (every rank builds the same graph, so every rank's is the same).
        """
        return self._ring_spec

    @ring_spec.setter
    def ring_spec(self, spec: RingSpec) -> None:
        if not isinstance(spec, RingSpec):
            raise ArgumentTypeError(
                f"ctx.ring_spec must be a rxstream.RingSpec, got {spec!r} ({type(spec).__name__})"
            )
        self._ring_spec = spec

    def lease(self, shape: Sequence[int], dtype: Any, *, device: Any = None) -> Any:
        """An empty array or tensor for the calling stage to produce its output into.

        Called from a stage whose output crosses a rank boundary with a CUDA slot pool (a
        torch ``dtype``), it is a view of a free slot (it waits while every slot is in
        flight): fill it and return it (or a view of it), and the boundary sends only the
        slot's index, with no copy. From a CPU stage whose output crosses a shared-memory ring
        (a numpy ``dtype``, or a torch one with ``device="cpu"`` or no CUDA here), it is a
        numpy array or CPU tensor over a free slot of the ring, and the boundary sends only a
        notification. Both from the stage's second item on. Anywhere else (no boundary, the
        pool not made yet, ``drive``) it is a new array, or a tensor on ``device`` (default:
        ``cuda`` when available, else the CPU), so the same stage code runs everywhere. Keep
        no reference to it once returned: the slot is reused once the consumer is done and no
        view of the lease lives. See docs/ranks.md.
        """
        return _crossings.lease(shape, dtype, device)

    def resource(
        self, name: str, loader: Callable[[], T], *, stand_in: Callable[[], T] | None = None
    ) -> Resource[T]:
        """What is expensive to make (weights, compiled kernels), made by ``loader()`` once per
        process, in the process whose stages read it; a :class:`~rxstream.Resource` handle.

        Declaring it loads nothing: a stage reads ``handle.get()`` (or calls the handle), and a
        run loads the resources its stages on this rank read before their first item, in
        parallel with the other ranks (a build that only composes, as the launcher's check of
        the app, or a rank that runs none of its readers, never loads it). The value is kept
        by name for the life of the process: every later context, session and run here reads
        the same. The same ``name`` with the same loader (a build run again) is the same
        handle; with another loader, or the same one over other values, it is refused.
        ``stand_in`` (cheap, of no argument) makes what a ``ctx.self_test()`` block reads
        instead: a self test that drives the stage then loads no model, not even in the
        launcher of a run on several ranks. See docs/ranks.md, "Models: loaded once, where
        they run".
        """
        return declare(name, loader, stand_in)

    def doc(
        self,
        name: str = "control",
        *,
        defaults: Mapping[str, Any] | None = None,
        schema: object = None,
    ) -> Doc:
        """The desired-state doc ``name``: made on first call, the same object after.

        ``defaults`` is the initial state (and, without a ``schema``, fixes its shape and
        types); ``schema`` is a dataclass or a callable validator (see :mod:`rxstream.doc`).
        All docs of a context share its generations.
        """
        existing = self.docs.get(name)
        if existing is not None:
            if defaults is not None or schema is not None:
                raise ArgumentError(
                    f"doc {name!r} exists already; pass defaults= and schema= only on first use"
                )
            return existing
        made = Doc(
            name,
            defaults=defaults,
            schema=schema,
            generations=self.generations,
            context=self._builders(),
        )
        self.docs[name] = made
        if name == "control" and self._config:  # the initial desired state, as the app starts
            made.set(self._config)
        replica = self._replicas.pop(name, None)
        if replica is not None:  # on a rank > 0: the controller's state
            made.replicate(*replica)
        self._made(made)
        if self._self_test_docs is not None:  # made in a self test: put back as made
            self._self_test_docs.setdefault(name, (made.snapshot(), made.version, 0))
        return made

    def _made(self, doc: Doc) -> None:
        """A doc was just made (with its defaults, ``config`` and replica): the launcher's
        context writes its ``--set`` settings here."""

    def _builders(self) -> Context | None:
        """What a doc's ``bind`` builds its stages with (a :class:`~rxstream.Context`: itself)."""
        return None

    @property
    def control(self) -> Doc:
        """The doc that ``pipeline.update`` steers: ``ctx.doc("control")``."""
        return self.doc("control")

    @property
    def connected(self) -> bool:
        """Whether the session transport has a client attached; ``run()`` lives while it does."""
        return self.transport.connected

    # --- self test --------------------------------------------------------------------------

    @contextlib.contextmanager
    def self_test(self) -> Iterator[None]:
        """Run the block as the app's own check; reaching its end is a pass.

        A block that raises fails with :class:`SelfTestError` (its cause attached) and
        ``ctx.self_test_passed`` is set either way. The driven sessions of the pipelines the
        block drove end with it (as ``pipeline.reset()`` ends them), and it leaves no trace
        in the run after it: every doc's state and version, and the generations, are put
        back as they were before the block (its ``doc.set``, ``steer``, ``pipeline.update``
        and ``flush`` are the check's alone; a ``--set`` setting stays in force).
        """
        started = time.monotonic()
        outer = self._self_test_docs
        docs = self._self_test_docs = {
            name: (doc.snapshot(), doc.version, len(doc.errors)) for name, doc in self.docs.items()
        }
        generations = self.generations.state(), self.generations.steered_at
        self.self_testing = True
        try:
            with self_testing():  # resources with a stand-in give it
                yield
        except Exception as exc:
            self.self_test_passed = False
            _log.error("self_test_failed", error=f"{type(exc).__name__}: {exc}")
            raise SelfTestError(f"self test failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self.self_testing = outer is not None
            # a check, not a session to go on with: release what its drives built (bound
            # stages, sources), so nothing of it stays subscribed to the docs during the run
            driven, self._self_test_drives = self._self_test_drives, []
            for pipeline in driven:
                pipeline._end_session()
            self._self_test_docs = outer
            for name, state in docs.items():
                self.docs[name]._rewind(*state)
                if outer is not None:  # a doc made in a nested block: the outer one's too
                    outer.setdefault(name, state)
            self.generations._rewind(*generations)
        self.self_test_passed = True
        _log.info("self_test_passed", seconds=round(time.monotonic() - started, 3))
