"""``rxstream serve``: a session per visitor on warm workers, a queue when they are busy.

The front (:class:`Front`) listens on the public port and gives each visitor a session of
their own on a free worker (a process that imported the app once); see docs/serving.md.
"""

from rxstream._util import fixup_module_metadata
from rxstream.serve._front import Front, ServeOptions
from rxstream.serve._main import serve
from rxstream.serve._worker import WorkerSpec

__all__ = ["Front", "ServeOptions", "WorkerSpec", "serve"]

fixup_module_metadata(__name__, globals())
