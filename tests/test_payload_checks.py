"""Payloads a sink's codec cannot show are said at once, naming the stage that made them: a
``jpeg``/``h264`` sink checks each payload as its codec reads it (in drives, self tests and
headless runs too, which encode nothing), float frames far outside [0, 1] are refused, and a
source that sends a list of frames as one payload is hinted."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog
import torch

import rxstream
from rxstream.operators import PACE_KIND, PIPE_KIND, STREAM_KIND
from rxstream.operators._sink import producer_of
from rxstream.operators._source import SOURCE_KIND
from rxstream.transport import CodecError, FileTransport, to_rgb24
from rxstream.transport._codecs import FrameCheck

H, W = 32, 48
SHAPE_RULE = "a frame must be HW, HWC or CHW with 1, 3 or 4 channels and no empty axis"
RANGE_RULE = r"a float frame must be in \[0, 1\] \(scale it, or make it uint8\)"


def refusal(ctx: rxstream.Context, pipeline: rxstream.Pipeline) -> str:
    """The message of the CodecError that fails a one-frame drive of ``pipeline``."""
    with pytest.raises(rxstream.PipelineError) as failed:
        pipeline.drive(frames=1)
    assert failed.value.stage == "video"
    assert isinstance(failed.value.__cause__, CodecError)
    return str(failed.value.__cause__)


def painted(ctx: rxstream.Context, frame: Any, codec: str = "h264") -> rxstream.Pipeline:
    """counter -> paint (returns ``frame``) -> the ``video`` sink of ``codec``."""
    return (
        ctx.source(range(100), name="counter")
        | ctx.pipe(lambda _: frame, name="paint")
        | ctx.stream("video", codec=codec)
    )


# --- float frames: [0, 1] or refused ----------------------------------------------------------


@pytest.mark.parametrize("codec", ["h264", "jpeg"])
def test_a_float_frame_in_0_255_fails_the_drive_naming_the_stage_dtype_and_range(
    ctx: rxstream.Context, codec: str
) -> None:
    """A float64 frame in 0..255 to a codec sink is a CodecError naming maker, dtype, min, max."""
    frame = np.linspace(0.0, 255.0, H * W * 3).reshape(H, W, 3)
    message = refusal(ctx, painted(ctx, frame, codec))
    assert re.match(
        rf"^stream 'video': {RANGE_RULE}, got float64 values in \[0, 255\] from stage 'paint'$",
        message,
    )


def test_a_minus_one_to_one_torch_frame_is_refused_with_its_torch_dtype(
    ctx: rxstream.Context,
) -> None:
    """A CHW float32 tensor in [-1, 1] (a tanh output) is refused too, its dtype torch's."""
    frame = torch.linspace(-1.0, 1.0, 3 * H * W).reshape(3, H, W)
    message = refusal(ctx, painted(ctx, frame))
    assert re.match(
        rf"^stream 'video': {RANGE_RULE}, got torch.float32 values in \[-1, 1\] "
        r"from stage 'paint'$",
        message,
    )


def test_a_float_frame_within_the_slack_passes_and_nan_and_inf_read_as_before(
    ctx: rxstream.Context,
) -> None:
    """A float frame in [-0.04, 1.04] with NaN and infinities passes a codec sink's check."""
    frame = np.full((H, W, 3), 0.5)
    frame[0, :4, 0] = [-0.04, 1.04, np.nan, np.inf]
    frame[1, 0, 0] = -np.inf
    (out,) = painted(ctx, frame).drive(frames=1)
    assert out is frame
    assert to_rgb24(frame, stream="video")[0, :4, 0].tolist() == [0, 255, 0, 255]


@pytest.mark.parametrize(
    "frame",
    [np.full((H, W, 3), 200.0, np.float32), torch.full((3, H, W), 200.0)],
    ids=["numpy", "torch"],
)
def test_the_encoders_refuse_a_float_frame_far_outside_0_1(frame: Any) -> None:
    """to_rgb24, which every encoder and the file transport read by, applies the same rule."""
    dtype = "float32" if isinstance(frame, np.ndarray) else "torch.float32"
    with pytest.raises(
        CodecError,
        match=rf"^stream 'v': {RANGE_RULE}, got {dtype} values in \[200, 200\]$",
    ):
        to_rgb24(frame, stream="v")


