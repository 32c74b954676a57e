"""Egress codecs (raw, jpeg, h264 fragments), the MP4 file transport and the tee."""

from __future__ import annotations

import io
import re
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import torch
from PIL import Image

import rxstream
from rxstream import PipelineStateError
from rxstream.item import PipelineItem, PipelineMetadata
from rxstream.timing import TimingRecord
from rxstream.transport import (
    CodecError,
    FileTransport,
    H264Fragments,
    JpegEncoder,
    MemoryTransport,
    RawEncoder,
    Session,
    Tee,
    Transport,
    decode_raw,
    encoder,
    to_rgb24,
)

H, W = 48, 64


def gradient(index: int = 0, height: int = H, width: int = W) -> np.ndarray:
    """A smooth HWC uint8 frame that moves with ``index`` (codecs keep it close)."""
    ys = np.linspace(0, 1, height)[:, None]
    xs = np.linspace(0, 1, width)[None, :]
    red = np.broadcast_to((xs + index / 10) % 1.0, (height, width))
    green = np.broadcast_to(ys, (height, width))
    blue = np.full((height, width), 0.5)
    return (np.stack([red, green, blue], axis=-1) * 255).round().astype(np.uint8)


def item(payload: Any, pts: int = 0) -> PipelineItem:
    return PipelineItem(payload, PipelineMetadata(pts=pts))


def decode_all(data: bytes | Path) -> list[np.ndarray]:
    """Every frame PyAV decodes from an MP4 (bytes or a file), as HWC RGB."""
    source = io.BytesIO(data) if isinstance(data, bytes) else str(data)
    with av.open(source, mode="r") as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def box_types(data: bytes) -> list[str]:
    """The types of the top-level ISO BMFF boxes laid end to end in ``data``."""
    types, at = [], 0
    while at < len(data):
        size, kind = struct.unpack_from(">I4s", data, at)
        types.append(kind.decode())
        at += size
    assert at == len(data)
    return types


# --- to_rgb24 ---------------------------------------------------------------------------------

FRAME = gradient()
RGBA = np.concatenate([FRAME, np.full((H, W, 1), 7, np.uint8)], axis=-1)
GRAY = FRAME[:, :, 1]


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        pytest.param(FRAME.astype(np.float32) / 255, FRAME, id="hwc-float32"),
        pytest.param(FRAME.transpose(2, 0, 1).copy(), FRAME, id="chw-uint8"),
        pytest.param(FRAME.transpose(2, 0, 1) / 255.0, FRAME, id="chw-float64"),
        pytest.param(RGBA, FRAME, id="hwc-rgba-alpha-dropped"),
        pytest.param(RGBA.transpose(2, 0, 1), FRAME, id="chw-rgba"),
        pytest.param(GRAY, np.repeat(GRAY[:, :, None], 3, axis=2), id="hw-gray"),
        pytest.param(GRAY[:, :, None], np.repeat(GRAY[:, :, None], 3, axis=2), id="hwc-gray"),
        pytest.param(GRAY[None] / 255.0, np.repeat(GRAY[:, :, None], 3, axis=2), id="chw-gray"),
        pytest.param(FRAME[:, ::2], FRAME[:, ::2], id="strided"),
        pytest.param(torch.from_numpy(FRAME), FRAME, id="torch-hwc-uint8"),
        pytest.param(torch.from_numpy(FRAME).permute(2, 0, 1) / 255.0, FRAME, id="torch-chw-float"),
        pytest.param(
            (torch.from_numpy(FRAME).permute(2, 0, 1) / 255.0).half(), FRAME, id="torch-chw-half"
        ),
        pytest.param(
            torch.from_numpy(FRAME / 255.0).requires_grad_(), FRAME, id="torch-requires-grad"
        ),
    ],
)
def test_to_rgb24_reads_layouts_and_dtypes(payload: Any, expected: np.ndarray) -> None:
    """numpy/torch, HW/HWC/CHW, 1/3/4 channels, uint8 or float all become contiguous HWC RGB."""
    rgb = to_rgb24(payload, stream="video")
    assert rgb.dtype == np.uint8
    assert rgb.flags.c_contiguous
    assert rgb.shape == (*expected.shape[:2], 3)
    # half precision rounds a little; every other path is exact
    assert np.abs(rgb.astype(int) - expected).max() <= 1


