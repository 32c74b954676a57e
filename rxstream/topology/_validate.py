"""A deployment against the model's topology: the serving config's ``client_streams``.

The serving config is YAML (a mapping once loaded)::

    client_streams:
      mouse: {max_items: 50}

A deployment may only lower the bound a model declares on a client stream: the declared bound
is the most the stream's consumer can take. :func:`validate_deployment` lists every problem at
once; :func:`client_stream_limits` applies what it accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rxstream._exceptions import DeploymentError
from rxstream.topology._limits import ClientStreamLimits
from rxstream.topology._model import PartitionTopology, walk_driving_problems

__all__ = ["client_stream_limits", "load_serving_config", "validate_deployment"]

_SECTIONS = ("client_streams",)
"""The serving config's top-level keys (a misspelt one would silently apply nothing)."""
_SETTINGS = ("max_items",)


def load_serving_config(path: str | Path) -> Mapping[str, Any] | None:
    """The serving config in the YAML file at ``path`` (``None`` for an empty file)."""
    with open(path, encoding="utf-8") as file:
        try:
            loaded = yaml.safe_load(file)
        except yaml.YAMLError as exc:
            raise DeploymentError([f"the serving config {path} is not valid YAML: {exc}"]) from None
    if loaded is not None and not isinstance(loaded, Mapping):
        raise DeploymentError(
            [f"the serving config must be a mapping, got {type(loaded).__name__} in {path}"]
        )
    return loaded


def validate_deployment(topology: PartitionTopology, config: Mapping[str, Any] | None) -> None:
    """Check ``config`` (the serving config, or ``None``) and ``topology`` together.

    Rejects an unknown top-level section, an unknown edge name, a connection between
    partitions given limits, a setting that is not one, a bound that is not a positive int or
    is above the model's declared one, and every walk-driving violation — all in one
    :class:`~rxstream.topology.DeploymentError`.
    """
    problems = list(walk_driving_problems(topology))
    problems.extend(_client_stream_problems(topology, config))
    if problems:
        raise DeploymentError(problems)


def client_stream_limits(
    topology: PartitionTopology, model_config: Mapping[str, Any] | None
) -> dict[str, ClientStreamLimits]:
    """Each client stream's limits: the model's declaration, with the serving config's
    ``client_streams: {<edge name>: {max_items}}`` applied, as :func:`validate_deployment`
    accepted it (it raises otherwise)."""
    validate_deployment(topology, model_config)
    overrides = _client_streams(model_config)
    limits: dict[str, ClientStreamLimits] = {}
    for conn in topology.client_connections():
        declared = conn.limits if conn.limits is not None else ClientStreamLimits()
        entry = overrides.get(conn.edge_name) or {}
        bound = entry.get("max_items")
        limits[conn.edge_name] = declared if bound is None else declared._replace(max_items=bound)
    return limits


def _client_streams(config: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if not isinstance(config, Mapping):
        return {}
    streams = config.get("client_streams")
    return streams if isinstance(streams, Mapping) else {}


def _client_stream_problems(
    topology: PartitionTopology, config: Mapping[str, Any] | None
) -> list[str]:
    if config is None:
        return []
    if not isinstance(config, Mapping):
        return [f"the serving config must be a mapping, got {type(config).__name__}"]
    problems = [
        f"{key} is not a section of the serving config (sections: {', '.join(_SECTIONS)})"
        for key in config
        if key not in _SECTIONS
    ]
    streams = config.get("client_streams")
    if streams is None:
        return problems
    if not isinstance(streams, Mapping):
        return [
            *problems,
            "client_streams must be a mapping of edge name -> {max_items: N}, "
            f"got {type(streams).__name__}",
        ]
    clients = {conn.edge_name: conn for conn in topology.client_connections()}
    others = {conn.edge_name: conn for conn in topology.connections if not conn.is_client_stream}
    known = ", ".join(clients) or "none"
    for name, entry in streams.items():
        if name in others:
            conn = others[name]
            problems.append(
                f"client_streams.{name} is a connection from partition "
                f"{conn.from_partition!r} to {conn.to_partition!r}: only a client stream "
                f"takes limits (client streams: {known})"
            )
            continue
        if name not in clients:
            problems.append(
                f"client_streams.{name} is not a client stream of the model "
                f"(client streams: {known})"
            )
            continue
        if not isinstance(entry, Mapping):
            problems.append(
                f"client_streams.{name} must be a mapping like {{max_items: N}}, got {entry!r}"
            )
            continue
        for key in entry:
            if key not in _SETTINGS:
                problems.append(
                    f"client_streams.{name}.{key} is not a setting "
                    f"(settings: {', '.join(_SETTINGS)})"
                )
        bound = entry.get("max_items")
        if bound is None:
            continue
        if isinstance(bound, bool) or not isinstance(bound, int):
            problems.append(f"max_items must be an int, got {bound!r} for client stream {name!r}")
            continue
        if bound <= 0:
            problems.append(f"max_items must be > 0, got {bound} for client stream {name!r}")
            continue
        limits = clients[name].limits
        declared = None if limits is None else limits.max_items
        if declared is not None and bound > declared:
            problems.append(
                f"max_items must be <= {declared} (declared by the model), got {bound} "
                f"for client stream {name!r}"
            )
    return problems