def test_a_threaded_run_reads_a_float_frames_range_on_the_first_then_on_a_sample() -> None:
    """FrameCheck: the range on the first frame of a shape, then every `every`-th; the layout
    rules on every new type, shape or dtype; a refused frame is never taken as known."""
    good, bad = np.full((H, W, 3), 0.5), np.full((H, W, 3), 255.0)
    check = FrameCheck(every=4)
    assert check(good) is None
    assert [check(bad) for _ in range(3)] == [None, None, None]  # not sampled: the encoder sees
    assert check(bad) == (
        "a float frame must be in [0, 1] (scale it, or make it uint8), got float64 values in "
        "[255, 255]"
    )
    assert check(bad) is not None  # refused: the next is checked afresh
    assert check(np.zeros((1, H, W, 3), np.uint8)) == f"{SHAPE_RULE}, got shape (1, 32, 48, 3)"


def test_a_live_run_fails_on_a_float_frame_from_its_first_frame(ctx: rxstream.Context) -> None:
    """A threaded run of 0..255 float frames to an h264 sink fails, naming the maker."""
    pipeline = painted(ctx, np.full((H, W, 3), 255.0))
    pipeline.start()
    try:
        with pytest.raises(rxstream.PipelineError) as failed:
            pipeline.wait(timeout=30)
    finally:
        pipeline.stop()
    assert str(failed.value.__cause__).endswith(
        "got float64 values in [255, 255] from stage 'paint'"
    )


# --- shape, dtype, type: what drive(), the self test and a headless run now see ------------


@pytest.mark.parametrize(
    ("frame", "got"),
    [
        (np.zeros((1, H, W, 3), np.uint8), f"{SHAPE_RULE}, got shape (1, 32, 48, 3)"),
        (
            np.zeros((H, W, 3), np.int64),
            "a frame's dtype must be uint8 or floating point (read as [0, 1]), got int64",
        ),
        ("frame", "a frame must be a numpy array or a torch tensor, got str"),
    ],
    ids=["shape", "dtype", "type"],
)
def test_drive_checks_a_codec_sinks_payload_as_its_codec_reads_it(
    ctx: rxstream.Context, frame: Any, got: str
) -> None:
    """drive() (which encodes nothing) refuses what the codec could not take, naming the maker."""
    message = refusal(ctx, painted(ctx, frame))
    assert message == f"stream 'video': {got} from stage 'paint'"


def test_the_maker_is_the_last_stage_that_may_change_the_payload(ctx: rxstream.Context) -> None:
    """tap, pace and merge hand payloads on: the message names the pipe before them."""
    bad = np.zeros((1, H, W, 3), np.uint8)
    pipeline = (
        ctx.source(range(100), name="counter")
        | ctx.pipe(lambda _: bad, name="paint")
        | ctx.tap(lambda _: None, name="look")
        | ctx.pace(fps=30)
        | ctx.stream("video", codec="h264")
    )
    assert refusal(ctx, pipeline).endswith("got shape (1, 32, 48, 3) from stage 'paint'")


def test_an_unbatch_hands_on_the_frames_of_the_stage_that_made_the_batch(
    ctx: rxstream.Context,
) -> None:
    """An unbatch splits a batch another stage made: the message names that stage."""
    batch = np.full((2, H, W, 3), 200.0, np.float32)
    pipeline = (
        ctx.source(range(100), name="counter")
        | ctx.pipe(lambda _: batch, name="render")
        | ctx.unbatch()
        | ctx.stream("video", codec="jpeg")
    )
    assert refusal(ctx, pipeline).endswith("got float32 values in [200, 200] from stage 'render'")


def test_a_source_that_makes_the_payload_is_named(ctx: rxstream.Context) -> None:
    """A bad payload straight from a source names the source."""
    pipeline = ctx.source(lambda: "frame", name="frames") | ctx.stream("video", codec="jpeg")
    assert refusal(ctx, pipeline).endswith("got str from stage 'frames'")


def test_producer_of_skips_boundary_and_pass_through_stamps() -> None:
    """The maker is read from the stamps: a boundary's and a pace's are skipped."""
    timeline = (
        ("counter.in", 0.0),
        ("counter.out", 0.1),
        ("paint.in", 0.2),
        ("paint.out", 0.3),
        ("paint>pace.in", 0.4),
        ("paint>pace.out", 0.5),
        ("pace.in", 0.6),
        ("pace.out", 0.7),
    )
    kinds = {
        "counter": SOURCE_KIND,
        "paint": PIPE_KIND,
        "pace": PACE_KIND,
        "video": STREAM_KIND,
    }
    assert producer_of(timeline, kinds) == "paint"
    assert producer_of((), kinds) is None


def test_without_timing_the_message_names_the_sink_only() -> None:
    """timing=False leaves no stamps: the refusal still says the stream, the rule and the value."""
    ctx = rxstream.Context(timing=False)
    message = refusal(ctx, painted(ctx, np.zeros((1, H, W, 3), np.uint8)))
    assert message == f"stream 'video': {SHAPE_RULE}, got shape (1, 32, 48, 3)"


