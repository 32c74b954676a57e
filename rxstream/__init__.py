"""rxstream: a reactive dataflow engine for real-time streaming pipelines, built on RxPY."""

from rxstream._exceptions import (
    DocPathError,
    DocValidationError,
    PipelineError,
    PipelineStateError,
    RxStreamError,
    SelfTestError,
    StageBuildError,
    StageReuseError,
)
from rxstream.context import Context
from rxstream.doc import Doc
from rxstream.ipc import RingSpec
from rxstream.item import PipelineItem, PipelineMetadata, merge_metadata
from rxstream.launch import LaunchResult, launch
from rxstream.pipeline import Pipeline
from rxstream.runtime import InboxSpec, StageStatistics, format_statistics
from rxstream.stage import Stage
from rxstream.topology import Field

__all__ = [
    "Context",
    "Doc",
    "DocPathError",
    "DocValidationError",
    "Field",
    "InboxSpec",
    "LaunchResult",
    "Pipeline",
    "PipelineError",
    "PipelineItem",
    "PipelineMetadata",
    "PipelineStateError",
    "RingSpec",
    "RxStreamError",
    "SelfTestError",
    "Stage",
    "StageBuildError",
    "StageReuseError",
    "StageStatistics",
    "format_statistics",
    "launch",
    "merge_metadata",
]

__version__ = "0.1.0"

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("rxstream"):
        _obj.__module__ = __name__
del _name, _obj
