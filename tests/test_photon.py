"""Mouse-to-photon without a browser: the clock offset, the join of a page's report to its
record, the ``[photon:…]`` line read back by ``load``, and the messages over a real socket."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import struct
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import structlog
from test_web import Session, page

from rxstream.testing import capture_timing
from rxstream.timing import (
    ClientTiming,
    HopTiming,
    TimingRecord,
    configure_logging,
    format_summary,
    load,
    summarize,
)
from rxstream.timing._client import ClockOffset
from rxstream.transport import H264Fragments
from rxstream.transport._photon import PhotonJoin, Shown

# --- the clock offset -------------------------------------------------------------------


def test_clock_offset_takes_the_shortest_round_trip() -> None:
    """Of the exchanges, the one with the shortest round trip gives the offset."""
    clock = ClockOffset()
    assert clock.offset_ms is None
    assert clock.rtt_ms is None
    # the peer's clock is ours + 1000 ms; slow exchanges answered off-centre mislead
    assert clock.add(0.0, 1000.0 + 9.0, 10.0)  # rtt 10, answered at 9: offset 1004
    assert clock.offset_ms == 1004.0
    assert clock.add(20.0, 1000.0 + 20.5, 21.0)  # rtt 1, centred: offset 1000
    assert clock.add(30.0, 1000.0 + 31.0, 36.0)  # rtt 6: loses to rtt 1
    assert clock.offset_ms == 1000.0
    assert clock.rtt_ms == 1.0
    assert clock.to_local(1500.0) == 500.0
    assert clock.samples == 3


def test_clock_offset_forgets_old_exchanges_and_refuses_a_negative_round_trip() -> None:
    """The best of the last ``window`` exchanges wins, so the estimate follows a drift."""
    clock = ClockOffset(window=2)
    clock.add(0.0, 100.5, 1.0)  # rtt 1, offset 100
    clock.add(10.0, 212.0, 14.0)  # rtt 4, offset 200
    assert clock.offset_ms == 100.0
    clock.add(20.0, 223.0, 26.0)  # rtt 6, offset 200: the rtt-1 sample ages out
    assert clock.offset_ms == 200.0
    assert clock.rtt_ms == 4.0
    assert not clock.add(30.0, 0.0, 29.0)
    assert clock.samples == 2


def test_clock_offset_errors_name_the_rule() -> None:
    """No offset before an exchange; the window must be a positive int."""
    with pytest.raises(ValueError, match=r"^no clock offset yet: add\(\) a ping/pong exchange"):
        ClockOffset().to_local(1.0)
    with pytest.raises(ValueError, match=r"^window must be an int >= 1 \(exchanges\), got 0$"):
        ClockOffset(window=0)


# --- the join ---------------------------------------------------------------------------


def record(input_seq: int = 7, total_ms: float = 40.0, stream: str = "video") -> TimingRecord:
    """A record of an input whose server part took ``total_ms``."""
    return TimingRecord(
        stream=stream,
        input_seq=input_seq,
        input_at_ms=1,
        cutover=False,
        prompt_generation=0,
        pts=3,
        origin="input.recv",
        total_ms=total_ms,
        from_client_ms=None,
        hops=(HopTiming("pointer", 0.0, 0.0), HopTiming("video", 0.0, total_ms)),
    )


def synced(offset_ms: float, rtt_ms: float = 0.5) -> ClockOffset:
    """A page clock ``offset_ms`` ahead of the server's, known to ``rtt_ms``."""
    clock = ClockOffset()
    clock.add(0.0, offset_ms + rtt_ms / 2, rtt_ms)
    return clock


def test_a_report_joins_its_record_and_the_hops_add_up() -> None:
    """photon = up + total + net + decode + present; each mapped through the page's offset."""
    join = PhotonJoin()
    # input.recv at server 10.000 s; the page's clock reads 5000 ms more than the server's
    join.sent("video", 12, (("input.recv", 10.0), ("pointer.in", 10.001)))
    join.record(record(total_ms=40.0))  # egress at 10 040 ms
    shown = Shown(
        stream="video",
        seq=12,
        input_seq=7,
        arrived=15_042.0,  # server 10 042: net 2
        decoded=15_045.0,  # decode 3
        presented=15_050.0,  # present 5
        event=14_997.0,  # server 9 997: 3 before input.recv
        video="webcodecs",
    )
    joined = join.shown(shown, synced(5000.0), page=1)
    assert joined is not None
    rec, client = joined
    assert rec.input_seq == 7
    assert client.video == "webcodecs"
    assert client.rtt_ms == 0.5
    parts = (client.photon_ms, client.up_ms, client.net_ms, client.decode_ms, client.present_ms)
    assert parts == pytest.approx((53.0, 3.0, 2.0, 3.0, 5.0))
    assert client.up_ms is not None
    assert client.photon_ms == pytest.approx(
        client.up_ms + rec.total_ms + client.net_ms + client.decode_ms + client.present_ms
    )


