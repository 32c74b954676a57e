"""Ranks beyond one host, launched by ``torchrun`` (the public names of :mod:`rxstream.ranks`).

A thin re-export, kept so ``from rxstream.distributed import DistChannel`` goes on working:
the code lives in :mod:`rxstream.ranks` (``_torchrun.py``, ``_distboundary.py``,
``_distlaunch.py``; docs/architecture.md, "Ranks"; docs/distributed.md for the whole).
Importing it does not import torch.
"""

from rxstream._util import fixup_module_metadata
from rxstream.ranks._distboundary import DistChannel, RankLost
from rxstream.ranks._distlaunch import BACKEND_ENV, CROSS_HOST_ENV, estimate_offset
from rxstream.ranks._torchrun import (
    TorchrunEnv,
    launch_torchrun,
    loopback_groups,
    open_group,
    torchrun_env,
)

__all__ = [
    "BACKEND_ENV",
    "CROSS_HOST_ENV",
    "DistChannel",
    "RankLost",
    "TorchrunEnv",
    "estimate_offset",
    "launch_torchrun",
    "loopback_groups",
    "open_group",
    "torchrun_env",
]

fixup_module_metadata(__name__, globals())