def test_to_rgb24_clamps_floats_and_reads_nan_as_zero() -> None:
    """Floats a little outside [0, 1] clamp to 0 or 255, NaN reads as 0, infinities as 0 or
    255, 0.5 rounds to 128 (further outside is refused: tests/test_payload_checks.py)."""
    values = np.array([[[-0.04, 1.04, np.nan], [0.5, np.inf, -np.inf]]])
    assert to_rgb24(values, stream="v").tolist() == [[[0, 255, 0], [128, 255, 0]]]
    tensor = torch.from_numpy(values).permute(2, 0, 1)
    assert to_rgb24(tensor, stream="v").tolist() == [[[0, 255, 0], [128, 255, 0]]]


def test_to_rgb24_returns_a_ready_frame_as_is() -> None:
    """A contiguous HWC uint8 RGB array is passed through, not copied."""
    assert to_rgb24(FRAME, stream="video") is FRAME


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: no GPU here")
def test_to_rgb24_moves_a_cuda_tensor_to_the_cpu() -> None:
    """A CUDA float CHW tensor comes back as the same CPU uint8 frame."""
    tensor = (torch.from_numpy(FRAME).permute(2, 0, 1) / 255.0).cuda()
    assert np.array_equal(to_rgb24(tensor, stream="video"), FRAME)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (
            "frame",
            "stream 'video': a frame must be a numpy array or a torch tensor, got str",
        ),
        (
            np.zeros((2, 4, 4, 3), np.uint8),
            "stream 'video': a frame must be HW, HWC or CHW with 1, 3 or 4 channels and no "
            "empty axis, got shape (2, 4, 4, 3)",
        ),
        (
            np.zeros((5, 6, 7), np.uint8),
            "stream 'video': a frame must be HW, HWC or CHW with 1, 3 or 4 channels and no "
            "empty axis, got shape (5, 6, 7)",
        ),
        (
            np.zeros((0, 4, 3), np.uint8),
            "stream 'video': a frame must be HW, HWC or CHW with 1, 3 or 4 channels and no "
            "empty axis, got shape (0, 4, 3)",
        ),
        (
            np.zeros((4, 4, 3), np.int32),
            "stream 'video': a frame's dtype must be uint8 or floating point (read as [0, 1]), "
            "got int32",
        ),
        (
            np.zeros((4, 4), bool),
            "stream 'video': a frame's dtype must be uint8 or floating point (read as [0, 1]), "
            "got bool",
        ),
        (
            torch.zeros(3, 4, 4, dtype=torch.int64),
            "stream 'video': a frame's dtype must be uint8 or floating point (read as [0, 1]), "
            "got torch.int64",
        ),
    ],
    ids=["type", "4d", "channels", "empty", "int32", "bool", "torch-int64"],
)
def test_to_rgb24_refuses_what_is_not_a_frame(payload: Any, message: str) -> None:
    """Anything but a 1/3/4-channel uint8 or float image is a CodecError naming stream and rule."""
    with pytest.raises(CodecError, match=f"^{re.escape(message)}$"):
        to_rgb24(payload, stream="video")


def test_codec_error_is_an_rxstream_value_error() -> None:
    """CodecError sits under RxStreamError and ValueError."""
    assert issubclass(CodecError, rxstream.RxStreamError)
    assert issubclass(CodecError, ValueError)


# --- raw and jpeg -----------------------------------------------------------------------------


