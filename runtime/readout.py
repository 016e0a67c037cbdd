"""Small transfers between host and device that never queue behind a KV copy: device-to-host
reads behind a save (:class:`HostReadout`), host-to-device uploads behind a load
(:class:`HostUpload`).

A connector saves a step's pages with one DMA per run on the GPU's device-to-host copy engine
(``kvstore.transfer_cuda.CudaTransfer.save_pages``): 4 GiB for a 32K-token Llama-3-8B prompt, about
80 ms on the H200. The copy engine serves its queue in order, across streams and however the
save is cut up: a sampled token read with ``.item()`` or ``.cpu()`` after that save waited for
all of it (measured on the H200: a 2.8 ms read took 78 ms, also with the save cut into 4 MiB
copies). So the engine reads its results through :class:`HostReadout` instead: a kernel (SMs,
not the copy engine) writes them into pinned host memory that the device addresses directly
(CUDA's unified addressing maps every pinned allocation), and the host waits on an event of
the compute stream only.

Loads are the same the other way: a layer-wise load queues every layer's DMAs host-to-device at
once (a 32K-token Llama-3-8B hit: 4 GiB, 80 ms), and a copy from pageable memory larger than the
driver's inline limit (64 KiB) queues behind them -- the token ids of a 16K-token load's first
layer (``LlamaForPagedLM.write_first_layer_kv``) waited for the whole load that way on the H200.
:class:`HostUpload` has a kernel read them out of pinned memory instead: no copy engine's queue
stands in front of them. (Uploading before the load's copies are queued put the upload ahead of
the first copy: a 4K-token hit's critical path.)

On the CPU a read or an upload is a plain copy.
"""

from __future__ import annotations

import numpy as np
import torch


class _CudaArray:
    """``__cuda_array_interface__`` of a pinned host buffer: lets torch view it as a CUDA
    tensor (the pointer is valid on the device under unified addressing)."""

    def __init__(self, host: torch.Tensor) -> None:
        self.__cuda_array_interface__ = {
            "shape": (host.numel(),), "typestr": "|u1", "data": (host.data_ptr(), False),
            "version": 2,
        }


def _pinned_pair(nbytes: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A pinned host buffer of ``nbytes`` and the CUDA view of the same memory."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.as_tensor(_CudaArray(host), device=device)
    if dev.data_ptr() != host.data_ptr():  # no unified addressing: no such view
        raise RuntimeError("pinned host memory is not addressable from the device")
    return host, dev


class HostReadout:
    """Reads small tensors (sampled token ids, a few rows of logits) from ``device`` to the
    host without the copy engines. Not thread-safe: one per engine."""

    def __init__(self, device: torch.device | str, nbytes: int = 1 << 16) -> None:
        self.device = torch.device(device)
        self._host: torch.Tensor | None = None
        self._dev: torch.Tensor | None = None
        if self.device.type == "cuda":
            self._grow(nbytes)

    def _grow(self, nbytes: int) -> None:
        self._host, self._dev = _pinned_pair(nbytes, self.device)

    def argmax(self, rows: torch.Tensor) -> list[int]:
        """Each row's argmax of ``rows`` ``[n, vocab]`` (the first on ties) as host ints: the
        reduction writes its results straight into the pinned buffer -- one kernel fewer than
        :meth:`read` of an argmax, between the last layer and the token on the host (H200:
        0.34 against 0.37 ms for lm_head, argmax and the read from an idle GPU)."""
        if rows.device.type != "cuda":
            return torch.argmax(rows, dim=-1).tolist()
        n = rows.shape[0] * 8
        assert self._host is not None and self._dev is not None
        if n > self._host.numel():
            self._grow(max(n, 2 * self._host.numel()))
            assert self._host is not None and self._dev is not None
        torch.argmax(rows, dim=-1, out=self._dev[:n].view(torch.int64))
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(rows.device))
        done.synchronize()
        return self._host[:n].numpy().view(np.int64).tolist()  # one torch call, not three

    def read(self, t: torch.Tensor) -> torch.Tensor:
        """A CPU copy of ``t`` (numeric dtypes), made by a kernel on the current stream; waits
        for that stream only."""
        if t.device.type != "cuda":
            return t.detach().to("cpu", copy=True)
        n = t.numel() * t.element_size()
        assert self._host is not None and self._dev is not None
        if n > self._host.numel():  # no kernel writes the old buffer: every read waited
            self._grow(max(n, 2 * self._host.numel()))
            assert self._host is not None and self._dev is not None
        dev = self._dev[:n].view(t.dtype).view(t.shape)
        # an elementwise kernel (x * 1 is exact: -0, inf and NaN stay), never copy_ -- a copy_
        # between same-dtype tensors is a cudaMemcpy, i.e. the copy engine this module avoids
        torch.mul(t.detach(), 1, out=dev)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(t.device))
        done.synchronize()
        return self._host[:n].view(t.dtype).view(t.shape).clone()


class HostUpload:
    """Uploads small arrays to ``device`` without the copy engines: the array is written into a
    pinned buffer and a kernel on the current stream copies it out through unified addressing.
    The buffer is rewritten only after the previous upload's kernel ran. Not thread-safe: one
    per engine."""

    def __init__(self, device: torch.device | str, nbytes: int = 1 << 16) -> None:
        self.device = torch.device(device)
        self._host: torch.Tensor | None = None
        self._dev: torch.Tensor | None = None
        self._read: torch.cuda.Event | None = None  # the last upload's kernel has read the buffer
        if self.device.type == "cuda":
            self._grow(nbytes)

    def _grow(self, nbytes: int) -> None:
        self._host, self._dev = _pinned_pair(nbytes, self.device)

    def upload(self, values: np.ndarray) -> torch.Tensor:
        """A device tensor holding ``values`` (a 1-D numeric array), queued on the current
        stream."""
        if self.device.type != "cuda":
            return torch.from_numpy(np.array(values))
        n = values.nbytes
        if self._read is not None:
            self._read.synchronize()  # long done by the next step's upload
        if n > self._host.numel():  # type: ignore[union-attr]
            self._grow(max(n, 2 * self._host.numel()))  # type: ignore[union-attr]
        assert self._host is not None and self._dev is not None
        self._host[:n].numpy().view(values.dtype)[:] = values
        dtype = torch.from_numpy(values[:0]).dtype
        out = torch.empty(values.shape, dtype=dtype, device=self.device)
        # an elementwise kernel, never copy_: that would be a cudaMemcpy on a copy engine
        torch.mul(self._dev[:n].view(dtype), 1, out=out)
        self._read = torch.cuda.Event()
        self._read.record(torch.cuda.current_stream(self.device))
        return out


__all__ = ["HostReadout", "HostUpload"]
