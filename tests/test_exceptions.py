"""The exception tree: one root, the builtin each error refines as a second base."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

import rxstream
from rxstream import _exceptions
from rxstream._util import lone_surrogate
from rxstream.distributed import RankLost
from rxstream.ipc import RingSpec
from rxstream.topology import ClientStreamLimitExceeded, InvalidSample, SampleRefused

PACKAGE = Path(rxstream.__file__).parent

BUILTIN_RAISES_KEPT = {
    ("ipc/_ring.py", "ValueError"): "a segment that is not the ring its handle describes",
    ("item.py", "TypeError"): "a marker the timeline check catches itself",
    ("operators/_unbatch.py", "TypeError"): "inside a running stage: the PipelineError's cause",
    ("timing/_client.py", "ValueError"): "ClientTiming.to_local before any exchange (documented)",
}
"""``raise ValueError``/``raise TypeError`` left builtin on purpose, and why."""


def test_every_exception_class_is_under_the_root_and_in_the_tree() -> None:
    """Every exception class of the module derives from RxStreamError and appears in the
    module docstring's tree."""
    doc = _exceptions.__doc__ or ""
    for name in _exceptions.__all__:
        value = getattr(_exceptions, name)
        if isinstance(value, type):
            assert issubclass(value, rxstream.RxStreamError), name
            assert re.search(rf"\b{name}\b", doc), f"{name} is missing from the tree"


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (rxstream.ArgumentError, ValueError),
        (rxstream.ArgumentTypeError, TypeError),
        (rxstream.AppEntryError, AttributeError),
        (rxstream.UnknownInputError, LookupError),
        (RankLost, RuntimeError),
        (SampleRefused, ValueError),
        (ClientStreamLimitExceeded, ValueError),
        (InvalidSample, ValueError),
    ],
)
def test_errors_keep_the_builtin_they_refine(error: type[Exception], builtin: type) -> None:
    """``except ValueError`` (or the builtin each refines) still catches them."""
    assert issubclass(error, rxstream.RxStreamError)
    assert issubclass(error, builtin)


def test_rank_lost_pickles_with_its_ranks() -> None:
    """RankLost crosses processes with its ranks and message."""
    lost = pickle.loads(pickle.dumps(RankLost((1, 2), "ranks 1, 2 went away")))
    assert isinstance(lost, RankLost)
    assert lost.ranks == (1, 2)
    assert str(lost) == "ranks 1, 2 went away"
    assert type(lost).__module__ == "rxstream.distributed"


def test_a_bad_argument_is_an_argument_error_with_its_message() -> None:
    """A bad argument raises ArgumentError, message unchanged."""
    with pytest.raises(rxstream.ArgumentError, match=r"^slot_bytes must be >= \d+, got 1$"):
        RingSpec(slot_bytes=1)
    wrong_type = r"^slots must be an int, got 'x' \(str\)$"
    with pytest.raises(rxstream.ArgumentTypeError, match=wrong_type):
        RingSpec(slots="x")  # type: ignore[arg-type]
    ctx = rxstream.Context()
    pipeline = ctx.source([1]) | ctx.stream("out")
    with pytest.raises(ValueError, match=r"^frames must be an int >= 0, got -1$"):
        pipeline.drive(frames=-1)


def test_feeding_an_unknown_input_names_the_inputs() -> None:
    """pipeline.feed of a stream the pipeline lacks: UnknownInputError, unquoted message."""
    ctx = rxstream.Context()
    pipeline = ctx.input("mouse") | ctx.stream("out")
    with pytest.raises(rxstream.UnknownInputError) as caught:
        pipeline.feed("keys", 1)
    assert str(caught.value) == "no input stream 'keys' in this pipeline; its inputs are: mouse"
    assert isinstance(caught.value, LookupError)


def test_no_builtin_value_or_type_error_is_raised_at_users() -> None:
    """Every ``raise ValueError(``/``raise TypeError(`` left in rxstream/ is one listed, with
    its reason, in BUILTIN_RAISES_KEPT."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        for match in re.finditer(r"raise (ValueError|TypeError)\(", text):
            found.add((path.relative_to(PACKAGE).as_posix(), match.group(1)))
    assert found == set(BUILTIN_RAISES_KEPT)


def test_an_app_with_nothing_to_run_is_an_app_entry_error(tmp_path: Path) -> None:
    """load_app of a file with neither build(ctx) nor main(ctx): AppEntryError, which is
    still the AttributeError it was."""
    from rxstream.launch import load_app

    app = tmp_path / "empty_app.py"
    app.write_text("x = 1\n")
    with pytest.raises(rxstream.AppEntryError, match=r"has neither a build\(ctx\) -> Pipeline"):
        load_app(str(app))
    with pytest.raises(AttributeError, match=r"has no callable 'nope'"):
        load_app(f"{app}:nope")


def test_shown_names_a_refused_value_without_a_flood() -> None:
    """One helper names refused values: a short repr as is, a huge int by size, a long repr cut."""
    assert _exceptions.shown("ab") == "'ab'"
    assert _exceptions.shown(10**5000) == "<int of 16610 bits>"
    assert _exceptions.shown(True) == "True"
    cut = _exceptions.shown("x" * 500)
    assert len(cut) == 60
    assert cut == "'" + "x" * 54 + "…xxx'"


def test_a_lone_surrogate_is_found_by_one_check() -> None:
    """lone_surrogate gives the index of the first lone surrogate, None for valid Unicode."""
    assert lone_surrogate("plain") is None
    assert lone_surrogate("caf\u00e9 \U0001f600") is None
    assert lone_surrogate("x\ud800y") == 1
    assert lone_surrogate("\u00e9\udfff") == 1
