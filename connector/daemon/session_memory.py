""":class:`SessionMemory`: the daemon's shared memory as one client's session maps it (a client
over the daemon's Unix socket, on its node; a TCP client maps nothing and moves pages with
:meth:`~connector.daemon.client.DaemonStore.read_pages` and
:meth:`~connector.daemon.client.DaemonStore.write_pages`).

The session's segments come from the lane socket the handshake names
(:func:`.lane.map_segments`): the host tier's slab, which the client maps read-only, and its own
staging area, which it maps read-write. A load handle's ``slab`` is the slab mapping: the worker
copies straight out of the daemon's slots. A store handle's ``slab`` is the staging area: the
worker writes its rows, and the daemon copies them into the slab at ``complete_store`` (so no
client can change what another loads, see :mod:`.shm`). :meth:`SessionMemory.register_for_dma`
page-locks both mappings for a CUDA cache (lazy, CUDA only). A reconnect maps the restarted
daemon's new segments at the old addresses (see :mod:`.shm`).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

from connector.daemon.errors import DaemonUnavailable
from connector.daemon.lane import map_segments
from connector.daemon.peer_memory import segments
from connector.daemon.shm import SharedSlab
from kvstore.errors import InvalidArgument

#: cudaHostRegisterReadOnly: the slab is mapped read-only, and CUDA only reads it
_CUDA_HOST_REGISTER_READ_ONLY = 0x08


class SessionMemory:
    """The slab (``slab``, read-only) and this session's staging area (``stage``) as mapped by
    one client, None until mapped (and for a TCP session); ``slab_pages``, ``page_bytes`` and
    ``stage_rows`` as of the last handshake (:class:`~connector.daemon.session.Session` sets
    them). ``layout_page_bytes``: the client's layout's, which a remap must match."""

    def __init__(self) -> None:
        self.slab: SharedSlab | None = None  # read-only
        self.stage: SharedSlab | None = None  # this session's staging area
        #: the process the daemon may copy to and from for this session (peer copy); 0: none
        self.peer_pid = 0
        self.slab_pages = 0
        self.page_bytes = 0
        self.stage_rows = 0
        self.layout_page_bytes = 0
        self.dma = False  # the mappings are registered with CUDA (cudaHostRegister)

    def map(self, info: Any, connect_timeout_s: float) -> None:
        """Map the new session's slab (read-only) and staging area, or remap them in place
        after a reconnect. A TCP session has none."""
        if not info.shm_socket:
            return
        m = map_segments(info.shm_socket, info.session_id, connect_timeout_s)
        slab_fd, slab_bytes, stage_fd, stage_bytes, stage_rows = (
            m.slab_fd, m.slab_bytes, m.staging_fd, m.staging_bytes, m.staging_rows)
        # the daemon reads and writes this process (the pid it saw): a forked child must not
        # name its addresses under this session
        self.peer_pid = os.getpid() if m.peer_copy else 0
        try:
            if slab_bytes != info.shm_bytes or stage_rows != info.staging_pages:
                raise DaemonUnavailable("the daemon's shared memory does not match its handshake")
            if self.slab is None or self.stage is None:
                self.slab = SharedSlab.attach(slab_fd, slab_bytes, writable=False, name="slab")
                self.stage = SharedSlab.attach(stage_fd, stage_bytes, writable=True, name="staging")
            elif (slab_bytes, stage_bytes) != (self.slab.nbytes, self.stage.nbytes) or \
                    info.layout.page_bytes != self.layout_page_bytes:
                raise DaemonUnavailable(
                    f"the daemon came back with a {slab_bytes}-byte slab and a {stage_bytes}-byte "
                    f"staging area of {info.layout.page_bytes}-byte pages; this client mapped "
                    f"{self.slab.nbytes} and {self.stage.nbytes}")
            else:
                # CUDA pinned the old segments' pages: DMA through a stale registration would
                # read and write the old daemon's memory, so register the new mappings afresh
                registered = self.dma
                if registered:
                    self.dma_unregister()
                self.slab.remap(slab_fd, "slab")
                self.stage.remap(stage_fd, "staging")
                if registered:
                    self.register_for_dma()
        finally:
            os.close(slab_fd)
            os.close(stage_fd)
        self.stage_rows = stage_rows

    def require(self, call: str) -> None:
        """InvalidArgument unless the slab is mapped: ``call`` moves pages through it."""
        if self.slab is None:
            raise InvalidArgument(f"{call} moves pages through the daemon's shared memory, which "
                                  "a TCP client does not map",
                                  hint="connect over the daemon's Unix socket on its node, or "
                                       "use read_pages / write_pages")

    def slab_view(self) -> np.ndarray:
        """The slab as (pages, page_bytes) rows, read-only; empty without shared memory (TCP)."""
        if self.slab is None:
            return np.empty((0, self.page_bytes), np.uint8)
        return self.slab.array[: self.slab_pages * self.page_bytes].reshape(
            self.slab_pages, self.page_bytes)

    def staging_view(self) -> np.ndarray:
        """This session's staging area as (rows, page_bytes): where saves are written."""
        if self.stage is None:
            return np.empty((0, self.page_bytes), np.uint8)
        return self.stage.array[: self.stage_rows * self.page_bytes].reshape(
            self.stage_rows, self.page_bytes)

    def tensor(self, seg: SharedSlab | None) -> Any:
        """A ``(rows, page_bytes)`` uint8 torch tensor over a mapping. Made from the mapping's
        memory directly: torch takes no read-only numpy array (a write to the read-only slab
        would fault; nothing here writes it)."""
        import torch

        view = self.slab_view() if seg is self.slab else self.staging_view()
        if seg is None:
            return torch.from_numpy(view.copy())
        buf = (ctypes.c_uint8 * view.nbytes).from_address(seg.address)
        return torch.frombuffer(buf, dtype=torch.uint8).view(view.shape)

    @property
    def peer_copy(self) -> bool:
        """The daemon copies this process's pages itself (``complete_store(pages=)``,
        ``complete_load(into=)``): one copy, on its copy threads."""
        return self.peer_pid != 0 and self.peer_pid == os.getpid()

    def segments(self, views: list[np.ndarray] | None) -> list[int]:
        """``views`` as the flat (address, length) list the daemon copies by; [] where this
        client copies itself (no views, or no peer copy)."""
        if views is None or not self.peer_copy:
            return []
        return [int(x) for x in segments(views).ravel()]

    def register_for_dma(self) -> None:
        """Page-lock the slab and staging mappings for CUDA copies (cudaHostRegister; the slab
        read-only); CUDA only, lazy. Idempotent; a remap registers the new mappings, and
        :meth:`close` unregisters."""
        import torch

        if self.dma:
            return
        if not torch.cuda.is_available():
            raise InvalidArgument("register_for_dma needs CUDA", hint="a CPU cache needs none")
        if self.slab is None or self.stage is None:
            raise InvalidArgument("this client maps no shared memory (a TCP session)",
                                  hint="connect over the daemon's Unix socket")
        cudart = torch.cuda.cudart()
        rc = cudart.cudaHostRegister(self.slab.address, self.slab.nbytes, _CUDA_HOST_REGISTER_READ_ONLY)
        if int(rc) != 0:
            raise InvalidArgument(f"cudaHostRegister of the shared slab (read-only) failed: {rc}")
        rc = cudart.cudaHostRegister(self.stage.address, self.stage.nbytes, 0)
        if int(rc) != 0:
            cudart.cudaHostUnregister(self.slab.address)
            raise InvalidArgument(f"cudaHostRegister of the staging area failed: {rc}")
        self.dma = True

    def dma_unregister(self) -> None:
        import torch

        assert self.slab is not None and self.stage is not None
        torch.cuda.cudart().cudaHostUnregister(self.slab.address)
        torch.cuda.cudart().cudaHostUnregister(self.stage.address)
        self.dma = False

    def close(self) -> None:
        """Unregister (if registered) and unmap both segments: after the worker using them
        was closed."""
        if self.dma:
            self.dma_unregister()
        for seg in (self.slab, self.stage):
            if seg is not None:
                seg.close()
