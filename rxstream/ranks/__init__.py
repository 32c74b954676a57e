"""Ranks: the code that runs one pipeline over several processes (docs/architecture.md).

Private modules; the public names are re-exported by :mod:`rxstream.launch` and
:mod:`rxstream.distributed`.
"""
