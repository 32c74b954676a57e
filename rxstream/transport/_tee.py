"""A transport that hands everything to several: a live page and a file at once."""

from __future__ import annotations

from collections.abc import Callable

from rxstream._exceptions import ArgumentTypeError
from rxstream.item import PipelineItem
from rxstream.timing import TimingRecord
from rxstream.transport._base import Session, Transport

__all__ = ["Tee"]


class Tee(Transport):
    """Fans ``open``, ``send``, ``on_timing`` and ``close`` out to every transport, in order.

    ``connected`` is ``primary``'s, so the primary (a web page, say) decides how long
    ``run()`` lives while ``others`` (a file, say) record. Every transport gets every call even
    when an earlier one raises; the first error is raised after the last call.
    """

    def __init__(self, primary: Transport, *others: Transport) -> None:
        for transport in (primary, *others):
            if not isinstance(transport, Transport):
                raise ArgumentTypeError(
                    f"Tee takes Transport instances, got {type(transport).__name__}"
                )
        self.primary = primary
        self.transports: tuple[Transport, ...] = (primary, *others)
        """Every transport, the primary first."""

    @property
    def connected(self) -> bool:
        return self.primary.connected

    def open(self, session: Session) -> None:
        self._each(lambda transport: transport.open(session))

    def send(self, stream: str, item: PipelineItem) -> None:
        self._each(lambda transport: transport.send(stream, item))

    def on_timing(self, record: TimingRecord) -> None:
        self._each(lambda transport: transport.on_timing(record))

    def close(self) -> None:
        self._each(lambda transport: transport.close())

    def _each(self, call: Callable[[Transport], None]) -> None:
        error: BaseException | None = None
        for transport in self.transports:
            try:
                call(transport)
            except BaseException as exc:  # the rest still get the call
                if error is None:
                    error = exc
        if error is not None:
            raise error
