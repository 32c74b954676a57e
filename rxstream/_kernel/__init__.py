"""Internal: the kernel every layer above builds on (docs/architecture.md, "Layers").

The item (``rxstream.item``) and the callable aliases (``rxstream.typing``) with, here, a stage's
generations and admission (``_generations``), its shell and counters (``_shell``, ``_stats``), its
inbox's declaration (``_inbox``) and what its scheduler is (``_scheduler``). Nothing here imports
a layer above: the operators, the runtime, the ranks, ``Context``/``Pipeline``.
"""
