"""Egress codecs: a frame payload to the bytes a client receives (``raw``, ``jpeg``, ``h264``).

Every encoder first reads its payload with :func:`to_rgb24`, so a stage may egress numpy or
torch frames in the layouts models produce. :func:`encoder` makes the encoder of a
``ctx.stream(name, codec=…)``; each :meth:`Encoder.encode` call returns the bytes of one frame
for that codec:

- ``raw``: :attr:`RawEncoder.HEADER` (little-endian ``uint16`` width, ``uint16`` height, ``uint8``
  channels = 3, three zero bytes: 8 bytes) then the ``height * width * 3`` RGB bytes, row by
  row; :func:`decode_raw` reads it back.
- ``jpeg``: one baseline JPEG image per frame (Pillow).
- ``h264``: :class:`H264Fragments`, fragmented MP4 that a browser's ``MediaSource`` appends;
  the same encode also gives each frame's access unit, for a WebCodecs ``VideoDecoder``.
"""

from __future__ import annotations

import io
import math
import struct
import sys
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import numpy as np

from rxstream._exceptions import CodecError
from rxstream.transport._base import CODECS

__all__ = [
    "FLOAT_SLACK",
    "RANGE_EVERY",
    "Encoder",
    "FrameCheck",
    "H264Fragments",
    "JpegEncoder",
    "RawEncoder",
    "decode_raw",
    "downscale",
    "encoder",
    "preload",
    "scaled_size",
    "to_rgb24",
]

_RAW_HEADER = struct.Struct("<HHB3x")

_CHANNELS = (1, 3, 4)

FLOAT_SLACK = 0.05
"""How far outside [0, 1] a float frame's values may stray and still be clamped (rounding, a
model's small overshoot); a frame beyond ``[-FLOAT_SLACK, 1 + FLOAT_SLACK]`` is refused."""

RANGE_EVERY = 16
"""A :class:`FrameCheck` on a threaded run reads a float frame's value range on the first frame
of each type, shape and dtype, then on every this many frames (a drive reads every frame)."""


# --- the rules: how every codec reads a frame (to_rgb24 converts by them, FrameCheck checks) ---


def _layout(shape: tuple[int, ...]) -> str | None:
    """``"hw"``, ``"hwc"`` or ``"chw"``: how a frame of ``shape`` is read; ``None``: it is not
    a frame (the channels are the last axis when it has 1, 3 or 4 entries, else the first)."""
    if len(shape) == 2:
        layout, channels = "hw", 1
    elif len(shape) == 3 and shape[-1] not in _CHANNELS and shape[0] in _CHANNELS:
        layout, channels = "chw", shape[0]
    elif len(shape) == 3:
        layout, channels = "hwc", shape[-1]
    else:
        return None
    return None if channels not in _CHANNELS or 0 in shape else layout


def _type_problem(payload: object) -> str:
    return f"a frame must be a numpy array or a torch tensor, got {type(payload).__name__}"


def _shape_problem(shape: tuple[int, ...]) -> str:
    return (
        "a frame must be HW, HWC or CHW with 1, 3 or 4 channels and no empty axis, "
        f"got shape {shape}"
    )


def _dtype_problem(dtype: str) -> str:
    return f"a frame's dtype must be uint8 or floating point (read as [0, 1]), got {dtype}"


def _range_problem(low: float, high: float, dtype: str) -> str | None:
    """The float rule: values in [0, 1] (give or take :data:`FLOAT_SLACK`), NaN read as 0 and
    infinities as 0 or 1 before ``low``/``high`` are taken; ``None`` when they keep it."""
    if low >= -FLOAT_SLACK and high <= 1.0 + FLOAT_SLACK:
        return None
    return (
        "a float frame must be in [0, 1] (scale it, or make it uint8), "
        f"got {dtype} values in [{low:.4g}, {high:.4g}]"
    )


def _torch_dtype(tensor: Any) -> str:
    return "torch." + str(tensor.dtype).removeprefix("torch.")


def _cleaned(array: np.ndarray) -> np.ndarray:
    """A float32 copy of a float frame with NaN as 0 and infinities as 0 or 1 (the payload is
    never written)."""
    scaled = array.astype(np.float32)
    np.nan_to_num(scaled, copy=False, nan=0.0, posinf=1.0, neginf=0.0)
    return scaled


def _cleaned_torch(tensor: Any, torch: Any) -> Any:
    return torch.nan_to_num(tensor.float(), nan=0.0, posinf=1.0, neginf=0.0)


def _aminmax(tensor: Any, torch: Any) -> tuple[float, float]:
    """A tensor's lowest and highest value, read back in one transfer (one sync on a GPU)."""
    low, high = torch.stack(torch.aminmax(tensor)).tolist()
    return float(low), float(high)


