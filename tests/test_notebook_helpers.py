"""rxstream.notebook: doc-bound widgets, the frame and statistics views, background runs."""

from __future__ import annotations

import dataclasses
import importlib
import io
import itertools
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import torch
from PIL import Image

import rxstream
from rxstream import DocPathError, DocValidationError
from rxstream.notebook import (
    Background,
    FrameTransport,
    FrameView,
    StatsView,
    background,
    encode_frame,
    frame_array,
    stop_all,
    widget,
)
from rxstream.testing import drive
from rxstream.transport import CodecError, MemoryTransport

REPO = Path(__file__).resolve().parents[1]


def endless() -> Iterator[int]:
    yield from itertools.count()


def until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``predicate`` until it holds (or ``timeout`` seconds pass); whether it held."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.fixture(autouse=True)
def no_background_left() -> Iterator[None]:
    """Every test ends with its background runs stopped, whatever it asserted."""
    yield
    stop_all()


# --- import -------------------------------------------------------------------------------


def test_importing_rxstream_does_not_import_ipywidgets() -> None:
    """ipywidgets stays optional: ``import rxstream`` leaves it (and IPython) unimported."""
    code = "import rxstream, sys; print('ipywidgets' in sys.modules, 'IPython' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.split() == ["False", "False"]


def test_missing_ipywidgets_is_an_import_error_that_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without ipywidgets, importing rxstream.notebook says which extra to install."""
    monkeypatch.setitem(sys.modules, "ipywidgets", None)
    monkeypatch.delitem(sys.modules, "rxstream.notebook")
    with pytest.raises(ImportError, match=r"pip install 'rxstream\[notebook\]'"):
        importlib.import_module("rxstream.notebook")


def test_all_is_sorted_and_importable() -> None:
    """rxstream.notebook declares a sorted ``__all__`` whose names all exist."""
    module = importlib.import_module("rxstream.notebook")
    assert list(module.__all__) == sorted(module.__all__)
    assert all(hasattr(module, name) for name in module.__all__)


# --- widget -------------------------------------------------------------------------------


def test_slider_writes_the_doc_and_follows_doc_writes(ctx: rxstream.Context) -> None:
    """Moving a float slider sets the doc path; a doc write moves the slider."""
    doc = ctx.doc("control", defaults={"look": {"gain": 1.0}})
    slider = widget(doc, "look.gain")
    assert (type(slider).__name__, slider.min, slider.max, slider.value) == (
        "FloatSlider",
        0.0,
        2.0,
        1.0,
    )
    assert slider.description == "gain"
    slider.value = 0.25
    assert doc.desired.look.gain.value == 0.25
    version = doc.version
    doc.set(look={"gain": 1.5})
    assert slider.value == 1.5
    assert doc.version == version + 1  # the slider's move was not written back


def test_value_written_through_a_widget_is_what_the_next_frame_uses(
    ctx: rxstream.Context,
) -> None:
    """A frame made after a widget write reads the written value inline."""
    doc = ctx.doc("control", defaults={"gain": 1.0})
    pipeline = (
        ctx.source(range(1, 4))
        | ctx.pipe(lambda t: np.full((2, 2), t * doc.desired.gain.value))
        | ctx.stream("video")
    )
    widget(doc, doc.desired.gain, min=0, max=4).value = 3.0
    assert [frame[0, 0] for frame in drive(pipeline, 3)] == [3.0, 6.0, 9.0]


def test_controls_by_type_and_choices(ctx: rxstream.Context) -> None:
    """An int gets an IntSlider, a bool a checkbox, choices a dropdown; each writes the doc."""
    doc = ctx.doc("control", defaults={"steps": 8, "loop": False, "model": "smooth"})
    steps = widget(doc, "steps")
    loop = widget(doc, "loop")
    model = widget(doc, "model", choices=["smooth", "sharp"])
    assert type(steps).__name__ == "IntSlider"
    assert (steps.min, steps.max, steps.step) == (0, 16, 1)
    assert type(loop).__name__ == "Checkbox"
    assert type(model).__name__ == "Dropdown"
    steps.value, loop.value, model.value = 3, True, "sharp"
    assert rxstream.doc.Snapshot(doc.snapshot()) == {"steps": 3, "loop": True, "model": "sharp"}


def test_text_box_can_steer(ctx: rxstream.Context) -> None:
    """A text box with steer=True writes through doc.steer: a new prompt generation."""
    doc = ctx.doc("control", defaults={"prompt": "a calm sea"})
    text = widget(doc, "prompt", steer=True)
    assert type(text).__name__ == "Text"
    assert text.continuous_update is False
    text.value = "a storm"
    assert doc.desired.prompt.value == "a storm"
    assert ctx.generations.state().prompt == 1


def test_refused_write_puts_the_control_back(ctx: rxstream.Context) -> None:
    """A value the doc's schema refuses raises and leaves both doc and control unchanged."""

    def positive(state: dict[str, Any]) -> None:
        if state["gain"] <= 0:
            raise ValueError(f"gain must be > 0, got {state['gain']}")

    doc = ctx.doc("control", defaults={"gain": 1.0}, schema=positive)
    slider = widget(doc, "gain", min=-1, max=2)
    with pytest.raises(DocValidationError, match=r"gain must be > 0, got -0\.5"):
        slider.value = -0.5
    assert (slider.value, doc.desired.gain.value) == (1.0, 1.0)