def test_raw_is_an_8_byte_header_then_rgb_rows() -> None:
    """raw: uint16 width, uint16 height, uint8 3, three zero bytes, then the RGB bytes."""
    frame = gradient(height=5, width=7)
    data = RawEncoder(stream="video").encode(frame)
    assert data[:8] == struct.pack("<HHB", 7, 5, 3) + b"\0\0\0"
    assert RawEncoder.HEADER.size == 8
    assert data[8:] == frame.tobytes()


@pytest.mark.parametrize("payload", [gradient(3), gradient(3).transpose(2, 0, 1) / 255.0])
def test_raw_round_trips_through_decode_raw(payload: np.ndarray) -> None:
    """decode_raw(encode(frame)) is the frame's RGB24 form."""
    data = RawEncoder(stream="video").encode(payload)
    assert np.array_equal(decode_raw(data), gradient(3))


def test_raw_refuses_a_frame_its_header_cannot_hold() -> None:
    """A side over 65535 pixels does not fit the uint16 header: a CodecError with the size."""
    message = (
        "stream 'video': a raw frame's width and height must be at most 65535 "
        "(its header holds uint16s), got 65536x1"
    )
    with pytest.raises(CodecError, match=f"^{re.escape(message)}$"):
        RawEncoder(stream="video").encode(np.zeros((1, 65536), np.uint8))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x01\x00", "a raw frame starts with a 8-byte header, got 2 bytes"),
        (
            struct.pack("<HHB3x", 2, 2, 3) + bytes(11),
            "a raw frame must be its header then width*height*3 bytes: header says 2x2x3 "
            "(20 bytes in all), got 19 bytes",
        ),
    ],
)
def test_decode_raw_refuses_a_truncated_frame(data: bytes, message: str) -> None:
    """A raw message shorter or longer than its header says is a CodecError with both sizes."""
    with pytest.raises(CodecError, match=f"^{re.escape(message)}$"):
        decode_raw(data)


def test_jpeg_decodes_to_the_frame() -> None:
    """jpeg: Pillow decodes each message to the frame's size and close pixels."""
    frame = gradient(2)
    data = JpegEncoder(stream="video", quality=90).encode(frame)
    assert data[:2] == b"\xff\xd8"
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == "JPEG"
        assert image.size == (W, H)
        pixels = np.asarray(image.convert("RGB")).astype(int)
    assert np.abs(pixels - frame).mean() < 3


def test_jpeg_quality_changes_the_size() -> None:
    """A lower quality makes a smaller image."""
    frame = np.random.default_rng(0).integers(0, 256, (H, W, 3), dtype=np.uint8)
    low = JpegEncoder(stream="v", quality=10).encode(frame)
    high = JpegEncoder(stream="v", quality=95).encode(frame)
    assert len(low) < len(high)


@pytest.mark.parametrize("quality", [0, 101, 50.0])
def test_jpeg_refuses_a_bad_quality(quality: Any) -> None:
    """quality must be an int from 1 to 100."""
    message = f"stream 'video': jpeg quality must be an int from 1 to 100, got {quality!r}"
    with pytest.raises(CodecError, match=f"^{re.escape(message)}$"):
        JpegEncoder(stream="video", quality=quality)


@pytest.mark.parametrize(
    ("codec", "kind"),
    [(None, RawEncoder), ("raw", RawEncoder), ("jpeg", JpegEncoder), ("h264", H264Fragments)],
)
def test_encoder_makes_each_codecs_encoder(codec: str | None, kind: type) -> None:
    """encoder() maps None/raw, jpeg and h264 to their encoder, which knows its stream."""
    made = encoder(codec, fps=24, stream="video")
    assert type(made) is kind
    assert made.stream == "video"
    assert made.codec == (codec or "raw")
    assert made.close() == b""


def test_encoder_refuses_an_unknown_codec() -> None:
    """An unknown codec name is a CodecError listing the codecs."""
    message = "stream 'video': codec must be one of raw, jpeg, h264 (or None: raw), got 'vp9'"
    with pytest.raises(CodecError, match=f"^{re.escape(message)}$"):
        encoder("vp9", fps=24, stream="video")


