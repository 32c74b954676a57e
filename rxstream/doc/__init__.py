"""The doc: desired-state control — inline reads, validated writes, ``bind``, generations."""

from rxstream._exceptions import DocPathError, DocValidationError
from rxstream._kernel._generations import Generations, GenerationState
from rxstream._util import fixup_module_metadata
from rxstream.doc._controls import Control, controls
from rxstream.doc._doc import BindFailure, Doc
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

fixup_module_metadata(__name__, globals())