def test_the_self_test_fails_on_a_frame_its_sink_cannot_encode(ctx: rxstream.Context) -> None:
    """A self test that drives a bad frame to an h264 sink fails, naming sink and maker."""
    pipeline = painted(ctx, np.zeros((1, H, W, 3), np.uint8))
    with pytest.raises(rxstream.SelfTestError) as failed, ctx.self_test():
        pipeline.drive(frames=1)
    assert str(failed.value) == (
        "self test failed: PipelineError: stage 'video' failed on item pts=0 input_seq=0: "
        f"CodecError: stream 'video': {SHAPE_RULE}, got shape (1, 32, 48, 3) from stage 'paint'"
    )


def resized(ctx: rxstream.Context, codec: str) -> rxstream.Pipeline:
    """counter -> paint (a 48x32 frame, then 96x64 from the third) -> the ``video`` sink."""
    return (
        ctx.source(range(100), name="counter")
        | ctx.pipe(
            lambda i: np.zeros((H, W, 3) if i < 2 else (2 * H, 2 * W, 3), np.uint8), name="paint"
        )
        | ctx.stream("video", codec=codec)
    )


def test_an_h264_frame_of_another_size_fails_the_drive_naming_the_item_and_the_stage(
    ctx: rxstream.Context,
) -> None:
    """An h264 stream keeps its first frame's size (the page's and the file's encoders do): a
    frame of another size is refused by the sink in a drive too, as it would be live."""
    with pytest.raises(rxstream.PipelineError) as failed:
        resized(ctx, "h264").drive(frames=3)
    assert str(failed.value) == (
        "stage 'video' failed on item pts=2 input_seq=0: CodecError: stream 'video': every "
        "h264 frame must have the first frame's size 48x32 (WxH), got 96x64 from stage 'paint'"
    )


def test_a_jpeg_stream_may_change_its_frame_size(ctx: rxstream.Context) -> None:
    """A jpeg frame stands alone: a jpeg stream's frames may change size."""
    assert len(resized(ctx, "jpeg").drive(frames=3)) == 3


def test_a_raw_sink_still_carries_any_payload(ctx: rxstream.Context) -> None:
    """A raw sink (the default) is not checked: a drive may carry ints, strings, lists."""
    pipeline = ctx.source([1, "two", [3]], name="values") | ctx.stream("video")
    assert pipeline.drive(frames=3) == [1, "two", [3]]


def test_a_raw_stream_the_file_encoder_refuses_names_the_maker(tmp_path: Path) -> None:
    """--out's encoder refusing a raw stream's frame: the sink adds the stage that made it."""
    ctx = rxstream.Context(transport=FileTransport(tmp_path / "out.mp4", fps=20))
    pipeline = painted(ctx, np.zeros((1, H, W, 3), np.uint8), codec="raw")
    pipeline.start()
    try:
        with pytest.raises(rxstream.PipelineError) as failed:
            pipeline.wait(timeout=30)
    finally:
        pipeline.stop()
    assert str(failed.value.__cause__) == (
        f"stream 'video': {SHAPE_RULE}, got shape (1, 32, 48, 3) from stage 'paint'"
    )


_BAD_SHAPE_APP = """
import numpy as np

def build(ctx):
    def paint(index):
        return np.zeros((1, 32, 48, 3), dtype=np.uint8)

    return (
        ctx.source(range(1000), name="counter")
        | ctx.pipe(paint, name="paint")
        | ctx.stream("video", codec="h264")
    )
"""