def _float_range(frame: Any, torch: Any) -> tuple[float, float]:
    """The lowest and highest value of a float frame as the rule reads them, without a copy
    unless it holds NaN or an infinity."""
    if torch is not None and isinstance(frame, torch.Tensor):
        frame = frame.detach()
        low, high = _aminmax(frame.float(), torch)
        if not (np.isfinite(low) and np.isfinite(high)):
            low, high = _aminmax(_cleaned_torch(frame, torch), torch)
        return low, high
    low, high = float(frame.min()), float(frame.max())
    if not (np.isfinite(low) and np.isfinite(high)):
        cleaned = _cleaned(frame)
        low, high = float(cleaned.min()), float(cleaned.max())
    return low, high


def _torch_to_numpy(tensor: Any, stream: str) -> np.ndarray:
    """A CPU numpy view of a torch tensor; floats become uint8 on the tensor's own device."""
    torch = sys.modules["torch"]
    tensor = tensor.detach()
    if tensor.is_floating_point():
        tensor = _float_to_uint8_torch(tensor, torch, stream)
    elif tensor.dtype != torch.uint8:
        raise CodecError(f"stream {stream!r}: {_dtype_problem(_torch_dtype(tensor))}")
    return np.asarray(tensor.cpu().numpy())


def _float_to_uint8_torch(tensor: Any, torch: Any, stream: str) -> Any:
    # On a GPU this moves a quarter of the bytes a float frame would.
    scaled = _cleaned_torch(tensor, torch)
    low, high = _aminmax(scaled, torch)
    problem = _range_problem(low, high, _torch_dtype(tensor))
    if problem is not None:
        raise CodecError(f"stream {stream!r}: {problem}")
    return scaled.clamp_(0.0, 1.0).mul_(255.0).add_(0.5).to(torch.uint8)


def _float_to_uint8(array: np.ndarray, stream: str) -> np.ndarray:
    scaled = _cleaned(array)
    problem = _range_problem(float(scaled.min()), float(scaled.max()), str(array.dtype))
    if problem is not None:
        raise CodecError(f"stream {stream!r}: {problem}")
    np.clip(scaled, 0.0, 1.0, out=scaled)
    scaled *= 255.0
    scaled += 0.5
    return scaled.astype(np.uint8)


