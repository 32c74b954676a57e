"""The encoders' rate knobs: h264's bounded bitrate changed on the fly, jpeg quality and the
resolution a rate controller lowers."""

from __future__ import annotations

import io
import re

import av
import numpy as np
import pytest
from PIL import Image

from rxstream.transport import CodecError, H264Fragments, JpegEncoder
from rxstream.transport._codecs import VBV_FRAMES, downscale, scaled_size

FPS = 24
H, W = 240, 320
_TEXTURE = np.random.default_rng(7).integers(0, 256, (2 * H, 2 * W, 3), dtype=np.uint8)


def moving(index: int) -> np.ndarray:
    """A frame of a noisy texture panning 3 px a frame: hard to compress, so the rate binds."""
    y, x = index % H, (3 * index) % W
    return np.ascontiguousarray(_TEXTURE[y : y + H, x : x + W])


def target_bytes(kbps: float) -> float:
    return kbps * 1000 / 8 / FPS


def encode_run(h264: H264Fragments, start: int, count: int) -> list[tuple[int, bool, bool]]:
    """``count`` frames from ``start``: each access unit's size, keyframe, new_config."""
    out = []
    for index in range(start, start + count):
        h264.encode(moving(index))
        out.append((len(h264.access_unit), h264.keyframe, h264.new_config))
    return out


def mean_size(run: list[tuple[int, bool, bool]]) -> float:
    return sum(size for size, _, _ in run) / len(run)


def decode_units(units: list[bytes], avcc: bytes) -> list[np.ndarray]:
    """Decode AVC access units with ``avcc`` as the decoder's config, as a WebCodecs page."""
    decoder = av.CodecContext.create("h264", "r")
    decoder.extradata = avcc
    frames = []
    for unit in units:
        for frame in decoder.decode(av.Packet(unit)):
            frames.append(frame.to_ndarray(format="rgb24"))
    for frame in decoder.decode(None):
        frames.append(frame.to_ndarray(format="rgb24"))
    return frames


def test_h264_bitrate_follows_set_bitrate_down_and_up() -> None:
    """A bounded stream's frames average near its bitrate; lowered they shrink from the next
    frame on (libx264 reconfigured on the fly), and raised again they grow back (the encoder
    re-opened at the next IDR frame, one new config)."""
    h264 = H264Fragments(fps=FPS, stream="video", bitrate_kbps=800)
    high = encode_run(h264, 0, 36)[12:]
    h264.set_bitrate(450)  # mid-GOP, within the opened rate: on the fly
    mid = encode_run(h264, 36, 48)
    h264.set_bitrate(200)  # mid-GOP again, under half: on the fly, re-opened at the IDR
    low_run = encode_run(h264, 84, 36)
    reopen_low = next(i for i, (_, _, new) in enumerate(low_run) if new)
    h264.set_bitrate(800)
    back_run = encode_run(h264, 120, 72)
    assert 0.5 * target_bytes(800) <= mean_size(high) <= 1.5 * target_bytes(800)
    assert not any(new for _, _, new in mid)
    assert mean_size(mid[1:]) <= 1.5 * target_bytes(450)
    assert mean_size(mid[1:]) <= 0.8 * mean_size(high)
    assert reopen_low >= 6
    assert low_run[reopen_low][1]
    assert mean_size(low_run[1:reopen_low]) <= 2 * target_bytes(200)
    assert mean_size(low_run[reopen_low + 1 :]) <= 1.5 * target_bytes(200)
    assert mean_size(low_run[1:]) <= 0.5 * mean_size(high)
    reopened = [i for i, (_, key, new) in enumerate(back_run) if new]
    assert len(reopened) == 1
    assert back_run[reopened[0]][1]
    assert reopened[0] <= h264.keyframe_interval
    assert mean_size(back_run[-24:]) >= 2 * mean_size(low_run[1:])
    assert h264.opens == 3


def test_h264_bounded_frames_never_burst_past_the_buffer() -> None:
    """No access unit of a bounded stream, IDR frames included, exceeds its VBV buffer (a
    couple of frames' worth of the bitrate), also after the bitrate was lowered."""
    h264 = H264Fragments(fps=FPS, stream="video", bitrate_kbps=400, keyframe_interval=12)
    first = encode_run(h264, 0, 48)
    h264.set_bitrate(250)
    second = encode_run(h264, 48, 48)
    assert max(size for size, _, _ in first) <= 1.5 * VBV_FRAMES * target_bytes(400)
    assert max(size for size, _, _ in second[12:]) <= 1.5 * VBV_FRAMES * target_bytes(400)
    assert sum(key for _, key, _ in first) >= 3


