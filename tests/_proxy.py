"""A loopback TCP proxy between a page and the server, for the link tests: it can hold the
server's bytes and release them at once (a burst, as after a retransmission), cut the link
(close both sides, refuse new connections for a while) or stall it (forward nothing, close
nothing: a half-open link)."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Self


class _Pair:
    """One proxied connection: the page's side and the server's."""

    def __init__(self, page: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.page = page
        self.server = server
        self.server_closed = threading.Event()
        """Set once the server ended its side (EOF or reset): it dropped the connection."""

    def close(self) -> None:
        for writer in (self.page, self.server):
            transport = writer.transport
            if not transport.is_closing():
                transport.abort()


class LinkProxy:
    """Forward ``127.0.0.1:port`` to ``127.0.0.1:target`` on a thread of its own while in
    ``with``. :meth:`hold`, :meth:`cut` and :meth:`stall` impair the link."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = _free_port()
        self.pairs: list[_Pair] = []
        """Every connection so far, newest last."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._holding = False
        self._held: dict[asyncio.StreamWriter, list[bytes]] = {}
        self._stalled: set[_Pair] = set()

    def __enter__(self) -> Self:
        self._thread.start()
        self._call(self._listen())
        return self

    def __exit__(self, *exc: object) -> None:
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    @property
    def url_host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def hold(self, seconds: float) -> None:
        """Hold what the server sends for ``seconds`` (every connection), then write it all
        to the page at once; returns once released."""
        self._call(self._hold(seconds))

    def cut(self, refuse_s: float) -> None:
        """Close every connection (both sides) and refuse new ones for ``refuse_s`` seconds,
        then accept again; returns at once (the refusal runs on)."""
        self._call(self._cut(refuse_s))

    def stall(self) -> _Pair:
        """Forward nothing more on the newest connection, close nothing (a half-open link);
        new connections are forwarded as before. Returns the stalled pair."""
        pair = self.pairs[-1]
        self._loop.call_soon_threadsafe(self._stalled.add, pair)
        return pair

    # --- on the proxy's loop ----------------------------------------------------------------

    def _call(self, coroutine: object) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(60)  # type: ignore[arg-type]

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", self.port, reuse_address=True
        )

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for pair in self.pairs:
            pair.close()

    async def _hold(self, seconds: float) -> None:
        self._holding = True
        await asyncio.sleep(seconds)
        self._holding = False
        held, self._held = self._held, {}
        for writer, chunks in held.items():
            if not writer.transport.is_closing():
                writer.write(b"".join(chunks))

    async def _cut(self, refuse_s: float) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for pair in self.pairs:
            pair.close()
        self._loop.call_later(refuse_s, lambda: asyncio.ensure_future(self._listen()))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        pair = _Pair(writer, up_writer)
        self.pairs.append(pair)
        await asyncio.gather(
            self._pipe(reader, up_writer, pair, to_server=True),
            self._pipe(up_reader, writer, pair, to_server=False),
        )

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pair: _Pair,
        *,
        to_server: bool,
    ) -> None:
        try:
            while data := await reader.read(1 << 16):
                if pair in self._stalled:
                    continue  # read and dropped: nothing reaches the other side, nothing closes
                if not to_server and self._holding:
                    self._held.setdefault(writer, []).append(data)
                    continue
                writer.write(data)
        except (ConnectionError, OSError):
            pass
        finally:
            if not to_server:
                pair.server_closed.set()
            if pair not in self._stalled:
                pair.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
