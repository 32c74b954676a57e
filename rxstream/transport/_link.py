"""The seam between the page protocol and a wire: what the protocol needs of one attached
page's connection (:class:`PageLink`), and what a wire calls on the protocol (:class:`Wire`'s
three hooks: attach, hear a message, leave).

The WebSocket server (``_wsserver.py``) is one wire; an in-memory link in the tests is
another. A wire owns its connections, its event loop and its queues; the protocol owns
everything a page and the server say to each other (``_pageprotocol.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rxstream.transport._page import Page

__all__ = ["PageLink", "Timer", "Wire"]

Timer = Callable[[float, Callable[[], None]], None]
"""``timer(delay_s, fn)``: call ``fn`` once, ``delay_s`` from now, on the wire's own thread
(callable from any thread). The protocol coalesces doc states with it."""


class PageLink(Protocol):
    """One attached page's connection, as a wire gives it to the protocol. Every method may
    be called from any thread (the pipeline's sends, the wire's own handlers)."""

    @property
    def peer(self) -> str:
        """The page's address for logs (``host:port``)."""
        ...

    def unsent_bytes(self) -> int:
        """Bytes handed to this link and not yet taken by the network (its own queue and the
        transport's write buffer): what a new frame would wait behind."""
        ...

    def send_frame(self, stream: str, data: bytes) -> bool:
        """Queue one packed frame (``pack``); False: the link's frame queue is full (the
        frame is not sent)."""
        ...

    def send_text(self, text: str, kind: str = "other", ident: Any = None, key: str = "") -> None:
        """Queue one JSON text; ``kind``/``ident``/``key`` say what it is when it must be
        dropped (an :class:`~rxstream.transport._webclient.Outbox` reports it to the page)."""
        ...

    def close(self) -> None:
        """End the connection (the wire then calls :meth:`Wire.leave`)."""
        ...


class Wire(Protocol):
    """What a wire calls on the protocol (``PageProtocol`` is one)."""

    @property
    def pages(self) -> int:
        """Pages attached now, on every wire (for the connection cap)."""
        ...

    def ping(self, page: Page) -> str:
        """The clock ``ping`` to send ``page`` now: a wire sends one now and then (a burst on
        attach), stamped as it leaves (the page answers with a ``pong``)."""
        ...

    def attach(self, link: PageLink) -> Page:
        """A page connected: its state; the protocol sends it the ``session`` message."""
        ...

    def receive(self, page: Page, text: str | bytes) -> bool:
        """One message from ``page`` (answered on its link; a binary one is refused);
        True: it was refused."""
        ...

    def leave(self, page: Page) -> None:
        """``page``'s connection ended."""
        ...
