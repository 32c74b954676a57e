"""SPMD launch: one app, one process a rank (the public names of :mod:`rxstream.ranks`).

A thin re-export, kept so ``from rxstream.launch import load_app`` goes on working: the code
lives in :mod:`rxstream.ranks` (docs/architecture.md, "Ranks"). Once ``rxstream`` is
imported, ``rxstream.launch`` is the function; import the rest from this module.
"""

from rxstream._exceptions import SettingError
from rxstream._util import fixup_module_metadata
from rxstream.ranks._app import App, load_app
from rxstream.ranks._common import LaunchResult
from rxstream.ranks._launch import launch
from rxstream.ranks._selftest import run_self_test

__all__ = ["App", "LaunchResult", "SettingError", "launch", "load_app", "run_self_test"]

fixup_module_metadata(__name__, globals())
