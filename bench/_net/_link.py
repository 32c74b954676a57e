"""Two network namespaces joined by the emulated link: :func:`open_link`.

The server's namespace and the client's each hold one TUN device (``rxnet``) and their
loopback; the server is :data:`SERVER_ADDR`, the client :data:`CLIENT_ADDR`, a point-to-point
pair inside the namespaces only (nothing is added to the host's own network). The forwarder
(``_forward.py``, a process of its own) holds both TUN devices: when it ends they go. Needs
root, ``/dev/net/tun`` and ``ip`` (iproute2).
"""

from __future__ import annotations

import dataclasses
import fcntl
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Literal

from ._spec import LinkSpec, parse

__all__ = ["CLIENT_ADDR", "PREFIX", "SERVER_ADDR", "Link", "missing", "namespaces", "open_link"]

PREFIX = "rxnet-"
"""The namespaces' names: ``rxnet-<pid>-<n>s`` (the server's) and ``…c`` (the client's)."""
SERVER_ADDR = "10.77.0.1"
CLIENT_ADDR = "10.77.0.2"
DEVICE = "rxnet"
_STALE = re.compile(rf"^{PREFIX}(\d+)-\d+[sc]$")
_TUNSETIFF = 0x400454CA
_IFF_TUN, _IFF_NO_PI = 0x0001, 0x1000
_count = itertools.count()
_NO_IPV6 = "for f in all default; do echo 1 > /proc/sys/net/ipv6/conf/$f/disable_ipv6; done"

Side = Literal["server", "client"]


def missing() -> str | None:
    """Why the emulator cannot run here (not root, no /dev/net/tun, no ``ip``), or None."""
    if os.geteuid() != 0:
        return "the network emulator needs root (network namespaces and TUN devices)"
    if not os.path.exists("/dev/net/tun"):
        return "the network emulator needs /dev/net/tun"
    if shutil.which("ip") is None:
        return "the network emulator needs ip (iproute2)"
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