def to_rgb24(payload: object, *, stream: str) -> np.ndarray:
    """``payload`` as a C-contiguous ``(H, W, 3)`` uint8 RGB array.

    Takes a numpy array or a torch tensor (a CUDA tensor is copied to the CPU): ``HW``
    grayscale, ``HWC`` or ``CHW`` with 1, 3 or 4 channels (the last axis holds the channels
    when it has 1, 3 or 4 entries, else the first). One channel is gray, expanded to three; a
    fourth (alpha) is dropped. uint8 is taken as is; floating point is read as [0, 1]: NaN
    reads as 0 and infinities as 0 or 1, values up to :data:`FLOAT_SLACK` outside are clamped,
    and the rest scaled by 255 and rounded; a float frame further outside (a 0..255 frame, a
    [-1, 1] one) is refused. Anything else raises :class:`~rxstream.transport.CodecError`
    naming ``stream``, the rule and what it got. An array already in that form is returned as
    is, not copied.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(payload, torch.Tensor):
        layout = _layout(tuple(payload.shape))
        if layout is None:
            raise CodecError(f"stream {stream!r}: {_shape_problem(tuple(payload.shape))}")
        array = _torch_to_numpy(payload, stream)
    elif isinstance(payload, np.ndarray):
        layout = _layout(payload.shape)
        if layout is None:
            raise CodecError(f"stream {stream!r}: {_shape_problem(payload.shape)}")
        array = payload
    else:
        raise CodecError(f"stream {stream!r}: {_type_problem(payload)}")
    if layout == "hw":
        array = array[:, :, None]
    elif layout == "chw":
        array = array.transpose(1, 2, 0)
    if array.dtype.kind == "f":
        array = _float_to_uint8(array, stream)
    elif array.dtype != np.uint8:
        raise CodecError(f"stream {stream!r}: {_dtype_problem(str(array.dtype))}")
    channels = array.shape[-1]
    if channels == 1:
        array = np.repeat(array, 3, axis=2)
    elif channels == 4:
        array = array[:, :, :3]
    return np.ascontiguousarray(array)


class FrameCheck:
    """What a ``jpeg`` or ``h264`` sink accepts, checked as :func:`to_rgb24` reads it, without
    converting or encoding (the sink asks it before the transport; a drive has no encoder).

    Calling it with a payload returns the rule the payload breaks (``None`` when it keeps
    them): the type, layout and dtype rules on the first payload and whenever the payload's
    type, shape or dtype changes (a payload like the last costs a compare); a float frame's
    value range on the first such payload, then on every ``every``-th. The value is the
    rule's sentence (``"a frame must be …, got …"``), for the caller to say which stream and
    stage it was. ``same_size`` (an ``h264`` stream, whose encoder keeps its first frame's
    size): a frame of another width or height than the first one it passed is refused too.
    """

    __slots__ = (
        "_count",
        "_dtype",
        "_every",
        "_float",
        "_same_size",
        "_shape",
        "_size",
        "_torch",
        "_type",
    )

    def __init__(self, *, every: int = RANGE_EVERY, same_size: bool = False) -> None:
        self._every = every
        self._same_size = same_size
        self._size: tuple[int, int] | None = None
        self._type: type | None = None
        self._shape: object = None
        self._dtype: object = None
        self._float = False
        self._count = 0
        self._torch: Any = None

    def __call__(self, payload: object) -> str | None:
        try:
            shape, dtype = payload.shape, payload.dtype  # type: ignore[attr-defined]
        except AttributeError:
            shape = dtype = None
        if type(payload) is self._type and shape == self._shape and dtype == self._dtype:
            if not self._float:
                return None
            self._count += 1
            if self._count % self._every:
                return None
            return self._range(payload)
        problem = self._rules(payload)
        if problem is not None:
            self._type = None  # a refused payload is never "like the last"
            return problem
        self._type, self._shape, self._dtype = type(payload), shape, dtype
        self._count = 0
        return self._range(payload) if self._float else None

    def _rules(self, payload: object) -> str | None:
        torch = self._torch = sys.modules.get("torch")
        if torch is not None and isinstance(payload, torch.Tensor):
            shape = tuple(payload.shape)
            self._float = payload.is_floating_point()
            ok = self._float or payload.dtype == torch.uint8
            dtype = _torch_dtype(payload)
        elif isinstance(payload, np.ndarray):
            shape = payload.shape
            self._float = payload.dtype.kind == "f"
            ok = self._float or payload.dtype == np.uint8
            dtype = str(payload.dtype)
        else:
            return _type_problem(payload)
        layout = _layout(shape)
        if layout is None:
            return _shape_problem(shape)
        if not ok:
            return _dtype_problem(dtype)
        return self._size_problem(shape[1:3] if layout == "chw" else shape[:2])

    def _size_problem(self, height_width: tuple[int, ...]) -> str | None:
        """The ``same_size`` rule for a frame ``(height, width)``; the first sets the size."""
        if not self._same_size:
            return None
        size = (int(height_width[1]), int(height_width[0]))
        if self._size is None:
            self._size = size
        elif size != self._size:
            return (
                f"every h264 frame must have the first frame's size {self._size[0]}x"
                f"{self._size[1]} (WxH), got {size[0]}x{size[1]}"
            )
        return None

    def _range(self, frame: Any) -> str | None:
        torch = self._torch
        is_tensor = torch is not None and isinstance(frame, torch.Tensor)
        low, high = _float_range(frame, torch)
        problem = _range_problem(low, high, _torch_dtype(frame) if is_tensor else str(frame.dtype))
        if problem is not None:
            self._type = None
        return problem


def decode_raw(data: bytes | bytearray | memoryview) -> np.ndarray:
    """The ``(H, W, 3)`` uint8 frame of one ``raw`` message (a copy of its pixel bytes)."""
    view = memoryview(data).cast("B")
    if len(view) < _RAW_HEADER.size:
        raise CodecError(
            f"a raw frame starts with a {_RAW_HEADER.size}-byte header, got {len(view)} bytes"
        )
    width, height, channels = _RAW_HEADER.unpack_from(view)
    expected = _RAW_HEADER.size + width * height * channels
    if channels != 3 or len(view) != expected:
        raise CodecError(
            f"a raw frame must be its header then width*height*3 bytes: header says "
            f"{width}x{height}x{channels} ({expected} bytes in all), got {len(view)} bytes"
        )
    pixels = np.frombuffer(view, dtype=np.uint8, offset=_RAW_HEADER.size)
    return pixels.reshape(height, width, 3).copy()


class Encoder:
    """Turns the frames of one egress stream into the bytes its codec sends, frame by frame."""

    codec: str = ""
    """``raw``, ``jpeg`` or ``h264``."""

    def __init__(self, *, stream: str) -> None:
        self.stream = stream
        """The stream's name, which the encoder's errors name."""

    def encode(self, frame: object) -> bytes:
        """The bytes of one frame (any payload :func:`to_rgb24` takes)."""
        raise NotImplementedError

    def close(self) -> bytes:
        """End the stream: the bytes still held, if any (``b""`` for ``raw`` and ``jpeg``)."""
        return b""


class RawEncoder(Encoder):
    """``raw``: :attr:`HEADER` then the frame's RGB bytes (see :func:`decode_raw`)."""

    codec = "raw"
    HEADER = _RAW_HEADER
    """The 8-byte header: width, height (``uint16``), channels (``uint8``, 3), 3 zero bytes."""

    def encode(self, frame: object) -> bytes:
        rgb = to_rgb24(frame, stream=self.stream)
        height, width = rgb.shape[:2]
        if width > 0xFFFF or height > 0xFFFF:
            raise CodecError(
                f"stream {self.stream!r}: a raw frame's width and height must be at most 65535 "
                f"(its header holds uint16s), got {width}x{height}"
            )
        return _RAW_HEADER.pack(width, height, 3) + rgb.tobytes()


