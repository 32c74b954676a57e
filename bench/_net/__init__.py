"""The project's own network emulator, for tests and benches (this kernel has no ``netem``).

``open_link(SPEC)`` makes two network namespaces, the server's and the client's, joined by a
link of TUN devices and a forwarder process that applies each way's delay, random loss, rate
cap with its drop-tail queue, blackouts and UDP dropping (SPEC: see ``bench/_net/_spec.py``)::

    with open_link("rtt=40ms,loss=3%") as link:
        server = link.popen("server", ["python", "-m", "http.server", "--bind", link.server_addr])
        link.run("client", ["curl", f"http://{link.server_addr}:8000/"])
        link.set("rtt=40ms,rate=250kbit,queue=1s")  # from now on
"""

from ._link import CLIENT_ADDR, PREFIX, SERVER_ADDR, Link, missing, namespaces, open_link
from ._spec import LinkSpec, WaySpec, parse

__all__ = [
    "CLIENT_ADDR",
    "PREFIX",
    "SERVER_ADDR",
    "Link",
    "LinkSpec",
    "WaySpec",
    "missing",
    "namespaces",
    "open_link",
    "parse",
]
