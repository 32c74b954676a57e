"""The public surface: explicit, sorted ``__all__`` lists whose names say ``rxstream``."""

from __future__ import annotations

import importlib
import types
import typing

import pytest

PACKAGES = [
    "rxstream",
    "rxstream.doc",
    "rxstream.distributed",
    "rxstream.ipc",
    "rxstream.notebook",
    "rxstream.operators",
    "rxstream.runtime",
    "rxstream.testing",
    "rxstream.timing",
    "rxstream.topology",
    "rxstream.transport",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_importable(name: str) -> None:
    """Every public package declares a sorted ``__all__`` whose names all exist."""
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.{attr} is in __all__ but missing"


def test_top_level_all_is_complete() -> None:
    """Every public class or function defined in rxstream is exported from the top level."""
    import rxstream

    public = {
        name
        for name, value in vars(rxstream).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and getattr(value, "__module__", "").startswith("rxstream")
    }
    assert public == set(rxstream.__all__)


def test_reprs_name_the_public_module() -> None:
    """Classes exported at the top level say ``rxstream.X``, not their private module."""
    import rxstream

    for name in rxstream.__all__:
        value = getattr(rxstream, name)
        if isinstance(value, type):
            assert value.__module__ == "rxstream", name
    assert rxstream.transport.MemoryTransport.__module__ == "rxstream.transport"


@pytest.mark.parametrize("name", PACKAGES)
def test_annotations_of_exported_classes_resolve(name: str) -> None:
    """typing.get_type_hints works on every exported class despite the fixed-up __module__."""
    module = importlib.import_module(name)
    for attr in module.__all__:
        value = getattr(module, attr)
        if isinstance(value, type):
            typing.get_type_hints(value)
