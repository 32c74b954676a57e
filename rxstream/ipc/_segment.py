"""The shared-memory segment under a ring, and the two traps of DESIGN §6.

- A view must never outlive the mapping. Leased slots keep the segment's mapping referenced;
  ``ShmRing.close()`` drops the ring's own references and CPython unmaps the memory when the
  last view of it is gone (``SharedMemory.close`` would raise ``BufferError`` instead):
  :meth:`Segment.release`.
- Python 3.11's ``SharedMemory`` registers every segment it attaches to with the process's
  resource tracker, which unlinks it when that process exits. A process with a tracker of its
  own (not a ``multiprocessing`` child of the owner) unregisters after attaching; a spawned
  child shares the owner's tracker, and unregistering there would cancel the owner's own
  registration, so it does not: :meth:`Segment.attach`.
"""

import contextlib
import os
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

__all__ = ["Segment", "tracker_id"]


def tracker_id() -> tuple[int, int] | None:
    """This process's resource tracker, as the (device, inode) of the pipe to it."""
    try:
        resource_tracker.ensure_running()
        fd = resource_tracker.getfd()
        if fd is None:
            return None
        stat = os.fstat(fd)
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino)


class Segment(SharedMemory):
    """A SharedMemory whose mapping outlives ``release()`` while views of it live.

    It touches ``SharedMemory``'s private ``_buf``/``_mmap``/``_fd``/``_name`` (stable from
    3.8 to 3.13): ``close()`` raises ``BufferError`` while a buffer is exported, and so does
    the ``__del__`` of a segment dropped with views alive.
    """

    @classmethod
    def attach(cls, name: str, owner_pid: int, tracker: tuple[int, int] | None) -> "Segment":
        """Open segment ``name``, which ``owner_pid`` created and its ``tracker`` watches.

        On 3.11 opening registers it with this process's resource tracker, which would unlink
        it when this process exits: unregister, unless that tracker is the owner's.
        """
        segment = cls(name=name)
        if owner_pid != os.getpid() and tracker_id() != tracker:
            resource_tracker.unregister(segment.tracked_name, "shared_memory")
        return segment

    @property
    def tracked_name(self) -> str:
        """The name the resource tracker knows the segment by (with its leading slash)."""
        name: str = self.__dict__["_name"]
        return name

    def release(self) -> None:
        """Let go of this process's handle; the memory stays mapped while views of it live.

        CPython unmaps it when the last view (and with it the mmap object) is collected.
        """
        state = self.__dict__
        try:
            self.close()
        except BufferError:
            state["_buf"] = None
            state["_mmap"] = None
            fd = state.get("_fd", -1)
            if fd >= 0:
                state["_fd"] = -1
                os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at shutdown, modules may be half gone
            self.release()