class JpegEncoder(Encoder):
    """``jpeg``: one JPEG image per frame, at ``quality`` (1-100, Pillow's scale), its width
    and height multiplied by ``scale`` (see :func:`downscale`); both may change between frames
    (a rate controller lowers them for a narrow link)."""

    codec = "jpeg"

    def __init__(self, *, stream: str, quality: int = 85, scale: float = 1.0) -> None:
        super().__init__(stream=stream)
        self.quality = quality
        self.scale = scale

    @property
    def quality(self) -> int:
        """The JPEG quality of the next frame: an int from 1 to 100 (above 95 Pillow's JPEG
        grows without looking better)."""
        return self._quality

    @quality.setter
    def quality(self, quality: int) -> None:
        if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
            raise CodecError(
                f"stream {self.stream!r}: jpeg quality must be an int from 1 to 100, "
                f"got {quality!r}"
            )
        self._quality = quality

    @property
    def scale(self) -> float:
        """The next frame's width and height are multiplied by this (0 < scale <= 1)."""
        return self._scale

    @scale.setter
    def scale(self, scale: float) -> None:
        self._scale = _scale(scale, self.stream)

    def encode(self, frame: object) -> bytes:
        from PIL import Image

        rgb = to_rgb24(frame, stream=self.stream)
        image = Image.fromarray(rgb if self._scale == 1.0 else downscale(rgb, self._scale))
        out = io.BytesIO()
        image.save(out, format="JPEG", quality=self._quality)
        return out.getvalue()


# --- resolution -------------------------------------------------------------------------------


def _scale(scale: object, stream: str) -> float:
    if (
        isinstance(scale, bool)
        or not isinstance(scale, int | float)
        or not math.isfinite(scale)
        or not 0 < scale <= 1
    ):
        raise CodecError(f"stream {stream!r}: scale must be a number in (0, 1], got {scale!r}")
    return float(scale)


def scaled_size(width: int, height: int, scale: float) -> tuple[int, int]:
    """``(width, height)`` multiplied by ``scale``, each rounded to an even number of at least
    2 (yuv420p's rule); ``scale`` 1 keeps the size as it is, odd sides included."""
    if scale == 1.0:
        return width, height
    return max(2, 2 * round(width * scale / 2)), max(2, 2 * round(height * scale / 2))


def downscale(rgb: np.ndarray, scale: float) -> np.ndarray:
    """An ``(H, W, 3)`` uint8 frame resized to :func:`scaled_size` (bilinear, Pillow);
    ``scale`` 1 returns ``rgb`` itself."""
    height, width = rgb.shape[:2]
    size = scaled_size(width, height, scale)
    if size == (width, height):
        return rgb
    from PIL import Image

    return np.asarray(Image.fromarray(rgb).resize(size, Image.Resampling.BILINEAR))


# --- h264 -------------------------------------------------------------------------------------

_X264_OPTIONS = {"preset": "ultrafast", "tune": "zerolatency", "forced-idr": "1"}


def _pad_even(rgb: np.ndarray) -> np.ndarray:
    """yuv420p needs even sides: an odd one gains a copy of its last row or column."""
    height, width = rgb.shape[:2]
    if height % 2 == 0 and width % 2 == 0:
        return rgb
    return np.pad(rgb, ((0, height % 2), (0, width % 2), (0, 0)), mode="edge")


def _rate(fps: float, where: str) -> Fraction:
    if isinstance(fps, bool) or not isinstance(fps, int | float) or not 0 < fps <= 1000:
        raise CodecError(f"{where}: fps must be > 0 and <= 1000, got {fps!r}")
    return Fraction(fps).limit_denominator(1001)


def _keyframe_interval(interval: int | None, rate: Fraction, where: str) -> int:
    if interval is None:
        return max(1, round(rate))
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise CodecError(
            f"{where}: keyframe_interval must be an int >= 1 (frames), got {interval!r}"
        )
    return interval


def _check_size(stream: str, expected: tuple[int, int], rgb: np.ndarray) -> None:
    height, width = rgb.shape[:2]
    if (width, height) != expected:
        raise CodecError(
            f"stream {stream!r}: every h264 frame must have the first frame's size "
            f"{expected[0]}x{expected[1]} (WxH), got {width}x{height}"
        )


VBV_FRAMES = 2
"""A bounded h264 stream's VBV buffer (libx264 ``bufsize``) holds this many frames' worth of its
bitrate: no frame, an IDR frame included, bursts more than about two frames of the link."""


