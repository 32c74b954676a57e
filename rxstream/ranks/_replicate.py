"""Doc replication: every doc write and generation change of rank 0, applied on every rank."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rxstream.context import Context
from rxstream.doc import Doc, GenerationState, Snapshot
from rxstream.doc._snapshot import thaw


def replicate(ctx: Context, send: Callable[[tuple[Any, ...]], None]) -> list[Any]:
    """``send`` every doc write and generation change of ``ctx`` as it happens (the messages
    ranks apply with ``doc.replicate`` and ``generations.replicate``), and the generations as
    they are now; the subscriptions to dispose. The spawn launch and the torchrun control
    plane both use it."""
    subscriptions: list[Any] = []

    def doc_writer(name: str, doc: Doc) -> Callable[[Snapshot], None]:
        return lambda snapshot: send(("doc", name, thaw(snapshot), doc.version))

    for name, doc in ctx.docs.items():
        subscriptions.append(doc.snapshots.subscribe(doc_writer(name, doc)))
    gens = ctx.generations

    def on_generations(state: GenerationState) -> None:
        send(("generations", state, gens.steered_at))

    gens.listeners.append(on_generations)
    subscriptions.append(_Unlisten(gens.listeners, on_generations))
    on_generations(gens.state())  # as they are now: a steer made before the ranks started
    return subscriptions


def apply_replica(ctx: Context, message: tuple[Any, ...]) -> bool:
    """Apply a message :func:`replicate` sent (a doc write, the generations) to this rank's
    ``ctx``; whether it was one."""
    kind = message[0]
    if kind == "doc":
        _, name, state, version = message
        ctx.doc(name).replicate(state, version)
    elif kind == "generations":
        _, state, steered_at = message
        ctx.generations.replicate(state, steered_at)
    else:
        return False
    return True


class _Unlisten:
    def __init__(self, listeners: list[Any], listener: Any) -> None:
        self._listeners, self._listener = listeners, listener

    def dispose(self) -> None:
        if self._listener in self._listeners:
            self._listeners.remove(self._listener)