# --- h264 fragments ---------------------------------------------------------------------------


def fragments(count: int, **options: Any) -> tuple[H264Fragments, list[bytes]]:
    """An h264 encoder and what each encode (then close) returned for ``count`` frames."""
    h264 = H264Fragments(fps=24, stream="video", **options)
    outputs = [h264.encode(gradient(index)) for index in range(count)]
    outputs.append(h264.close())
    return h264, outputs


def test_h264_fragments_decode_to_every_frame() -> None:
    """The concatenated fragments decode with PyAV to N frames of the size, close to the input."""
    _, outputs = fragments(12)
    frames = decode_all(b"".join(outputs))
    assert len(frames) == 12
    for index, frame in enumerate(frames):
        assert frame.shape == (H, W, 3)
        assert np.abs(frame.astype(int) - gradient(index)).mean() < 6


def test_h264_first_call_is_the_init_segment_then_one_fragment_per_call() -> None:
    """Call 1 returns ftyp+moov+moof+mdat; each later call exactly its own frame's moof+mdat."""
    h264, outputs = fragments(5)
    init = h264.init_segment
    assert init is not None
    assert box_types(init) == ["ftyp", "moov"]
    assert outputs[0].startswith(init)
    assert box_types(outputs[0]) == ["ftyp", "moov", "moof", "mdat"]
    assert [box_types(out) for out in outputs[1:5]] == [["moof", "mdat"]] * 4
    assert outputs[5] == b""  # nothing held back: no frame of latency
    assert h264.frames == 5


def test_h264_init_segment_names_its_codec() -> None:
    """codec_string is avc1.PPCCLL from the init segment's avcC; None before the first frame."""
    h264 = H264Fragments(fps=24, stream="video")
    assert (h264.init_segment, h264.codec_string, h264.mime_type, h264.size) == (None,) * 4
    h264.encode(gradient())
    init = h264.init_segment
    assert init is not None
    codec = h264.codec_string
    assert codec is not None
    assert re.fullmatch(r"avc1\.[0-9A-F]{6}", codec)
    avcc = init[init.index(b"avcC") + 4 :]
    assert codec == "avc1." + avcc[1:4].hex().upper()
    assert h264.mime_type == f'video/mp4; codecs="{codec}"'
    assert h264.size == (W, H)
    with av.open(io.BytesIO(init)) as container:
        stream = container.streams.video[0]
        assert (stream.codec_context.name, stream.width, stream.height) == ("h264", W, H)
    h264.close()


def test_h264_keyframes_every_interval_and_on_request() -> None:
    """An IDR every keyframe_interval frames, and on the frame after request_keyframe()."""
    h264 = H264Fragments(fps=24, stream="video", keyframe_interval=6)
    keys = []
    for index in range(14):
        if index == 3:
            h264.request_keyframe()
        h264.encode(gradient(index))
        keys.append(h264.keyframe)
    h264.close()
    assert [i for i, key in enumerate(keys) if key] == [0, 3, 9]


def test_h264_late_joiner_decodes_from_a_keyframe() -> None:
    """The init segment plus the fragments from a keyframe on decode on their own."""
    h264, outputs = fragments(12, keyframe_interval=5)
    assert h264.init_segment is not None
    frames = decode_all(h264.init_segment + b"".join(outputs[5:]))
    assert len(frames) == 7
    assert np.abs(frames[0].astype(int) - gradient(5)).mean() < 6


def test_h264_pads_an_odd_size_to_even() -> None:
    """A 33x25 frame decodes as 34x26, its last column and row repeated."""
    frame = gradient(height=25, width=33)
    frame[:, -1] = (250, 10, 10)
    h264 = H264Fragments(fps=24, stream="video")
    data = h264.encode(frame) + h264.encode(frame) + h264.close()
    assert h264.size == (33, 25)
    decoded = decode_all(data)
    assert [f.shape for f in decoded] == [(26, 34, 3)] * 2
    assert np.abs(decoded[0][:, -1].astype(int) - (250, 10, 10)).mean() < 20


