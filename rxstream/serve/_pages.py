"""The front's own small pages: the queue (a place that updates), a session's end, "full"."""

from __future__ import annotations

import html
import json

__all__ = ["ended_page", "full_page", "queue_page"]

_STYLE = (
    "body{font:16px system-ui,sans-serif;background:#111;color:#ddd;margin:3em auto;"
    "max-width:36em}b{color:#fff}#why{color:#e88}"
)


def _page(title: str, body: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{_STYLE}</style></head><body>{body}</body></html>"
    )


def queue_page(ticket: str, place: int) -> str:
    """The page a visitor waits on: their place, asked for every half second at
    ``/q/<ticket>/state``; sent on to their session once a worker is free."""
    state = json.dumps(f"/q/{ticket}/state")
    script = (
        "<script>const el=document.getElementById('place');"
        "async function poll(){try{const r=await fetch(" + state + ",{cache:'no-store'});"
        "if(r.status===404){el.textContent='gone (reload to queue again)';return;}"
        "const s=await r.json();if(s.url){location.replace(s.url);return;}"
        "el.textContent=s.place;window.rxstreamQueue=s;}catch(e){}setTimeout(poll,500);}"
        "poll();</script>"
    )
    return _page(
        "rxstream: waiting for a worker",
        "<p>Every worker is busy. You are number <b id=place>"
        f"{place}</b> in the queue; this page moves on to your session when one is free.</p>"
        + script,
    )


def ended_page(why: str) -> str:
    """What a visitor sees at an ended session's address."""
    return _page(
        "rxstream: session ended",
        f'<p>session ended: <span id="why">{html.escape(why)}</span></p>'
        '<p><a href="javascript:history.back()">Back</a>, or open the server\'s link again '
        "for a new session.</p>",
    )


def full_page(retry_s: int) -> str:
    """What a visitor sees when every worker is busy and the queue is full."""
    return _page(
        "rxstream: full",
        f"<p>Every worker is busy and the queue is full; try again in {retry_s} s.</p>",
    )