def test_a_page_s_repeated_report_joins_once() -> None:
    """The same page reporting the same input again adds no second photon line; another page may."""
    join = PhotonJoin()
    join.sent("video", 12, (("input.recv", 10.0),))
    join.record(record(total_ms=40.0))
    shown = Shown("video", 12, 7, 15_042.0, 15_045.0, 15_050.0)
    assert join.shown(shown, synced(5000.0), page=1) is not None
    assert join.shown(shown, synced(5000.0), page=1) is None
    assert join.shown(shown, synced(5000.0), page=2) is not None


def test_a_report_before_its_record_waits_for_it() -> None:
    """A report that arrives before the sink's record is joined when the record comes."""
    join = PhotonJoin()
    join.sent("video", 1, (("input.recv", 1.0),))
    shown = Shown("video", 1, 7, arrived=1050.0, decoded=1051.0, presented=1060.0)
    assert join.shown(shown, synced(0.0), page=3) is None
    (joined,) = join.record(record(total_ms=45.0))
    _, client, page_number = joined
    assert page_number == 3
    assert client.up_ms is None  # no event: photon counts from input.recv
    assert client.photon_ms == pytest.approx(60.0)
    assert client.net_ms == pytest.approx(5.0)
    assert join.record(record(total_ms=45.0)) == []  # joined once


def test_reports_without_a_clock_or_a_known_frame_join_nothing() -> None:
    """Before the first pong a report is counted and dropped; a forgotten frame joins nothing."""
    join = PhotonJoin(keep=2)
    join.record(record())
    shown = Shown("video", 1, 7, arrived=50.0, decoded=51.0, presented=52.0)
    assert join.shown(shown, ClockOffset()) is None
    assert join.unsynced == 1
    for seq in (1, 2, 3):  # frame 1 is forgotten past keep=2
        join.sent("video", seq, (("input.recv", 0.0),))
    assert join.shown(shown, synced(0.0)) is None
    assert join.shown(Shown("video", 3, 7, 50.0, 51.0, 52.0), synced(0.0)) is not None


def test_an_event_far_from_input_recv_is_not_the_inputs() -> None:
    """An event mapped after input.recv (or long before it) is ignored: photon from recv."""
    join = PhotonJoin()
    join.sent("video", 1, (("input.recv", 1.0),))
    join.record(record(total_ms=10.0))
    late = Shown("video", 1, 7, 1020.0, 1021.0, 1022.0, event=1005.0)
    joined = join.shown(late, synced(0.0, rtt_ms=1.0))
    assert joined is not None
    assert joined[1].up_ms is None
    assert joined[1].photon_ms == pytest.approx(22.0)


# --- the log line and load --------------------------------------------------------------


def write_log(path: Path, lines: list[dict[str, object]]) -> None:
    """``lines`` as a JSON-lines log."""
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")


def timing_line(input_seq: int, total_ms: float) -> dict[str, object]:
    """A ``[timing:video]`` line."""
    return {"event": "[timing:video]", **record(input_seq, total_ms).fields()}


def photon_line(input_seq: int, photon_ms: float, **extra: object) -> dict[str, object]:
    """A ``[photon:video]`` line."""
    client = ClientTiming(photon_ms, 1.0, 2.0, 3.0, up_ms=0.5, rtt_ms=0.4, video="webcodecs")
    return {
        "event": "[photon:video]",
        "stream": "video",
        "input_seq": input_seq,
        **client.fields(),
        **extra,
    }


def test_load_joins_photon_lines_to_their_records(tmp_path: Path) -> None:
    """A photon line joins the latest record with its stream and input_seq; the first wins."""
    log = tmp_path / "t.jsonl"
    write_log(
        log,
        [
            timing_line(1, 40.0),
            timing_line(2, 50.0),
            photon_line(2, 58.0),
            photon_line(2, 99.0, page=2),  # a second page: the first report wins
            photon_line(9, 10.0),  # no record: joined to none, counted under its run
            {"event": "[photon:video]", "stream": "video", "input_seq": 1},
        ],
    )
    loaded = load(log)
    first, second = loaded.records
    assert first.client is None
    assert first.photon_ms is None
    assert second.photon_ms == 58.0
    assert second.client == ClientTiming(58.0, 1.0, 2.0, 3.0, 0.5, 0.4, "webcodecs")
    assert (loaded.other_events, loaded.unjoined) == (0, {"": 1})
    assert [(m.line, m.reason) for m in loaded.malformed] == [
        (6, "photon line without field 'photon_ms'")
    ]
    # the joined record's fields round-trip, client part included
    assert TimingRecord.from_fields(second.fields()) == second


