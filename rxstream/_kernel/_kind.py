"""``StageKind``: what a stage kind is, declared once beside its operator.

Every layer that treats kinds differently reads this record instead of a set of kind names:
the books (``runtime/_books.py``: which accounting law a stage obeys), the fuser (which stages
may run on their upstream's thread), the run (which stages get a GPU timer, which take a batch
as one), the idle check of a threaded run (which stages hold items between arrivals). A
:class:`~rxstream.stage.Stage` is built with one; a kind given by name alone is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from rxstream._exceptions import StageBuildError
from rxstream._kernel._options import NoOptions

__all__ = ["SHAPES", "Shape", "StageKind"]

Shape = Literal["source", "1:1", "N:1", "1:N", "repeats", "free"]
"""How many items a stage emits for the items it took (the books' laws):

- ``source``: takes no input; each pull that made an item emits it or drops it;
- ``1:1``: emits exactly what it took;
- ``N:1``: each output is at least one item it took (emits at most what it took);
- ``1:N``: each item it took becomes zero or more outputs (a batch split);
- ``repeats``: each item it took goes out once, and a tick with nothing new repeats the last
  (emits at least what it took);
- ``free``: any count (never more dropped than arrived).
"""

SHAPES: tuple[Shape, ...] = get_args(Shape)


@dataclass(frozen=True, slots=True)
class StageKind:
    """One stage kind's declaration: its name and shape, and how the runtime treats it.

    ``shape`` holds with one input; ``fan_in`` with several (``None``: the kind's shape
    whatever the count). ``holds``: it keeps items between arrivals and says how many in
    ``StageCounters.held`` (a run is not idle while it holds one). ``sink``: it egresses and
    so must end a pipeline. ``timed``: it calls the user's function per item (a GPU timer and
    NVTX range around the call). ``fusable``: with one input it may run on its upstream's
    thread (``fuse=True``, and the chains of a driven run). ``passes``: it hands each payload
    on as it came (or its parts, or again), so it is never the stage that made a payload an
    error names (``operators/_sink.py``'s ``producer_of``). ``options``: the class of the
    options its builder gives the stage (``Stage.options``, one of ``_kernel/_options.py``'s
    frozen dataclasses); a stage given another is refused.
    """

    name: str
    shape: Shape
    fan_in: Shape | None = None
    holds: bool = False
    sink: bool = False
    timed: bool = False
    fusable: bool = False
    passes: bool = False
    options: type = NoOptions

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise StageBuildError(f"stage kind name must be an identifier, got {self.name!r}")
        for field, shape in (("shape", self.shape), ("fan_in", self.fan_in)):
            if shape not in SHAPES and not (field == "fan_in" and shape is None):
                raise StageBuildError(
                    f"stage kind {self.name!r}: {field} must be one of {', '.join(SHAPES)}, "
                    f"got {shape!r}"
                )

    def shape_with(self, inputs: int) -> Shape:
        """The kind's shape with ``inputs`` inputs."""
        return self.fan_in if inputs > 1 and self.fan_in is not None else self.shape

    @property
    def is_source(self) -> bool:
        """Whether the kind takes no input."""
        return self.shape == "source"