def test_doc_write_past_the_slider_widens_it(ctx: rxstream.Context) -> None:
    """A doc value beyond the slider's range widens the range instead of being clamped."""
    doc = ctx.doc("control", defaults={"gain": 1.0})
    slider = widget(doc, "gain")
    doc.set(gain=5.0)
    assert (slider.max, slider.value, doc.desired.gain.value) == (5.0, 5.0, 5.0)


def test_closed_widget_stops_following_the_doc(ctx: rxstream.Context) -> None:
    """After widget.close() a doc write no longer moves it."""
    doc = ctx.doc("control", defaults={"gain": 1.0})
    slider = widget(doc, "gain")
    slider.close()
    doc.set(gain=0.5)
    assert slider.value == 1.0


@pytest.mark.parametrize(
    ("defaults", "path", "options", "error", "message"),
    [
        (
            {"look": {"gain": 1.0}},
            "look",
            {},
            ValueError,
            r"^control\.look is a section, not a value: bind one of its keys \(gain\)$",
        ),
        (
            {"gain": 1.0},
            "gian",
            {},
            DocPathError,
            r"^control\.gian does not exist; the keys there are: gain$",
        ),
        (
            {"prompt": "x"},
            "prompt",
            {"min": 0},
            TypeError,
            r"^min= applies to a number, but control\.prompt is str 'x'$",
        ),
        (
            {"gain": 3.0},
            "gain",
            {"max": 2},
            ValueError,
            r"^control\.gain is 3\.0, outside the slider's min=0\.0 max=2$",
        ),
        (
            {"gain": 1.0},
            "gain",
            {"min": 2, "max": 1},
            ValueError,
            r"^min must be < max, got min=2 max=1 for control\.gain$",
        ),
        (
            {"steps": 4},
            "steps",
            {"step": 0.5},
            TypeError,
            r"^step must be a whole number for the int control\.steps, got 0\.5$",
        ),
        (
            {"size": [1, 2]},
            "size",
            {},
            TypeError,
            r"^widget binds a bool, int, float or str \(or choices=\), "
            r"but control\.size is list \[1, 2\]$",
        ),
        (
            {"model": "smooth"},
            "model",
            {"choices": ["sharp"]},
            ValueError,
            r"^choices must include the current value of control\.model, "
            r"got 'smooth' not in \['sharp'\]$",
        ),
    ],
)
def test_widget_rejects_bad_requests(
    ctx: rxstream.Context,
    defaults: dict[str, Any],
    path: str,
    options: dict[str, Any],
    error: type[Exception],
    message: str,
) -> None:
    """A widget that cannot be made says which path, which rule, and what it got."""
    doc = ctx.doc("control", defaults=defaults)
    with pytest.raises(error, match=message):
        widget(doc, path, **options)


# --- frames -------------------------------------------------------------------------------


def test_frame_array_takes_hwc_uint8_numpy_as_a_copy() -> None:
    """An HWC uint8 array comes back equal but not shared (payloads may be ring views)."""
    frame = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    out = frame_array(frame)
    np.testing.assert_array_equal(out, frame)
    assert not np.shares_memory(out, frame)


def test_frame_array_takes_chw_float_torch() -> None:
    """A CHW float tensor in [0, 1] becomes HWC uint8, scaled to 0..255 and clipped."""
    tensor = torch.zeros(3, 2, 5)
    tensor[0] = 1.0
    tensor[1, 0, 0] = 0.5
    tensor[2] = 1.04  # clipped (far outside [0, 1] is refused)
    out = frame_array(tensor)
    assert (out.shape, out.dtype) == ((2, 5, 3), np.dtype(np.uint8))
    assert out[0, 0].tolist() == [255, 128, 255]
    assert out[1, 4].tolist() == [255, 0, 255]


def test_frame_array_copies_a_uint8_tensor() -> None:
    """A uint8 CPU tensor (which numpy would view in place) comes back as a copy."""
    tensor = torch.full((2, 3, 3), 7, dtype=torch.uint8)
    out = frame_array(tensor)
    tensor.zero_()
    assert out.max() == 7