def test_summary_shows_photon_beside_total_only_with_a_page(tmp_path: Path) -> None:
    """summarize/format_summary/to_json gain photon and client hops when a page reported."""
    log = tmp_path / "t.jsonl"
    write_log(log, [timing_line(1, 40.0), timing_line(2, 50.0)])
    plain = summarize(load(log))
    assert "photon" not in plain.to_json()
    assert "photon" not in format_summary(plain)
    write_log(
        log,
        [timing_line(1, 40.0), photon_line(1, 48.0), timing_line(2, 50.0), photon_line(2, 60.0)],
    )
    summary = summarize(load(log))
    assert summary.shown == 2
    assert summary.photon_ms == {"p50": 54.0, "p95": 59.4, "p99": pytest.approx(59.88), "max": 60.0}
    assert summary.to_json()["client"]["net"] == {"p50": 1.0, "p95": 1.0, "p99": 1.0}
    text = format_summary(summary)
    assert "photon (input to pixels, 2 shown by a page): p50 54.00  p95 59.40" in text
    assert "client p50: up 0.50  net 1.00  decode 2.00  present 3.00" in text


# --- over the socket --------------------------------------------------------------------


def test_a_page_that_answers_pings_and_reports_gets_photon(tmp_path: Path) -> None:
    """pong sets the page's clock; a shown report comes back as a photon message and line."""
    log = tmp_path / "t.jsonl"
    saved = structlog.get_config()
    configure_logging(log)

    async def check(session: Session) -> dict[str, object]:
        async with page(session.web.url) as ws:
            await ws.text("session")
            ping = await ws.text("ping")
            # the page's clock reads 1000 ms more than the server's (answered at once)
            await ws.send({"type": "pong", "t": ping["t"], "c": ping["t"] + 1000.0})
            await ws.send({"type": "input", "stream": "pointer", "sample": [1.0, 0.0], "id": 1})
            assert (await ws.text("ack"))["input_seq"] == 1
            header, _ = await ws.frame()
            assert header["input"] == "pointer"
            record = (await ws.text("timing"))["record"]
            loop = asyncio.get_running_loop()
            now = loop.time() * 1e3 + 1000.0  # asyncio's clock is time.monotonic()
            await ws.send(
                {
                    "type": "shown",
                    "stream": "video",
                    "seq": header["seq"],
                    "input_seq": header["input_seq"],
                    "arrived": now,
                    "decoded": now + 1.0,
                    "presented": now + 2.0,
                    "event": None,
                    "video": "jpeg",
                }
            )
            photon = await ws.text("photon")
            assert photon["input_seq"] == 1
            assert photon["total_ms"] == record["total_ms"]
            return photon

    try:
        with capture_timing(), Session() as running:
            photon = asyncio.run(check(running))
    finally:
        configure_logging()
        structlog.reset_defaults()
        structlog.configure(**saved)
    assert photon["decode_ms"] == 1.0
    assert photon["present_ms"] == 1.0
    assert photon["up_ms"] is None
    assert isinstance(photon["photon_ms"], float)
    assert photon["photon_ms"] >= photon["total_ms"]  # type: ignore[operator]
    (joined,) = load(log, stream="video").records
    assert joined.photon_ms == photon["photon_ms"]
    assert joined.client is not None
    assert joined.client.video == "jpeg"


@pytest.mark.parametrize(
    ("message", "named"),
    [
        ({"type": "pong", "t": 12.5, "c": 1.0}, "pong.t must be the t of a recent ping, got 12.5"),
        ({"type": "pong", "t": "x", "c": 1.0}, "pong.t must be a finite number, got 'x'"),
        (
            {"type": "shown", "stream": "video", "seq": 1, "input_seq": 1, "arrived": 3,
             "decoded": 2, "presented": 4},
            "shown times must be in order arrived <= decoded <= presented, got 3.0, 2.0, 4.0",
        ),
        (
            {"type": "shown", "stream": "video", "seq": -1, "input_seq": 1, "arrived": 1,
             "decoded": 2, "presented": 4, "video": "jpeg"},
            "shown.seq must be an int >= 0, got -1",
        ),
        (
            {"type": "shown", "stream": "video", "seq": 1, "input_seq": 1, "arrived": 1,
             "decoded": 2, "presented": math.inf},
            "numbers must be finite, got '1e999'",  # the session's guard, before the handler
        ),
        (
            {"type": "keyframe", "stream": "audio"},
            "keyframe.stream must be one of video, got 'audio'",
        ),
    ],
)  # fmt: skip
def test_bad_reports_are_refused_naming_the_field(message: dict[str, object], named: str) -> None:
    """A malformed pong, shown or keyframe message is answered with an error naming it."""

    async def check(session: Session) -> str:
        async with page(session.web.url) as ws:
            await ws.text("session")
            await ws.send(json.dumps(message).replace("Infinity", "1e999"))
            return str((await ws.text("error"))["error"])

    with Session() as running:
        assert asyncio.run(check(running)) == named