def test_h264_refuses_a_frame_of_another_size() -> None:
    """A frame whose size differs from the first is a CodecError naming both sizes."""
    h264 = H264Fragments(fps=24, stream="video")
    h264.encode(gradient())
    message = (
        "stream 'video': every h264 frame must have the first frame's size 64x48 (WxH), got 32x48"
    )
    with pytest.raises(CodecError, match=f"^{re.escape(message)}$"):
        h264.encode(gradient(width=32))
    h264.close()


def test_h264_close_is_idempotent_and_ends_encoding() -> None:
    """close() twice returns b"" the second time; encode() after it is a CodecError."""
    h264 = H264Fragments(fps=24, stream="video")
    h264.encode(gradient())
    h264.close()
    assert h264.close() == b""
    message = "stream 'video': encode() after close() on its h264 encoder"
    with pytest.raises(CodecError, match=f"^{re.escape(message)}$"):
        h264.encode(gradient())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"fps": 0}, "stream 'video': fps must be > 0 and <= 1000, got 0"),
        (
            {"fps": 24, "keyframe_interval": 0},
            "stream 'video': keyframe_interval must be an int >= 1 (frames), got 0",
        ),
    ],
)
def test_h264_refuses_bad_options(options: dict[str, Any], message: str) -> None:
    """fps and keyframe_interval are checked when the encoder is made."""
    with pytest.raises(CodecError, match=f"^{re.escape(message)}$"):
        H264Fragments(stream="video", **options)


def test_h264_timestamps_follow_fps() -> None:
    """Frame i is presented at i / fps seconds."""
    h264 = H264Fragments(fps=10, stream="video")
    data = b"".join(h264.encode(gradient(i)) for i in range(4)) + h264.close()
    with av.open(io.BytesIO(data), mode="r") as container:
        times = [frame.time for frame in container.decode(video=0)]
    assert times == pytest.approx([0.0, 0.1, 0.2, 0.3])


# --- the file transport -----------------------------------------------------------------------


def frames_source(count: int) -> Iterator[np.ndarray]:
    for index in range(count):
        yield gradient(index)


@pytest.mark.parametrize("codec", ["h264", "jpeg"])
def test_file_transport_writes_a_playable_mp4_from_a_threaded_run(
    tmp_path: Path, codec: str
) -> None:
    """A threaded run of 20 frames leaves an MP4 that decodes to exactly 20 frames of its size."""
    path = tmp_path / "out" / "video.mp4"
    ctx = rxstream.Context(transport=FileTransport(path, fps=20))
    pipeline = ctx.source(frames_source(20)) | ctx.stream("video", codec=codec)
    pipeline.start()
    assert pipeline.wait(timeout=60)
    frames = decode_all(path)
    assert len(frames) == 20
    assert {frame.shape for frame in frames} == {(H, W, 3)}
    assert np.abs(frames[7].astype(int) - gradient(7)).mean() < 6
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert container.format.name.startswith("mov,mp4")
        assert stream.codec_context.name == "h264"
        assert stream.average_rate == 20
        duration, time_base = stream.duration, stream.time_base
        assert duration is not None
        assert time_base is not None
        assert duration * time_base == 1  # 20 frames at 20 fps


_CUT_SHORT = """
import os, sys
import numpy as np
from rxstream.item import PipelineItem, PipelineMetadata
from rxstream.transport import FileTransport
transport = FileTransport(sys.argv[1], fps=20)
for index in range(50):
    frame = np.full((48, 64, 3), index * 5, dtype=np.uint8)
    transport.send("video", PipelineItem(frame, PipelineMetadata(pts=index)))
os._exit(0)  # killed: no close(), no trailer
"""