def test_h264_unbounded_by_default_is_bounded_once_a_bitrate_is_set() -> None:
    """Without a bitrate the encoder keeps libx264's default quality; set_bitrate bounds it
    from the next IDR frame, whose bytes start with a new init segment."""
    h264 = H264Fragments(fps=FPS, stream="video", keyframe_interval=12)
    free = encode_run(h264, 0, 24)
    assert h264.bitrate_kbps is None
    h264.set_bitrate(150)
    bounded = encode_run(h264, 24, 36)
    news = [i for i, (_, _, new) in enumerate(bounded) if new]
    assert len(news) == 1
    assert bounded[news[0]][1]
    assert mean_size(bounded[news[0] + 6 :]) <= 1.5 * target_bytes(150) < mean_size(free)


def test_h264_scale_reopens_at_the_next_idr_with_a_new_config() -> None:
    """A lowered scale takes effect at the next IDR frame: a new init segment and avcC of
    the scaled size that decodes, while the app's frames keep their size (no refusal)."""
    h264 = H264Fragments(fps=FPS, stream="video", bitrate_kbps=600, keyframe_interval=12)
    encode_run(h264, 0, 5)
    first_avcc = h264.avcc
    h264.set_scale(0.5)
    units: list[bytes] = []
    avcc: bytes | None = None
    sizes: list[tuple[int, int] | None] = []
    for index in range(5, 30):
        data = h264.encode(moving(index))
        if h264.new_config:
            assert data.startswith(h264.init_segment or b"?")
            assert h264.keyframe
            avcc, units = h264.avcc, []
            sizes.append(h264.encoded_size)
        units.append(h264.access_unit)
    assert sizes == [(W // 2, H // 2)]
    assert avcc is not None
    assert avcc != first_avcc
    assert h264.size == (W, H)
    decoded = decode_units(units, avcc)
    assert len(decoded) == len(units)
    assert decoded[0].shape == (H // 2, W // 2, 3)
    h264.set_scale(1.0)
    encode_run(h264, 30, 13)
    assert h264.encoded_size == (W, H)


def test_h264_a_frame_of_another_size_is_still_refused_when_scaled() -> None:
    """The size rule reads the app's frames, not the scaled stream: a scaled encoder still
    refuses a frame whose size differs from the first frame's."""
    h264 = H264Fragments(fps=FPS, stream="video", keyframe_interval=2)
    h264.set_scale(0.5)
    encode_run(h264, 0, 4)
    message = "stream 'video': every h264 frame must have the first frame's size 320x240 (WxH)"
    with pytest.raises(CodecError, match=f"^{re.escape(message)}, got 160x120$"):
        h264.encode(moving(0)[: H // 2, : W // 2])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda h: h.set_bitrate(0),
            "stream 'video': bitrate_kbps must be a number from 1 to 1000000 (kbit/s), got 0",
        ),
        (
            lambda h: h.set_scale(1.5),
            "stream 'video': scale must be a number in (0, 1], got 1.5",
        ),
        (
            lambda h: h.set_scale(True),
            "stream 'video': scale must be a number in (0, 1], got True",
        ),
    ],
)
def test_h264_refuses_a_bad_rate_knob(call: object, message: str) -> None:
    """A bitrate or a scale out of range is a CodecError naming the stream, rule and value."""
    h264 = H264Fragments(fps=FPS, stream="video")
    with pytest.raises(CodecError, match=f"^{re.escape(message)}$"):
        call(h264)  # type: ignore[operator]


def test_jpeg_quality_and_scale_change_between_frames() -> None:
    """A JpegEncoder's quality and scale may be set between frames: lower quality, fewer
    bytes; scale 0.5, an image of half the size."""
    jpeg = JpegEncoder(stream="video")
    high = jpeg.encode(moving(0))
    jpeg.quality = 30
    low = jpeg.encode(moving(0))
    jpeg.scale = 0.5
    small = jpeg.encode(moving(0))
    assert len(small) < len(low) < len(high)
    assert Image.open(io.BytesIO(small)).size == (W // 2, H // 2)
    with pytest.raises(
        CodecError, match=r"^stream 'video': jpeg quality must be an int from 1 to 100, got 0$"
    ):
        jpeg.quality = 0


@pytest.mark.parametrize(
    ("size", "scale", "expected"),
    [((320, 240), 0.75, (240, 180)), ((321, 241), 0.5, (160, 120)), ((3, 3), 0.1, (2, 2))],
)
def test_scaled_sizes_are_even(
    size: tuple[int, int], scale: float, expected: tuple[int, int]
) -> None:
    """A scaled size is the size times scale rounded to even sides of at least 2."""
    assert scaled_size(*size, scale) == expected
    frame = np.zeros((size[1], size[0], 3), np.uint8)
    assert downscale(frame, scale).shape == (expected[1], expected[0], 3)