def namespaces() -> list[str]:
    """The network namespaces that exist now, by name."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(ns: str) -> None:
    """End what runs in ``ns`` (the emulator's own: started there by it) and delete it."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    for pid in (int(p) for p in pids.split()):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def remove_stale() -> list[str]:
    """Delete the namespaces of emulators whose process is gone (a crashed run); their names."""
    stale = [ns for ns in namespaces() if (m := _STALE.match(ns)) and not _alive(int(m.group(1)))]
    for ns in stale:
        _remove(ns)
    return stale


def _tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    return fd


class Link:
    """The emulated link while open: its namespaces, addresses, forwarder and the processes
    started in it. Use :func:`open_link`."""

    def __init__(self, tag: str) -> None:
        self.server_ns = f"{PREFIX}{tag}s"
        """The server's namespace (its address :attr:`server_addr`)."""
        self.client_ns = f"{PREFIX}{tag}c"
        """The client's namespace (its address :attr:`client_addr`)."""
        self.server_addr = SERVER_ADDR
        self.client_addr = CLIENT_ADDR
        self.spec = parse("clean")
        """The spec in effect."""
        self._tag = tag
        self._forwarder: subprocess.Popen[str] | None = None
        self._started: list[subprocess.Popen[Any]] = []

    def _namespace(self, side: Side) -> str:
        return self.server_ns if side == "server" else self.client_ns

    def _up(self) -> None:
        fds = []
        try:
            for side, here, there in (
                ("server", SERVER_ADDR, CLIENT_ADDR),
                ("client", CLIENT_ADDR, SERVER_ADDR),
            ):
                ns, name = self._namespace(side), f"rx{self._tag}{side[0]}"  # type: ignore[arg-type]
                _ip("netns", "add", ns)
                _ip("netns", "exec", ns, "sh", "-c", _NO_IPV6)  # its chatter: not our packets
                fds.append(_tun(name))
                _ip("link", "set", "dev", name, "netns", ns)
                _ip("-n", ns, "link", "set", "dev", name, "name", DEVICE)
                _ip("-n", ns, "addr", "add", here, "peer", f"{there}/32", "dev", DEVICE)
                _ip("-n", ns, "link", "set", "dev", DEVICE, "up")
                _ip("-n", ns, "link", "set", "dev", "lo", "up")
            forward = Path(__file__).with_name("_forward.py")
            self._forwarder = subprocess.Popen(
                [sys.executable, str(forward), str(fds[0]), str(fds[1])],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                pass_fds=fds,
            )
        finally:
            for fd in fds:  # the forwarder holds them now: when it ends, the devices go
                os.close(fd)

    def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        forwarder = self._forwarder
        assert forwarder is not None
        assert forwarder.stdin is not None
        assert forwarder.stdout is not None
        forwarder.stdin.write(json.dumps(message) + "\n")
        forwarder.stdin.flush()
        line = forwarder.stdout.readline()
        if not line:
            raise RuntimeError(f"the network emulator's forwarder ended (exit {forwarder.poll()})")
        return json.loads(line)  # type: ignore[no-any-return]

    def set(self, spec: str | LinkSpec) -> LinkSpec:
        """Apply a SPEC from now on (returns once the forwarder applies it); packets already
        in flight keep their times. A blackout's period counts from now."""
        parsed = parse(spec) if isinstance(spec, str) else spec
        fields = {}
        for name in ("up", "down"):
            way = getattr(parsed, name)
            fields[name] = {**dataclasses.asdict(way), "queue_limit_s": way.queue_limit_s}
        self._ask({"cmd": "set", **fields, "seed": parsed.seed})
        self.spec = parsed
        return parsed

    def stats(self) -> dict[str, Any]:
        """Per way (``up``, ``down``): packets and bytes read, sent, drops by reason
        (loss, queue, blackout, udp, tun_full), packets in flight, the longest queue wait."""
        return self._ask({"cmd": "stats"})

    def argv(self, side: Side, argv: Sequence[str]) -> list[str]:
        """``argv`` run in ``side``'s namespace (``ip netns exec``)."""
        return ["ip", "netns", "exec", self._namespace(side), *argv]

    def wrapper(self, side: Side, program: str, folder: Path) -> Path:
        """An executable in ``folder`` that runs ``program`` (with its arguments) in ``side``'s
        namespace: for a launcher that takes a path, e.g. Playwright's
        ``chromium.launch(executable_path=…)``, which then drives the browser over its pipe."""
        path = folder / f"{Path(program).name}-in-{side}-namespace"
        path.write_text(f'#!/bin/sh\nexec {shlex.join(self.argv(side, [program]))} "$@"\n')
        path.chmod(0o755)
        return path

    def popen(self, side: Side, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in ``side``'s namespace; it is killed when the link closes."""
        process = subprocess.Popen(self.argv(side, argv), **kwargs)
        self._started.append(process)
        return process

    def run(
        self, side: Side, argv: Sequence[str], **kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` to its end in ``side``'s namespace (``subprocess.run``'s keywords)."""
        return subprocess.run(self.argv(side, argv), **kwargs)

    def close(self) -> None:
        """End every process started in the link and the forwarder; delete both namespaces."""
        for process in self._started:
            if process.poll() is None:
                process.kill()
            process.wait(10)
            for pipe in (process.stdin, process.stdout, process.stderr):
                if pipe is not None:
                    pipe.close()
        forwarder = self._forwarder
        if forwarder is not None:
            if forwarder.stdin is not None:
                forwarder.stdin.close()
            try:
                forwarder.wait(5)
            except subprocess.TimeoutExpired:
                forwarder.kill()
                forwarder.wait(5)
            if forwarder.stdout is not None:
                forwarder.stdout.close()
        for ns in (self.server_ns, self.client_ns):
            _remove(ns)


@contextmanager
def open_link(spec: str | LinkSpec = "clean") -> Iterator[Link]:
    """The emulated link, with ``spec`` applied, while in ``with``; closed however it ends
    (namespaces deleted, processes ended). Stale namespaces of crashed runs go first."""
    parsed = parse(spec) if isinstance(spec, str) else spec  # a bad spec: nothing made
    reason = missing()
    if reason is not None:
        raise RuntimeError(reason)
    remove_stale()
    link = Link(f"{os.getpid()}-{next(_count)}")
    try:
        link._up()
        link.set(parsed)
        yield link
    finally:
        link.close()