@pytest.mark.parametrize(
    "payload",
    [
        np.zeros((5, 7), dtype=np.float32),
        np.zeros((3, 5, 7), dtype=np.float64),
        np.zeros((5, 7, 1), dtype=np.uint8),
        np.zeros((5, 7, 4), dtype=np.uint8),
        torch.zeros(1, 3, 5, 7, dtype=torch.bfloat16),
        torch.zeros(5, 7, 3, dtype=torch.uint8),
    ],
    ids=["gray", "chw-numpy", "one-channel", "rgba", "batch-of-one-bf16", "hwc-torch"],
)
def test_frame_array_shapes(payload: Any) -> None:
    """Gray, CHW numpy, one channel, RGBA, a batch of one, HWC torch: all become HxWx3 uint8."""
    out = frame_array(payload)
    assert (out.shape, out.dtype) == ((5, 7, 3), np.dtype(np.uint8))


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ([1, 2], r"^stream 'video': .* got list$"),
        (np.zeros((5, 7, 2)), r"^stream 'video': .* got shape \(5, 7, 2\)$"),
        (np.zeros(5), r"^stream 'video': .* got shape \(5,\)$"),
        (np.zeros((2, 2), dtype=np.uint16), r"^stream 'video': .* got uint16$"),
    ],
)
def test_frame_array_rejects(payload: Any, message: str) -> None:
    """A payload that is not an image says which stream, what was wrong and what it got."""
    with pytest.raises(CodecError, match=message):
        frame_array(payload, stream="video")


@pytest.mark.parametrize(("format", "magic"), [("jpeg", b"\xff\xd8"), ("png", b"\x89PNG")])
def test_encode_frame(format: Any, magic: bytes) -> None:
    """encode_frame writes JPEG or PNG bytes of the frame's size (RGBA too, for JPEG)."""
    data = encode_frame(np.zeros((6, 10, 4), dtype=np.uint8), format)
    assert data.startswith(magic)
    assert Image.open(io.BytesIO(data)).size == (10, 6)


def test_encode_frame_rejects_a_bad_quality() -> None:
    """quality outside 1..100 is refused with the value."""
    with pytest.raises(ValueError, match=r"^quality must be an int from 1 to 100, got 101$"):
        encode_frame(np.zeros((2, 2)), quality=101)


def test_frame_view_as_transport_shows_frames_and_forwards_everything() -> None:
    """In a run, the view's transport shows its stream's frames and tees all to the inner one."""
    inner = MemoryTransport()
    view = FrameView("video", fps=1000)
    ctx = rxstream.Context(transport=view.transport(inner))
    frames = ctx.source([torch.rand(3, 6, 10) for _ in range(3)])
    pipeline = ctx.graph(
        frames | ctx.stream("video"), ctx.source([torch.ones(3, 2, 2)] * 3) | ctx.stream("mask")
    )
    with view:
        assert pipeline.start().wait(10)
        assert view.wait(1, timeout=10)
        assert until(lambda: view.shown >= 1 and view.received == 3)
        newest = frame_array(inner.payloads("video")[-1])
        assert until(lambda: view.last is not None and np.array_equal(view.last, newest))
    assert inner.counts == {"video": 3, "mask": 3}
    assert Image.open(io.BytesIO(view.widget.value)).size == (10, 6)


def test_frame_view_throttles_to_the_newest_frame() -> None:
    """Frames offered faster than ``fps`` replace the waiting one instead of queueing."""
    view = FrameView(fps=0.001)  # one frame, then a slot every 1000 s
    view.update(np.zeros((2, 2)))
    assert view.wait(1, timeout=10)
    for value in range(10):
        view.update(np.full((2, 2), value, dtype=np.uint8))
    view.close()
    assert (view.received, view.shown) == (11, 1)
    assert view.last is not None
    assert view.last.max() == 0


def test_frame_view_from_a_tap(ctx: rxstream.Context) -> None:
    """ctx.tap(view.update) shows a pipeline's frames; a bad frame fails that stage."""
    view = FrameView(fps=1000)
    with view:
        drive(ctx.source(lambda: np.ones((4, 4, 3))) | ctx.tap(view.update) | ctx.stream("v"), 2)
        assert view.wait(1, timeout=10)
    assert view.received == 2
    bad = ctx.source(lambda: np.ones((5, 5, 2))) | ctx.tap(view.update, name="show")
    with pytest.raises(rxstream.PipelineError, match=r"show"):
        drive(bad | ctx.stream("w"), 1)


def test_frame_transport_without_inner_is_connected_until_closed() -> None:
    """With no inner transport it holds run() alive until the run closes it."""
    transport = FrameTransport(FrameView())
    assert transport.connected
    transport.close()
    assert not transport.connected


# --- statistics ---------------------------------------------------------------------------