def test_a_file_cut_short_plays_up_to_its_last_fragment(tmp_path: Path) -> None:
    """A process that dies without close() leaves an MP4 whose whole fragments decode."""
    path = tmp_path / "cut.mp4"
    subprocess.run([sys.executable, "-c", _CUT_SHORT, str(path)], check=True, timeout=60)
    frames = decode_all(path)
    assert len(frames) >= 40  # 50 written, a fragment a second (20 frames): two complete
    assert {frame.shape for frame in frames} == {(48, 64, 3)}


def test_file_transport_takes_torch_frames_and_pads_odd_sizes(tmp_path: Path) -> None:
    """CHW float tensors of 33x25 are written as 34x26 h264 frames."""
    transport = FileTransport(tmp_path / "odd.mp4")
    transport.open(Session(streams={"video": "raw"}))
    frame = torch.from_numpy(gradient(height=25, width=33)).permute(2, 0, 1) / 255.0
    for pts in range(3):
        transport.send("video", item(frame, pts))
    transport.close()
    assert transport.frames == 3
    assert [f.shape for f in decode_all(tmp_path / "odd.mp4")] == [(26, 34, 3)] * 3


def test_file_transport_refuses_a_frame_of_another_size(tmp_path: Path) -> None:
    """A later frame of another size is a CodecError naming the stream and both sizes."""
    transport = FileTransport(tmp_path / "v.mp4")
    transport.send("video", item(gradient()))
    message = (
        "stream 'video': every h264 frame must have the first frame's size 64x48 (WxH), got 64x40"
    )
    with pytest.raises(CodecError, match=f"^{re.escape(message)}$"):
        transport.send("video", item(gradient(height=40)))
    transport.close()
    assert len(decode_all(tmp_path / "v.mp4")) == 1


def test_file_transport_writes_only_its_stream(tmp_path: Path) -> None:
    """With stream= named, items of other streams are ignored."""
    transport = FileTransport(tmp_path / "v.mp4", stream="video")
    transport.open(Session(streams={"video": "h264", "preview": "jpeg"}))
    for pts in range(4):
        transport.send("preview", item(gradient(height=10), pts))
        transport.send("video", item(gradient(pts), pts))
    transport.close()
    assert transport.stream == "video"
    assert len(decode_all(tmp_path / "v.mp4")) == 4