def _bitrate(kbps: object, stream: str) -> float:
    if (
        isinstance(kbps, bool)
        or not isinstance(kbps, int | float)
        or not math.isfinite(kbps)
        or not 1 <= kbps <= 1_000_000
    ):
        raise CodecError(
            f"stream {stream!r}: bitrate_kbps must be a number from 1 to 1000000 (kbit/s), "
            f"got {kbps!r}"
        )
    return float(kbps)


def _open_h264(
    container: Any,
    *,
    width: int,
    height: int,
    rate: Fraction,
    gop: int,
    kbps: float | None = None,
) -> Any:
    """Add a libx264 yuv420p stream of the (even) size to an output container; with ``kbps``,
    at that bitrate under a VBV of the same rate (x264's CBR, whose bitrate a later lower
    ``bit_rate`` changes on the fly) and a :data:`VBV_FRAMES` buffer."""
    options = dict(_X264_OPTIONS)
    if kbps is not None:
        options["maxrate"] = f"{round(kbps * 1000)}"
        options["bufsize"] = f"{round(kbps * 1000 * VBV_FRAMES / rate)}"
    video = container.add_stream("libx264", rate=rate, options=options)
    video.width = width
    video.height = height
    video.pix_fmt = "yuv420p"
    video.codec_context.gop_size = gop
    if kbps is not None:
        video.codec_context.bit_rate = round(kbps * 1000)
    return video


def _encoded_size(width: int, height: int, scale: float) -> tuple[int, int]:
    """The even size a frame of ``width`` x ``height`` is encoded at, at ``scale``."""
    if scale == 1.0:
        return width + width % 2, height + height % 2
    return scaled_size(width, height, scale)


def _video_frame(
    rgb: np.ndarray, index: int, keyframe: bool, size: tuple[int, int] | None = None
) -> Any:
    import av
    from av.video.frame import PictureType

    frame = av.VideoFrame.from_ndarray(_pad_even(rgb), format="rgb24")
    if (
        size is not None and (frame.width, frame.height) != size
    ):  # a lowered resolution: swscale, then yuv420p
        frame = frame.reformat(
            width=size[0], height=size[1], format="yuv420p", interpolation="BILINEAR"
        )
    frame.pts = index
    if keyframe:
        frame.pict_type = PictureType.I
    return frame