def test_stats_view_refreshes_itself(ctx: rxstream.Context) -> None:
    """The table redraws on its timer: a run after the view was made shows up in it."""
    pipeline = ctx.source(range(3)) | ctx.pipe(lambda x: x, name="a<b>") | ctx.stream("video")
    with StatsView(pipeline, interval=0.01) as stats:
        assert "no run yet" in stats.widget.value
        drive(pipeline, 3)
        assert until(
            lambda: "<td>a&lt;b&gt;</td><td>pipe</td><td>3</td><td>3</td>" in stats.widget.value
        )


def test_stats_view_rejects_a_bad_interval(ctx: rxstream.Context) -> None:
    """interval must be a positive number of seconds."""
    pipeline = ctx.source(range(1)) | ctx.stream("video")
    with pytest.raises(
        ValueError, match=r"^interval must be a finite number of seconds > 0, got 0$"
    ):
        StatsView(pipeline, interval=0)


# --- background ---------------------------------------------------------------------------


def paced(ctx: rxstream.Context) -> rxstream.Pipeline:
    return ctx.source(endless) | ctx.pace(fps=200) | ctx.stream("video")


def test_background_runs_until_stopped(ctx: rxstream.Context) -> None:
    """background() returns at once with the pipeline running; the with block stops it."""
    with background(paced(ctx), gain=1) as bg:
        assert bg.running
        assert until(lambda: bg.pipeline.statistics()["video"].items_out >= 3)
    assert not bg.running
    assert ctx.control.desired.gain.value == 1


def test_stop_all_stops_every_background_run() -> None:
    """stop_all() (what an interrupt and kernel shutdown call) stops every background run."""
    runs = [background(paced(rxstream.Context())) for _ in range(2)]
    stop_all()
    assert [bg.running for bg in runs] == [False, False]


def test_hold_returns_when_a_finite_run_ends(ctx: rxstream.Context) -> None:
    """hold() blocks the cell until the pipeline completes, and says it did."""
    bg = background(ctx.source(range(5)) | ctx.stream("video"))
    assert bg.hold(10)
    assert not bg.running
    assert ctx.transport.counts == {"video": 5}  # type: ignore[attr-defined]


def test_hold_reraises_a_stage_failure(ctx: rxstream.Context) -> None:
    """A stage that fails in the background raises its PipelineError from hold()."""

    def boom(x: int) -> int:
        raise RuntimeError(f"bad frame {x}")

    bg = background(ctx.source(range(3)) | ctx.pipe(boom) | ctx.stream("video"))
    with pytest.raises(rxstream.PipelineError, match=r"bad frame 0"):
        bg.hold(10)
    assert not bg.running


def test_interrupting_hold_stops_the_pipeline(ctx: rxstream.Context) -> None:
    """A KeyboardInterrupt (a cell interrupt) while hold() waits stops the run and goes on."""
    bg = background(paced(ctx))
    main = threading.main_thread()

    def interrupt_inside_hold() -> None:  # SIGINT only once the main thread waits in hold()
        def holding() -> bool:
            frame = sys._current_frames().get(main.ident or 0)
            while frame is not None:
                if frame.f_code is Background.hold.__code__:
                    return True
                frame = frame.f_back
            return False

        if until(holding):
            signal.pthread_kill(main.ident or 0, signal.SIGINT)

    threading.Thread(target=interrupt_inside_hold, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        bg.hold(30)
    assert not bg.running


@pytest.mark.slow
def test_background_run_is_stopped_at_interpreter_exit(tmp_path: Path) -> None:
    """A script that exits with a background run still going stops it (its transport closes)."""
    closed = tmp_path / "closed"
    script = textwrap.dedent(
        f"""
        import itertools
        import rxstream
        from rxstream.notebook import background
        from rxstream.transport import CodecError, MemoryTransport

        class Marking(MemoryTransport):
            def close(self):
                open({str(closed)!r}, "w").close()

        ctx = rxstream.Context(transport=Marking())
        bg = background(ctx.source(itertools.count()) | ctx.pace(fps=200) | ctx.stream("v"))
        assert bg.running
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60, cwd=REPO)
    assert closed.exists()


@dataclasses.dataclass
class Look:
    """A schema with a choice and a ranged number."""

    model: Literal["smooth", "sharp"] = "smooth"
    speed: float = dataclasses.field(default=1.0, metadata={"min": 0.5, "max": 4.0})


def test_widget_takes_choices_and_ranges_from_a_schema(ctx: rxstream.Context) -> None:
    """A Literal field gives a dropdown, a field's metadata the slider's range (as on the page)."""
    doc = ctx.doc("look", schema=Look)
    dropdown = widget(doc, "model")
    assert (type(dropdown).__name__, list(dropdown.options)) == ("Dropdown", ["smooth", "sharp"])
    slider = widget(doc, "speed")
    assert (slider.min, slider.max) == (0.5, 4.0)
    dropdown.value = "sharp"
    assert doc.desired.model.value == "sharp"
