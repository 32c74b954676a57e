"""The file transport: one egress stream written to an MP4 file, h264 through PyAV."""

from __future__ import annotations

import threading
from fractions import Fraction
from pathlib import Path
from typing import Any

from rxstream._exceptions import ArgumentError, PipelineStateError
from rxstream.item import PipelineItem
from rxstream.transport._base import Session, Transport
from rxstream.transport._codecs import (
    _check_size,
    _keyframe_interval,
    _open_h264,
    _pad_even,
    _rate,
    _video_frame,
    to_rgb24,
)

__all__ = ["FileTransport"]

MOVFLAGS = "empty_moov+default_base_moof+frag_keyframe"
"""Fragmented MP4: an empty ``moov`` first, then a ``moof``+``mdat`` fragment per keyframe
interval. A regular MP4 keeps an index entry per frame in memory until its ``moov`` is written
at the end (~90 bytes a frame: 2 kB/s at 24 fps, for the whole run); a fragmented one lets go
of each fragment's entries once it is written, and, as every packet is flushed to the file
(``flush_packets``), a file cut short (the process killed) still plays up to its last
complete fragment."""


class FileTransport(Transport):
    """Writes one egress stream to ``path``: an MP4 file (h264, yuv420p) any player opens.

    The stream is ``stream``, or, when that is ``None``, the session's only one (a session with
    several needs ``stream=``); items of other streams are ignored. Whatever the stream's
    codec, the file is h264: frame ``i`` (counted from 0) is shown at ``i / fps`` seconds, an
    IDR frame every ``keyframe_interval`` frames (default: one second's worth), each starting
    a fragment of a fragmented MP4 (see :data:`MOVFLAGS`). The file is
    created (with its parent folders) on the first frame, whose size every later frame must
    have (else :class:`~rxstream.transport.CodecError`); an odd width or height is padded to
    even, as in :class:`~rxstream.transport.H264Fragments`. :meth:`close` flushes the encoder
    and finishes the file; items sent after it are dropped. ``connected`` is always true: a
    headless run ends by itself, by a frame count or a timeout. Thread-safe.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        stream: str | None = None,
        fps: float = 24.0,
        keyframe_interval: int | None = None,
    ) -> None:
        self.path = Path(path)
        self._rate: Fraction = _rate(fps, "FileTransport")
        self._gop = _keyframe_interval(keyframe_interval, self._rate, "FileTransport")
        self._stream = stream
        self._lock = threading.Lock()
        self._container: Any = None
        self._video: Any = None
        self._size: tuple[int, int] | None = None
        self._frames = 0
        self._closed = False

    @property
    def connected(self) -> bool:
        return True

    @property
    def stream(self) -> str | None:
        """The stream written; ``None`` until :meth:`open` (or the first send) settles it."""
        return self._stream

    @property
    def frames(self) -> int:
        """Frames written so far."""
        with self._lock:
            return self._frames

    def open(self, session: Session) -> None:
        with self._lock:
            if self._closed:
                raise PipelineStateError(
                    f"FileTransport({str(self.path)!r}) is closed: it writes one run; "
                    f"make a new one for the next"
                )
            names = sorted(session.streams)
            if self._stream is None:
                if len(names) > 1:
                    raise ArgumentError(
                        f"FileTransport(stream=None) writes the session's only stream, but it "
                        f"has {len(names)}: {', '.join(map(repr, names))}; pass stream="
                    )
                if names:
                    self._stream = names[0]
            elif names and self._stream not in session.streams:
                raise ArgumentError(
                    f"FileTransport stream must be one of the session's streams "
                    f"({', '.join(map(repr, names))}), got {self._stream!r}"
                )

    def send(self, stream: str, item: PipelineItem) -> None:
        with self._lock:
            if self._closed:
                return
            if self._stream is None:
                self._stream = stream
            elif stream != self._stream:
                return
            rgb = to_rgb24(item.payload, stream=stream)
            if self._size is None:
                self._open_file(rgb)
            else:
                _check_size(stream, self._size, rgb)
            frame = _video_frame(rgb, self._frames, False)
            self._mux(self._video.encode(frame))
            self._frames += 1

    def close(self) -> None:
        """Flush the encoder and finish the file (nothing is written before a frame)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._container is None:
                return
            try:
                self._mux(self._video.encode(None))
            finally:
                self._container.close()

    def _open_file(self, rgb: Any) -> None:
        import av

        self.path.parent.mkdir(parents=True, exist_ok=True)
        container = av.open(
            str(self.path),
            mode="w",
            format="mp4",
            options={"movflags": MOVFLAGS, "flush_packets": "1"},
        )
        try:
            even = _pad_even(rgb).shape
            self._video = _open_h264(
                container, width=even[1], height=even[0], rate=self._rate, gop=self._gop
            )
        except BaseException:
            container.close()
            raise
        self._container = container
        self._size = (rgb.shape[1], rgb.shape[0])

    def _mux(self, packets: list[Any]) -> None:
        for packet in packets:
            packet.duration = 1  # one frame, in the codec's 1/fps time base
        self._container.mux(packets)
