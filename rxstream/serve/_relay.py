"""The relay between a visitor's socket and their session's WebTransport on its worker.

One message at a time each way, every send awaiting its drain: the relay holds no queue of
its own (aiohttp's reader pauses the socket past its small buffer), so a page that falls
behind slows the worker's socket as if attached directly, and the worker's per-page outbox
(and its drop-oldest rule) stays the one place frames wait. The worker's ``Host`` and
``Origin`` checks see the worker's own address: the front checked the visitor's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

import aiohttp
from aiohttp import WSMsgType, web

from rxstream.serve._sessions import Session

__all__ = ["END_SAY_S", "relay"]

END_SAY_S = 3.0
"""How long the relay waits, once the worker closed its socket, for the worker to say why."""
FINAL_CLOSE = 1000
"""The close code the visitor's page gets when its session ended (a page does not retry)."""


async def relay(
    request: web.Request,
    session: Session,
    client: aiohttp.ClientSession | None,
    noted: Callable[[Session, str], None],
) -> web.WebSocketResponse:
    """Relay ``request``'s socket to ``session``'s worker until either side closes;
    ``noted(session, text)`` sees each text message of the page."""
    assert client is not None
    assert session.port is not None
    page = web.WebSocketResponse(max_msg_size=0)
    await page.prepare(request)
    here = f"127.0.0.1:{session.port}"
    try:
        upstream = await client.ws_connect(
            f"ws://{here}/ws?token={session.token}", origin=f"http://{here}", max_msg_size=0
        )
    except aiohttp.ClientError:
        await _say_end(page, session)
        return page

    async def up() -> None:
        async for message in page:
            if message.type == WSMsgType.TEXT:
                noted(session, message.data)
                await upstream.send_str(message.data)
            elif message.type == WSMsgType.BINARY:
                await upstream.send_bytes(message.data)

    async def down() -> None:
        async for message in upstream:
            if message.type == WSMsgType.BINARY:
                await page.send_bytes(message.data)
                session.delivered += 1
            elif message.type == WSMsgType.TEXT:
                await page.send_str(message.data)

    ways = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
    ending = asyncio.ensure_future(session.ended.wait())
    try:
        done, _ = await asyncio.wait([*ways, ending], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (*ways, ending):
            task.cancel()
        for task in (*ways, ending):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    page_left = ways[0] in done and not session.ended.is_set()
    await upstream.close()
    if not page_left:
        await _say_end(page, session)
    return page


async def _say_end(page: web.WebSocketResponse, session: Session) -> None:
    """Tell the page why its session ended (an ``error`` message, then a final close)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(END_SAY_S):
            await session.ended.wait()
    why = session.why or "its worker closed the session"
    with contextlib.suppress(Exception):
        await page.send_str(
            json.dumps({"type": "error", "code": "session_ended", "error": f"session ended: {why}"})
        )
        await page.close(code=FINAL_CLOSE, message=b"session ended")
