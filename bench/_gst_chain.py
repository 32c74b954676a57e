"""The GStreamer leg of bench/peers.py: ``appsrc ! (queue ! identity) x4 ! appsink``.

Run by Debian's ``/usr/bin/python3`` (the ``python3-gst-1.0`` bindings are built for it, not
for the project's virtual environment) as a child of ``bench/peers.py``, which sends one
command a line on stdin and reads one JSON answer a line from stdout, so the two chains are
measured interleaved, repetition by repetition:

- ``latency TRIPS``: seconds per hop of each round trip, one buffer in flight: this thread
  pushes a buffer into ``appsrc`` and pulls it from ``appsink``. 6 thread hops, as in
  bench/hop.py: this thread → appsrc's streaming thread → the 4 queues' threads → this thread.
- ``throughput ITEMS CAPACITY``: buffers per second with a backlog: a thread pushes ``ITEMS``
  buffers as fast as ``appsrc`` (``block=true``) takes them, this one pulls them from
  ``appsink``; every queue holds at most ``CAPACITY`` buffers.
- ``quit``.

Every stage is a ``queue`` (a thread of its own) then an ``identity`` (a pass-through in C):
the chain of bench/hop.py (a source thread, 4 pass-through stage threads), in C elements.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from typing import Any

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstApp", "1.0")
from gi.repository import Gst, GstApp  # noqa: E402  (after require_version)

STAGES = 4
HOPS = STAGES + 2
TIMEOUT_NS = 10 * 1_000_000_000
_perf = time.perf_counter


def chain(capacity: int) -> tuple[Any, Any, Any]:
    """The pipeline, its appsrc and its appsink, playing."""
    queue = f"queue max-size-buffers={capacity} max-size-bytes=0 max-size-time=0"
    stages = " ! ".join(f"{queue} ! identity silent=true" for _ in range(STAGES))
    pipeline = Gst.parse_launch(
        f"appsrc name=src block=true max-buffers={capacity} max-bytes=0 ! {stages} ! "
        f"appsink name=sink sync=false max-buffers={capacity} emit-signals=false"
    )
    src, sink = pipeline.get_by_name("src"), pipeline.get_by_name("sink")
    assert isinstance(src, GstApp.AppSrc)
    assert isinstance(sink, GstApp.AppSink)
    pipeline.set_state(Gst.State.PLAYING)
    return pipeline, src, sink


def stop(pipeline: Any, src: Any) -> None:
    src.end_of_stream()
    pipeline.set_state(Gst.State.NULL)


def pull(sink: Any) -> Any:
    sample = sink.try_pull_sample(TIMEOUT_NS)
    if sample is None:
        raise RuntimeError("appsink gave nothing within 10 s")
    return sample


def latency(trips: int, warmup: int = 20) -> list[float]:
    pipeline, src, sink = chain(2)
    payload = bytes(8)
    samples = []
    try:
        for index in range(warmup + trips):
            buffer = Gst.Buffer.new_wrapped(payload)
            started = _perf()
            src.push_buffer(buffer)
            pull(sink)
            elapsed = _perf() - started
            if index >= warmup:
                samples.append(elapsed / HOPS)
    finally:
        stop(pipeline, src)
    return samples


def throughput(items: int, capacity: int) -> float:
    pipeline, src, sink = chain(capacity)
    payload = bytes(8)
    gate = threading.Event()

    def push() -> None:
        gate.wait()
        for _ in range(items):
            src.push_buffer(Gst.Buffer.new_wrapped(payload))

    pusher = threading.Thread(target=push, daemon=True)
    pusher.start()
    time.sleep(0.02)  # the pusher is up and waiting, as bench/hop.py lets its threads start
    try:
        started = _perf()
        gate.set()
        for _ in range(items):
            pull(sink)
        elapsed = _perf() - started
        pusher.join()
    finally:
        stop(pipeline, src)
    return items / elapsed


def main() -> None:
    Gst.init(None)
    print(json.dumps({"ready": Gst.version_string()}), flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "quit":
            return
        if command == "latency":
            samples = latency(int(args[0]))
            answer: dict[str, Any] = {"p50": statistics.median(samples)}
        elif command == "throughput":
            answer = {"items_s": throughput(int(args[0]), int(args[1]))}
        else:
            answer = {"error": f"unknown command {command!r}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