def test_a_headless_run_of_a_frame_its_sink_cannot_encode_exits_1_naming_it(
    tmp_path: Path,
) -> None:
    """`rxstream run app.py --frames 5` (no --out) exits 1 with one line naming sink and maker."""
    app = tmp_path / "app.py"
    app.write_text(_BAD_SHAPE_APP)
    done = subprocess.run(
        [sys.executable, "-m", "rxstream", "run", str(app), "--frames", "5"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "rxstream run: stage 'video' failed on item pts=0 input_seq=0: CodecError: "
        f"stream 'video': {SHAPE_RULE}, got shape (1, 32, 48, 3) from stage 'paint'"
    )


_RAW_ON_RANK_1_APP = """
import numpy as np

def build(ctx):
    def paint(index):
        return np.zeros((1, 32, 48, 3), dtype=np.uint8)

    return (
        ctx.source(range(1000), name="counter", rank=0)
        | ctx.pipe(paint, name="paint", rank=1)
        | ctx.stream("video", rank=1)
    )
"""


@pytest.mark.slow
def test_out_refusing_a_raw_frame_from_rank_1_names_the_item_and_the_maker(
    tmp_path: Path,
) -> None:
    """A raw sink on rank 1 whose frame rank 0's --out encoder refuses: the same one line as
    on one rank, naming the sink, the item and the stage that made the frame."""
    app = tmp_path / "app.py"
    app.write_text(_RAW_ON_RANK_1_APP)
    out = str(tmp_path / "out.mp4")
    done = subprocess.run(
        [sys.executable, "-m", "rxstream", "run", str(app), "--ranks", "2", "--out", out],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "rxstream run: stage 'video' failed on item pts=0 input_seq=0: CodecError: "
        f"stream 'video': {SHAPE_RULE}, got shape (1, 32, 48, 3) from stage 'paint'"
    )


# --- a source that sends its frames as one payload -------------------------------------------

FRAMES = [np.zeros((H, W, 3), np.uint8) for _ in range(48)]


def hints(logs: list[MutableMapping[str, Any]]) -> list[str]:
    """The hints of the ``source_payload_is_a_batch`` warnings in captured logs."""
    return [
        line["event"]
        for line in logs
        if line.get("code") == "source_payload_is_a_batch" and line["log_level"] == "warning"
    ]


def test_a_frame_function_returning_a_list_of_frames_is_hinted_once(
    ctx: rxstream.Context,
) -> None:
    """`ctx.source(lambda: frames)` logs one warning naming the source and saying what to do."""
    pipeline = ctx.source(lambda: FRAMES, name="frames") | ctx.stream("video")
    with structlog.testing.capture_logs() as logs:
        payloads = pipeline.drive(frames=3)
    assert [len(payload) for payload in payloads] == [48, 48, 48]  # the list, repeated
    assert hints(logs) == [
        "source 'frames' returned a list of 48 ndarrays as one payload, which repeats on every "
        "pull; return iter(...) of it or yield each frame to send them one by one, or put "
        "ctx.unbatch() after the source"
    ]


def test_a_generator_yielding_a_list_of_tensors_is_hinted(ctx: rxstream.Context) -> None:
    """A generator that yields its frames as one list (of tensors) is hinted, once."""
    tensors = [torch.zeros(3, H, W) for _ in range(4)]

    def frames() -> Iterator[list[torch.Tensor]]:
        while True:
            yield tensors

    pipeline = ctx.source(frames) | ctx.stream("video")
    with structlog.testing.capture_logs() as logs:
        pipeline.drive(frames=2)
    assert hints(logs) == [
        "source 'frames' yielded a list of 4 Tensors as one payload; yield each frame (yield "
        "from it) to send them one by one, or put ctx.unbatch() after the source"
    ]


@pytest.mark.parametrize(
    "payload",
    [
        [1, 2, 3],
        ["a", "b"],
        (np.zeros((H, W, 3), np.uint8), np.zeros((H, W), np.uint8)),  # frame and mask
        [np.zeros(4), np.zeros(4)],  # 1-D: samples, not frames
        [np.zeros((H, W, 3), np.uint8)],  # one
    ],
    ids=["ints", "strings", "frame-and-mask", "vectors", "one"],
)
def test_a_source_of_lists_that_are_not_a_batch_of_frames_is_not_hinted(
    ctx: rxstream.Context, payload: Any
) -> None:
    """Lists of non-frames, a tuple of unlike arrays and a list of one are legitimate payloads."""
    pipeline = ctx.source(lambda: payload, name="values") | ctx.stream("video")
    with structlog.testing.capture_logs() as logs:
        pipeline.drive(frames=1)
    assert hints(logs) == []


def test_a_source_that_feeds_an_unbatch_is_not_hinted(ctx: rxstream.Context) -> None:
    """A list of frames into ctx.unbatch() is a batch on purpose: no hint, every frame egresses."""
    pipeline = (
        ctx.source(lambda: FRAMES, name="frames")
        | ctx.unbatch()
        | ctx.stream("video", codec="h264")
    )
    with structlog.testing.capture_logs() as logs:
        payloads = pipeline.drive(frames=1)
    assert len(payloads) == 48
    assert hints(logs) == []


@pytest.mark.parametrize(
    "frame",
    [
        torch.rand(3, H, W).half(),
        torch.rand(H, W, 3).bfloat16(),
        np.random.default_rng(0).random((H, W), np.float32).astype(np.float16),
    ],
    ids=["torch-half", "torch-bfloat16", "numpy-half"],
)
def test_half_precision_frames_in_range_pass_the_check(frame: Any) -> None:
    """FrameCheck reads the range of half and bfloat16 frames (numpy and torch) as the encoder."""
    assert FrameCheck()(frame) is None
    assert FrameCheck()(frame * 255) is not None