def test_webcodecs_pages_get_access_units_and_a_keyframe_on_request() -> None:
    """An h264-au page gets AVC access units, config on keyframes; ``keyframe`` forces one."""

    async def check(session: Session) -> list[tuple[dict[str, object], bytes]]:
        frames = []
        async with page(session.web.url, ("h264", "h264-au")) as ws:
            await ws.text("session")
            for i in range(4):
                if i == 2:  # read before the next input: that frame is an IDR
                    await ws.send({"type": "keyframe", "stream": "video"})
                sample = {"type": "input", "stream": "pointer", "sample": [i / 4, 0]}
                await ws.send(sample)
                frames.append(await ws.frame())
        return frames

    with Session("h264") as running:
        frames = asyncio.run(check(running))
    assert [h["key"] for h, _ in frames] == [True, False, True, False]
    assert all(h["format"] == "avc" and h["codec"] == "h264" for h, _ in frames)
    config = frames[0][0]["config"]
    assert isinstance(config, dict)
    assert str(config["codec"]).startswith("avc1.")
    assert "config" not in frames[1][0]
    avcc = base64.b64decode(str(config["description"]))
    assert avcc[0] == 1  # AVCDecoderConfigurationRecord version
    for _, unit in frames:  # 4-byte length-prefixed NAL units, end to end
        at = 0
        while at < len(unit):
            (size,) = struct.unpack_from(">I", unit, at)
            at += 4 + size
        assert at == len(unit)


def test_access_units_decode_with_their_description() -> None:
    """H264Fragments.access_unit with .avcc as extradata decodes back to the frames."""
    import av

    encoder = H264Fragments(fps=24, stream="video")
    decoder = av.CodecContext.create("h264", "r")
    decoded = []
    for value in (0, 128, 255):
        encoder.encode(np.full((32, 48, 3), value, dtype=np.uint8))
        if decoder.extradata is None:
            assert encoder.avcc is not None
            decoder.extradata = encoder.avcc
        decoded += decoder.decode(av.Packet(encoder.access_unit))
    decoded += decoder.decode(None)
    encoder.close()
    assert [(f.width, f.height) for f in decoded] == [(48, 32)] * 3
    means = [int(f.to_ndarray(format="rgb24").mean()) for f in decoded]
    assert means[0] < 10
    assert abs(means[1] - 128) < 10
    assert means[2] > 245


def test_the_session_declines_permessage_deflate_that_a_browser_offers() -> None:
    """A browser offers deflate; the socket declines it (frames are compressed codecs already)."""

    async def check(url: str) -> int:
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(
                url.replace("http", "ws", 1).replace("/?", "/ws?", 1), compress=15
            ) as ws,
        ):
            return ws.compress

    with Session() as running:
        assert asyncio.run(check(running.web.url)) == 0


def test_a_page_gets_a_frame_before_the_texts_queued_with_it() -> None:
    """Frames go before queued texts: a frame's timing record never delays the frame."""
    from rxstream.transport import SessionLimits, WebTransport
    from rxstream.transport._wsserver import SocketLink

    class Socket:
        """What the writer uses of a websocket: it records what was sent, then closes."""

        def __init__(self) -> None:
            self.sent: list[str] = []
            self.closed = False

        async def send_str(self, text: str) -> None:
            self.sent.append("text")

        async def send_bytes(self, data: bytes) -> None:
            self.sent.append("frame")
            self.closed = True  # the writer's loop ends after this round

    async def write() -> list[str]:
        socket = Socket()
        link = SocketLink(
            socket,  # type: ignore[arg-type]
            peer="test",
            frames=4,
            limits=SessionLimits(),
            loop=asyncio.get_running_loop(),
            transport=None,
        )
        link.send_text('{"type": "timing"}', "timing")  # queued together, text first
        link.send_frame("video", b"F")
        await asyncio.wait_for(WebTransport(port=0).server._write(link), 5)
        return socket.sent

    assert asyncio.run(write()) == ["frame", "text"]
