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
    "rxstream.runtime",
    "rxstream.serve",
    "rxstream.testing",
    "rxstream.timing",
    "rxstream.topology",
    "rxstream.transport",
]

INTERNAL = ["rxstream.operators"]
"""Packages whose ``__all__`` is the interface to the layer above, not a user API."""


@pytest.mark.parametrize("name", PACKAGES + INTERNAL)
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


@pytest.mark.parametrize("name", PACKAGES)
def test_exported_names_say_a_public_module(name: str) -> None:
    """fixup_module_metadata: no exported class or function names a private module."""
    module = importlib.import_module(name)
    for attr in module.__all__:
        value = getattr(module, attr)
        if isinstance(value, (type, types.FunctionType)):
            assert "._" not in value.__module__, f"{name}.{attr}: {value.__module__}"
            assert getattr(importlib.import_module(value.__module__), attr) is value


def test_fixup_module_metadata_prefers_the_shallowest_package() -> None:
    """A class exported by a subpackage and the top level says ``rxstream``; one re-exported
    from another public package keeps that package's name."""
    import rxstream.doc
    import rxstream.testing

    assert rxstream.doc.DocPathError.__module__ == "rxstream"
    assert rxstream.doc.Control.__module__ == "rxstream.doc"
    assert rxstream.testing.MemoryTransport.__module__ == "rxstream.transport"


@pytest.mark.parametrize("name", INTERNAL)
def test_internal_packages_say_so_and_stay_unexported(name: str) -> None:
    """An internal package says so first thing, and no public package hands its names on."""
    module = importlib.import_module(name)
    assert (module.__doc__ or "").startswith("Internal:")
    internal = {id(getattr(module, attr)) for attr in module.__all__}
    for public in PACKAGES:
        exported = importlib.import_module(public)
        for attr in exported.__all__:
            assert id(getattr(exported, attr)) not in internal, f"{public}.{attr}"


def test_runtime_exports_only_what_users_need() -> None:
    """rxstream.runtime's public names are the inbox spec and the statistics; the engine's
    schedulers are private."""
    import rxstream.runtime

    assert rxstream.runtime.__all__ == ["InboxSpec", "StageStatistics", "format_statistics"]
