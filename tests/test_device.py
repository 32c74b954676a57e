"""``device=``: validated on the builders, and it chooses the boundary at a stage's ends."""

from __future__ import annotations

import pytest
import torch

import rxstream
from rxstream.ipc._cuda import FakeCudaApi
from rxstream.transport import MemoryTransport


@pytest.mark.parametrize("device", [None, "cpu", "cuda", "cuda:0", "cuda:12"])
def test_device_values_are_recorded(device: str | None) -> None:
    """None, "cpu", "cuda" and "cuda:N" are accepted on source and pipe, and kept."""
    ctx = rxstream.Context()
    assert ctx.source([1], device=device).device == device
    assert ctx.pipe(abs, device=device).device == device


@pytest.mark.parametrize("device", ["gpu", "CUDA", "cuda:", "cuda:x", "cuda:01", "", 0])
def test_a_bad_device_is_a_stage_build_error(device: object) -> None:
    """Any other device is refused when the stage is made, naming the stage and the value."""
    ctx = rxstream.Context()
    message = rf"^device must be 'cpu', 'cuda' or 'cuda:N', got {device!r} for stage 'abs'$"
    with pytest.raises(rxstream.StageBuildError, match=message):
        ctx.pipe(abs, device=device)  # type: ignore[arg-type]


def _crossing_run(send: str | None, receive: str | None) -> tuple[list[object], object, int]:
    """A CUDA tensor (on FakeCudaApi) sent from rank 0 to rank 1 between stages on these
    devices: what the sink got, the boundary's CUDA crossing and the bridge calls made."""
    api = FakeCudaApi()
    ctx = rxstream.Context(transport=MemoryTransport(keep=None), cuda_api=api)
    frames = [api.to_device(torch.full((2, 2), i, dtype=torch.float32)) for i in range(3)]
    pipeline = (
        ctx.source(frames, name="render", device=send)
        | ctx.pipe(lambda t: float(t.sum()), name="check", rank=1, device=receive)
        | ctx.stream("out", rank=1)
    )
    pipeline.start()
    try:
        assert pipeline.wait(timeout=30)
        (boundary,) = pipeline._run.boundaries.values()  # type: ignore[union-attr]
        transport = ctx.transport
        assert isinstance(transport, MemoryTransport)
        # a ring boundary's crossing, whatever type the run's boundaries are declared with
        crossing = getattr(boundary, "cuda")  # noqa: B009
        return transport.payloads("out"), crossing, len(api.log)
    finally:
        pipeline.stop()


@pytest.mark.parametrize(("send", "receive"), [("cuda", "cuda:0"), (None, None), ("cuda", None)])
def test_a_cuda_pair_crosses_through_the_cuda_path(send: str | None, receive: str | None) -> None:
    """Between two CUDA stages (or undeclared ones) the boundary carries CUDA tensors through
    the CUDA IPC path: the ring holds refs, the bridge moves the memory."""
    got, crossing, bridge_calls = _crossing_run(send, receive)
    assert got == [0.0, 4.0, 8.0]
    assert crossing is not None
    assert bridge_calls > 0


@pytest.mark.parametrize(("send", "receive"), [("cpu", "cpu"), ("cpu", None), (None, "cpu")])
def test_a_cpu_end_makes_a_ring_only_boundary(send: str | None, receive: str | None) -> None:
    """A stage declared on the CPU at either end: the boundary is the shared-memory ring alone,
    with no CUDA crossing and no call to the CUDA api."""
    got, crossing, bridge_calls = _crossing_run(send, receive)
    assert got == [0.0, 4.0, 8.0]  # FakeCudaApi's "device" tensors are CPU memory: they frame
    assert crossing is None
    assert bridge_calls == 3  # the three to_device calls above, none from the boundary


def test_drive_ignores_device() -> None:
    """drive() runs a CUDA-declared pipeline on the calling thread, on whatever the stage
    functions use: on a machine without CUDA, the CPU."""
    ctx = rxstream.Context()
    pipeline = (
        ctx.source(range(3), device="cuda") | ctx.pipe(abs, device="cuda:1") | ctx.stream("o")
    )
    assert pipeline.drive(frames=3) == [0, 1, 2]