def _boxes(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The ``(type, payload)`` of each ISO BMFF box laid end to end in ``data``."""
    at = 0
    while at + 8 <= len(data):
        size, kind = struct.unpack_from(">I4s", data, at)
        if size < 8:
            return
        yield kind, data[at + 8 : at + size]
        at += size


def _child(data: bytes, *path: bytes) -> bytes:
    for kind in path:
        data = next(payload for name, payload in _boxes(data) if name == kind)
    return data


def _box(kind: bytes, *parts: bytes) -> bytes:
    body = b"".join(parts)
    return struct.pack(">I4s", 8 + len(body), kind) + body


def _full_box(kind: bytes, version: int, flags: int, *parts: bytes) -> bytes:
    return _box(kind, struct.pack(">I", version << 24 | flags), *parts)


def _length_prefixed(annex_b: bytes) -> bytes:
    """Annex B NAL units (start codes) as the 4-byte length-prefixed units MP4 samples hold."""
    out = bytearray()
    for unit in annex_b.split(b"\x00\x00\x01"):
        unit = unit.rstrip(b"\x00")  # a 4-byte start code leaves a zero on the unit before
        if unit:
            out += struct.pack(">I", len(unit)) + unit
    return bytes(out)


_KEY_SAMPLE = 0x02000000  # sample_depends_on = 2: an IDR picture
_DELTA_SAMPLE = 0x01010000  # sample_depends_on = 1, sample_is_non_sync_sample
_TRUN_FLAGS = 0x000001 | 0x000100 | 0x000200 | 0x000400  # offset, duration, size, flags
_DEFAULT_BASE_IS_MOOF = 0x020000


class H264Fragments(Encoder):
    """``h264``: fragmented MP4 in memory, one fragment per frame, for a browser's MediaSource.

    libx264 (yuv420p, preset ultrafast, tune zerolatency: no B-frames, no lookahead) encodes
    each frame at once, and :meth:`encode` returns that frame's fragment (``moof`` + ``mdat``,
    ``default-base-is-moof``) in the same call: the stream adds no frame of latency. The first
    call returns the init segment (``ftyp`` + ``moov``, the muxer's ``empty_moov``) before its
    fragment; it is also kept as :attr:`init_segment` for a client that joins later. Every
    ``keyframe_interval`` frames (default: one second's worth) is an IDR frame, and
    :meth:`request_keyframe` makes the next one an IDR too, so a late joiner appends the init
    segment and then the fragments from a keyframe on (:attr:`keyframe` says which).

    The size is the first frame's; a later frame of another size raises
    :class:`~rxstream.transport.CodecError`. An odd width or height is padded to even with a
    copy of the last column or row (yuv420p needs even sides), so a decoder shows the frame one
    pixel wider or taller.

    Rate: without ``bitrate_kbps`` libx264 encodes at its default quality (CRF 23), whatever
    the bytes. With it, the stream is bounded: that bitrate under a VBV of the same rate whose
    buffer holds :data:`VBV_FRAMES` frames. :meth:`set_bitrate` changes it for the next frame
    when it is lower than the rate the encoder was opened at (libx264 reconfigures on the
    fly); a higher one (or one under half of it, for a buffer sized to the new rate) takes the
    opened rate at once and re-opens the encoder at the next IDR frame (the keyframe
    interval's, or a requested one). :meth:`set_scale` lowers the resolution the same way, at
    the next IDR frame: the app's frames keep their size (the size rule above still reads
    theirs); the encoder resizes them (:func:`scaled_size`). A re-opened encoder's first
    :meth:`encode` returns a new init segment before its fragment, as the first call does;
    :attr:`new_config` says so, and :attr:`avcc`, :attr:`codec_string`,
    :attr:`init_segment` and :attr:`encoded_size` describe the new stream.
    """

    codec = "h264"

    def __init__(
        self,
        *,
        fps: float,
        stream: str,
        keyframe_interval: int | None = None,
        bitrate_kbps: float | None = None,
    ) -> None:
        super().__init__(stream=stream)
        self._rate = _rate(fps, f"stream {stream!r}")
        self._want_kbps = None if bitrate_kbps is None else _bitrate(bitrate_kbps, stream)
        self._opened_kbps: float | None = None  # the rate (VBV) the open encoder was opened at
        self._applied_kbps: float | None = None  # its bit_rate now
        self._want_scale = 1.0
        self._opened_scale = 1.0
        self._encoded: tuple[int, int] | None = None
        self._last_key = 0
        self._new_config = False
        self._opens = 0
        self.keyframe_interval = _keyframe_interval(
            keyframe_interval, self._rate, f"stream {stream!r}"
        )
        """An IDR frame every this many frames (x264's keyint; a scene cut may add one)."""
        self._container: Any = None
        self._video: Any = None
        self._size: tuple[int, int] | None = None
        self._init: bytes | None = None
        self._codec_string: str | None = None
        self._avcc: bytes | None = None
        self._access_unit = b""
        self._track_id = 1
        self._timescale = 1
        self._sequence = 0
        self._frames = 0
        self._keyframe = False
        self._force_keyframe = False
        self._closed = False

    @property
    def init_segment(self) -> bytes | None:
        """``ftyp`` + ``moov``: what a client appends first; ``None`` before the first frame."""
        return self._init

    @property
    def codec_string(self) -> str | None:
        """The RFC 6381 codec, e.g. ``avc1.42C01E``; ``None`` before the first frame."""
        return self._codec_string

    @property
    def avcc(self) -> bytes | None:
        """The ``AVCDecoderConfigurationRecord`` (SPS, PPS): a WebCodecs ``description``."""
        return self._avcc

    @property
    def access_unit(self) -> bytes:
        """The frame of the last :meth:`encode` as one access unit in AVC form (4-byte
        length-prefixed NAL units, what :attr:`avcc` describes): for a decoder fed frame by
        frame (WebCodecs), with :attr:`keyframe` saying whether it is an IDR frame."""
        return self._access_unit

    @property
    def mime_type(self) -> str | None:
        """``video/mp4; codecs="avc1.…"``, for ``MediaSource.isTypeSupported``."""
        codec = self._codec_string
        return None if codec is None else f'video/mp4; codecs="{codec}"'

    @property
    def size(self) -> tuple[int, int] | None:
        """``(width, height)`` of the frames taken (before padding); ``None`` before the first."""
        return self._size

    @property
    def frames(self) -> int:
        """Frames encoded so far."""
        return self._frames

    @property
    def encoded_size(self) -> tuple[int, int] | None:
        """``(width, height)`` of the stream the decoder sees (padded to even, scaled by
        :attr:`scale`); ``None`` before the first frame."""
        return self._encoded

    @property
    def bitrate_kbps(self) -> float | None:
        """The bitrate asked for (kbit/s; ``None``: unbounded, libx264's default quality)."""
        return self._want_kbps

    def set_bitrate(self, kbps: float) -> None:
        """Bound the stream at ``kbps`` kbit/s from the next frame on (or, above the rate the
        encoder was opened at, from the next IDR frame); the sink's thread, or any thread
        between two encodes."""
        self._want_kbps = _bitrate(kbps, self.stream)

    @property
    def scale(self) -> float:
        """The resolution asked for, as a fraction of the frames' width and height; it takes
        effect at the next IDR frame."""
        return self._want_scale

    def set_scale(self, scale: float) -> None:
        """Encode the frames' width and height multiplied by ``scale`` (0 < scale <= 1) from
        the next IDR frame on (a new decoder config, :attr:`new_config`)."""
        self._want_scale = _scale(scale, self.stream)

    @property
    def new_config(self) -> bool:
        """Whether the last :meth:`encode` began a new stream: the first frame's, or a
        re-opened encoder's (a new resolution or rate), its bytes an init segment before the
        fragment and its frame an IDR frame with a new :attr:`avcc`."""
        return self._new_config

    @property
    def opens(self) -> int:
        """How many times the encoder was opened (1 after the first frame; each re-open for a
        new resolution or rate adds one)."""
        return self._opens

    @property
    def keyframe(self) -> bool:
        """Whether the fragment the last :meth:`encode` returned holds an IDR frame."""
        return self._keyframe

    def request_keyframe(self) -> None:
        """Make the next frame an IDR frame (for a client that joins now); any thread."""
        self._force_keyframe = True

    @property
    def keyframe_requested(self) -> bool:
        """Whether the next frame is an IDR frame already (a request since the last encode)."""
        return self._force_keyframe

    def encode(self, frame: object) -> bytes:
        if self._closed:
            raise CodecError(f"stream {self.stream!r}: encode() after close() on its h264 encoder")
        rgb = to_rgb24(frame, stream=self.stream)
        head = b""
        if self._size is None:
            head = self._open(rgb)
        else:
            _check_size(self.stream, self._size, rgb)
            if self._reopen_due():
                head = self._reopen(rgb)
            else:
                self._follow_bitrate()
        self._new_config = bool(head)
        force, self._force_keyframe = self._force_keyframe, False
        assert self._encoded is not None
        packets = self._video.encode(_video_frame(rgb, self._frames, force, self._encoded))
        self._frames += 1
        return head + self._fragments(packets)

    def _reopen_due(self) -> bool:
        """Whether this frame re-opens the encoder: it is due an IDR frame (the interval's or
        a requested one) and the resolution changed, or the rate the encoder was opened at
        cannot serve the bitrate asked for (above it, under half of it, or unbounded)."""
        want, opened = self._want_kbps, self._opened_kbps
        rate_off = want is not None and (opened is None or not opened / 2 <= want <= opened)
        if not rate_off and self._want_scale == self._opened_scale:
            return False
        return self._force_keyframe or self._frames - self._last_key >= self.keyframe_interval

    def _follow_bitrate(self) -> None:
        """A lower bitrate than the encoder was opened at, on the fly (libx264 reconfigures
        when ``bit_rate`` changes); a higher one is held at the opened rate until the next
        IDR frame re-opens it."""
        want, opened = self._want_kbps, self._opened_kbps
        if want is None or opened is None:
            return
        kbps = min(want, opened)
        if kbps != self._applied_kbps:
            self._video.codec_context.bit_rate = round(kbps * 1000)
            self._applied_kbps = kbps

    def _reopen(self, rgb: np.ndarray) -> bytes:
        """Close the encoder (what it still held goes out first) and open one at the bitrate
        and resolution asked for; the new init segment, then this frame, come next."""
        tail = self._fragments(self._video.encode(None))
        self._container.close()
        self._container = self._video = None
        return tail + self._open(rgb)

    def close(self) -> bytes:
        """Flush the encoder (its fragments, if any, are returned) and free it; idempotent."""
        if self._closed:
            return b""
        self._closed = True
        if self._container is None:
            return b""
        try:
            return self._fragments(self._video.encode(None))
        finally:
            self._container.close()  # its trailer goes nowhere: fragments are written here

    def _open(self, rgb: np.ndarray) -> bytes:
        import av

        height, width = rgb.shape[:2]
        header = _Collect()
        container = av.open(
            header,
            mode="w",
            format="mp4",
            options={"movflags": "empty_moov+default_base_moof+frag_keyframe"},
        )
        encoded = _encoded_size(width, height, self._want_scale)
        try:
            video = _open_h264(
                container,
                width=encoded[0],
                height=encoded[1],
                rate=self._rate,
                gop=self.keyframe_interval,
                kbps=self._want_kbps,
            )
            video.codec_context.open()  # the muxer's avcC needs libx264's SPS and PPS
            container.start_encoding()
        except BaseException:
            container.close()
            raise
        init = header.take()
        header.discard = True
        moov = _child(init, b"moov")
        trak = _child(moov, b"trak")
        tkhd = _child(trak, b"tkhd")
        mdhd = _child(trak, b"mdia", b"mdhd")
        wide = 8 if tkhd[0] == 1 else 0  # version 1 boxes hold 64-bit times
        (self._track_id,) = struct.unpack_from(">I", tkhd, 12 + 2 * wide)
        (self._timescale,) = struct.unpack_from(">I", mdhd, 12 + 2 * (8 if mdhd[0] == 1 else 0))
        stsd = _child(trak, b"mdia", b"minf", b"stbl", b"stsd")
        avc1 = _child(stsd[8:], b"avc1")  # after stsd's version, flags and entry count
        self._avcc = _child(avc1[78:], b"avcC")  # after the VisualSampleEntry fields
        self._codec_string = _avc1_codec(self._avcc)
        self._container, self._video = container, video
        self._size = (width, height)
        self._encoded = encoded
        self._opened_kbps = self._applied_kbps = self._want_kbps
        self._opened_scale = self._want_scale
        self._last_key = self._frames
        self._opens += 1
        self._init = init
        return init

    def _fragments(self, packets: list[Any]) -> bytes:
        samples = [_length_prefixed(bytes(packet)) for packet in packets]
        parts = [
            self._fragment(packet, sample) for packet, sample in zip(packets, samples, strict=True)
        ]
        if parts:
            self._keyframe = packets[-1].is_keyframe
            self._access_unit = b"".join(samples)
            if self._keyframe:
                self._last_key = self._frames - 1  # encode counted this frame already
        return b"".join(parts)

    def _fragment(self, packet: Any, sample: bytes) -> bytes:
        # tune=zerolatency leaves no B-frames: pts == dts, so no composition offsets.
        dts = int(packet.dts)
        start = self._media_time(dts)
        duration = self._media_time(dts + 1) - start
        flags = _KEY_SAMPLE if packet.is_keyframe else _DELTA_SAMPLE
        self._sequence += 1

        def moof(data_offset: int) -> bytes:
            trun = struct.pack(">IiIII", 1, data_offset, duration, len(sample), flags)
            return _box(
                b"moof",
                _full_box(b"mfhd", 0, 0, struct.pack(">I", self._sequence)),
                _box(
                    b"traf",
                    _full_box(b"tfhd", 0, _DEFAULT_BASE_IS_MOOF, struct.pack(">I", self._track_id)),
                    _full_box(b"tfdt", 1, 0, struct.pack(">Q", start)),
                    _full_box(b"trun", 0, _TRUN_FLAGS, trun),
                ),
            )

        head = moof(len(moof(0)) + 8)  # the sample starts after the moof and mdat's header
        return head + _box(b"mdat", sample)

    def _media_time(self, frame: int) -> int:
        """Frame ``frame``'s start in the track's timescale."""
        return int(frame * self._timescale / self._rate)


def _avc1_codec(avcc: bytes) -> str:
    """``avc1.PPCCLL`` from an ``AVCDecoderConfigurationRecord`` (profile, flags, level)."""
    return "avc1." + avcc[1:4].hex().upper()


class _Collect:
    """A write-only file for PyAV: keeps what the muxer writes until :meth:`take`."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self.discard = False

    def write(self, data: bytes) -> int:
        if not self.discard:
            self._chunks.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self._chunks)
        self._chunks.clear()
        return data


def preload(codec: str | None) -> None:
    """Import now what ``codec``'s encoder needs (PyAV for ``h264``, Pillow's JPEG plugin for
    ``jpeg``), so its first frame does not pay for it.

    A session transport calls this when it opens. Left to the first frame, the import ran on
    the sink's thread holding the GIL while the pipeline ran: ``import av`` alone takes ~50 ms,
    and the first h264 page of a run stalled every stage for 55-145 ms (docs/decisions.md).
    """
    try:
        if codec == "h264":
            import av
            from av.video.frame import PictureType  # noqa: F401  (what _video_frame imports)

            av.codec.Codec("libx264", "w")  # the encoder's library, looked up once
        elif codec == "jpeg":
            from PIL import Image

            Image.preinit()  # the JPEG plugin, which save() would load
    except (ImportError, ValueError):  # missing here: the first frame's encode says so, as before
        pass


def encoder(
    codec: str | None,
    *,
    fps: float,
    stream: str,
    quality: int = 85,
    keyframe_interval: int | None = None,
    bitrate_kbps: float | None = None,
) -> Encoder:
    """The encoder of ``codec`` (``None`` is ``raw``) for ``stream``.

    ``fps`` paces h264 timestamps (frame ``i`` at ``i / fps`` s); ``quality`` is the jpeg
    quality; ``keyframe_interval`` the h264 IDR period in frames (default: ``round(fps)``);
    ``bitrate_kbps`` bounds an h264 stream at that rate (default: unbounded, see
    :class:`H264Fragments`).
    """
    if codec is None or codec == "raw":
        return RawEncoder(stream=stream)
    if codec == "jpeg":
        return JpegEncoder(stream=stream, quality=quality)
    if codec == "h264":
        return H264Fragments(
            fps=fps, stream=stream, keyframe_interval=keyframe_interval, bitrate_kbps=bitrate_kbps
        )
    raise CodecError(
        f"stream {stream!r}: codec must be one of {', '.join(CODECS)} (or None: raw), got {codec!r}"
    )
