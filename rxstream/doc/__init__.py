"""The doc: desired-state control — inline reads, validated writes, ``bind``, generations."""

from rxstream._exceptions import DocPathError, DocValidationError
from rxstream.doc._controls import Control, controls
from rxstream.doc._doc import BindFailure, Doc
from rxstream.doc._generations import Generations, GenerationState
from rxstream.doc._snapshot import Ref, Snapshot

__all__ = [
    "BindFailure",
    "Control",
    "Doc",
    "DocPathError",
    "DocValidationError",
    "GenerationState",
    "Generations",
    "Ref",
    "Snapshot",
    "controls",
]

for _name in ("BindFailure", "Doc", "GenerationState", "Generations", "Ref", "Snapshot"):
    globals()[_name].__module__ = __name__
