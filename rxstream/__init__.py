"""rxstream: a reactive dataflow engine for real-time streaming pipelines, built on RxPY."""

from rxstream._exceptions import (
    AppEntryError,
    ArgumentError,
    ArgumentTypeError,
    DocPathError,
    DocValidationError,
    PipelineError,
    PipelineStateError,
    ResourceError,
    RxStreamError,
    SelfTestError,
    StageBuildError,
    StageReuseError,
    TaskError,
    UnknownInputError,
)
from rxstream._kernel._resources import Resource
from rxstream._util import fixup_module_metadata as _fixup_module_metadata
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
    "AppEntryError",
    "ArgumentError",
    "ArgumentTypeError",
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
    "Resource",
    "ResourceError",
    "RingSpec",
    "RxStreamError",
    "SelfTestError",
    "Stage",
    "StageBuildError",
    "StageReuseError",
    "StageStatistics",
    "TaskError",
    "UnknownInputError",
    "format_statistics",
    "launch",
    "merge_metadata",
]

__version__ = "0.1.0"

_fixup_module_metadata(__name__, globals())