def test_file_transport_needs_a_stream_name_when_the_session_has_several(tmp_path: Path) -> None:
    """stream=None with two streams, or a name the session lacks, is refused at open()."""
    session = Session(streams={"video": "h264", "preview": "jpeg"})
    message = (
        "FileTransport(stream=None) writes the session's only stream, but it has 2: "
        "'preview', 'video'; pass stream="
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        FileTransport(tmp_path / "v.mp4").open(session)
    message = (
        "FileTransport stream must be one of the session's streams ('preview', 'video'), "
        "got 'audio'"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        FileTransport(tmp_path / "v.mp4", stream="audio").open(session)


def test_file_transport_close_is_idempotent_and_final(tmp_path: Path) -> None:
    """close() twice is fine, a send after it is dropped, and a closed transport won't reopen."""
    path = tmp_path / "v.mp4"
    transport = FileTransport(path)
    assert transport.connected
    transport.close()
    assert not path.exists()  # no frame, no file
    transport.send("video", item(gradient()))
    transport.close()
    assert transport.frames == 0
    with pytest.raises(PipelineStateError, match=r"^FileTransport\('.*v\.mp4'\) is closed"):
        transport.open(Session(streams={"video": "raw"}))


def test_file_transport_refuses_a_bad_fps(tmp_path: Path) -> None:
    """fps must be positive."""
    message = "FileTransport: fps must be > 0 and <= 1000, got -1"
    with pytest.raises(CodecError, match=f"^{re.escape(message)}$"):
        FileTransport(tmp_path / "v.mp4", fps=-1)


# --- tee --------------------------------------------------------------------------------------


class Failing(MemoryTransport):
    """A memory transport whose send and close raise after recording the call."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def send(self, stream: str, item: PipelineItem) -> None:
        super().send(stream, item)
        raise RuntimeError("send failed")

    def close(self) -> None:
        self.closed = True
        raise RuntimeError("close failed")


class Recording(MemoryTransport):
    """A memory transport that records open, timing and close calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def open(self, session: Session) -> None:
        self.calls.append(f"open {sorted(session.streams)}")

    def on_timing(self, record: TimingRecord) -> None:
        self.calls.append(f"timing {record.stream}")

    def close(self) -> None:
        self.calls.append("close")


def test_tee_fans_a_threaded_run_out_to_every_transport() -> None:
    """Every transport of a tee gets open, every item and close."""
    first, second = Recording(), Recording()
    ctx = rxstream.Context(transport=Tee(first, second))
    pipeline = ctx.source(range(5)) | ctx.stream("out")
    pipeline.start()
    assert pipeline.wait(timeout=30)
    for transport in (first, second):
        assert transport.payloads("out") == [0, 1, 2, 3, 4]
        assert transport.calls[0] == "open ['out']"
        assert transport.calls[-1] == "close"


def test_tee_hands_timing_records_to_every_transport() -> None:
    """on_timing reaches each transport of the tee."""
    first, second = Recording(), Recording()
    record = TimingRecord(
        stream="video",
        input_seq=1,
        input_at_ms=0,
        cutover=False,
        prompt_generation=0,
        pts=0,
        origin="input.recv",
        total_ms=1.0,
        from_client_ms=None,
        hops=(),
    )
    Tee(first, second).on_timing(record)
    assert first.calls == second.calls == ["timing video"]


def test_tee_is_connected_while_its_primary_is() -> None:
    """connected follows the primary, not the others."""
    primary, other = MemoryTransport(), MemoryTransport()
    tee = Tee(primary, other)
    other.disconnect()
    assert tee.connected
    primary.disconnect()
    assert not tee.connected
    assert tee.transports == (primary, other)


def test_tee_calls_every_transport_even_when_one_raises() -> None:
    """A failing transport does not keep the call from the next; its error is raised after."""
    failing, after = Failing(), Recording()
    tee = Tee(failing, after)
    with pytest.raises(RuntimeError, match=r"^send failed$"):
        tee.send("out", item(1))
    with pytest.raises(RuntimeError, match=r"^close failed$"):
        tee.close()
    assert after.payloads("out") == [1]
    assert failing.closed
    assert after.calls == ["close"]


def test_tee_takes_only_transports() -> None:
    """A tee of something that is not a Transport is a TypeError naming its type."""
    with pytest.raises(TypeError, match=r"^Tee takes Transport instances, got str$"):
        Tee(MemoryTransport(), "file.mp4")  # type: ignore[arg-type]


def test_transport_subclasses_are_transports() -> None:
    """FileTransport and Tee are Transports, so a Context takes them."""
    assert issubclass(FileTransport, Transport)
    assert issubclass(Tee, Transport)


def test_a_web_session_imports_its_codecs_when_it_opens_not_at_the_first_frame() -> None:
    """WebTransport.open preloads PyAV and Pillow's JPEG plugin, sparing the first frame's sink."""
    script = """
import sys
from rxstream.transport import Session, WebTransport
assert "av" not in sys.modules and "PIL.JpegImagePlugin" not in sys.modules
web = WebTransport(port=0)
web.open(Session(streams={"video": "h264"}))
try:
    print("loaded:", "av" in sys.modules, "PIL.JpegImagePlugin" in sys.modules)
finally:
    web.close()
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = [line for line in done.stdout.splitlines() if line.startswith("loaded:")]
    assert loaded == ["loaded: True True"], done.stdout + done.stderr
