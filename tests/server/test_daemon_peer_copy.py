"""Peer copy: the daemon reads a client's saved pages from, and writes its loaded pages into,
the client's own memory (process_vm_readv / writev), once the client proved at MAP that the
daemon reads back the probe bytes it named. A client can name only its own memory; a forged
probe, a session without peer copy, memory that is not mapped, segments that do not add up --
each is refused with INVALID_ARGUMENT, publishes nothing, and the daemon keeps serving."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from connector.daemon import DaemonStore
from connector.daemon.lane import HEADER, HELLO, MAP, OK, PEER_COPY, PROBE, SEGMENTS, recv_frame, send_frame
from connector.daemon.peer_memory import IOV_MAX, Peer, PeerMemoryError, probe, segments, transfer
from connector.proto import kvstore_daemon_pb2 as pb
from connector.proto import kvstore_daemon_pb2_grpc as pb_grpc
from kvstore import KVLayout, Namespace
from tests.server.daemon_proc import TINY_LAYOUT, DaemonProc, write_config

LAYOUT = KVLayout(**TINY_LAYOUT)  # type: ignore[arg-type]
NS = Namespace("model", LAYOUT, "peer")

# ----------------------------------------------------------------- the copies themselves

_CHILD = """
import sys, numpy as np
buf = np.frombuffer(bytes(range(256)) * 64, np.uint8).copy()
print(buf.ctypes.data, flush=True)
sys.stdin.readline()            # the parent read and wrote
print(int(buf[:8].sum()), flush=True)
sys.stdin.readline()
"""


def test_reads_and_writes_another_process_then_refuses_once_it_exited() -> None:
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        address = int(child.stdout.readline())
        peer = Peer(child.pid)
        got = np.zeros(16384, np.uint8)
        peer.transfer(segments([got]), np.array([[address, got.nbytes]], np.uint64), write=False)
        assert got.tobytes() == bytes(range(256)) * 64
        assert probe(child.pid, address, bytes(range(16)))
        assert not probe(child.pid, address, bytes(16))  # other bytes: not the process named
        ones = np.ones(8, np.uint8)
        peer.transfer(segments([ones]), np.array([[address, 8]], np.uint64), write=True)
        child.stdin.write("\n")
        child.stdin.flush()
        assert int(child.stdout.readline()) == 8  # the child sees what was written
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(10)
        assert not peer.alive()
        with pytest.raises(PeerMemoryError):
            peer.transfer(segments([got]), np.array([[address, got.nbytes]], np.uint64),
                          write=False)
        peer.close()
    finally:
        child.kill()
        child.wait()


def test_segments_of_any_shape_split_over_threads() -> None:
    rng = np.random.default_rng(3)
    src = rng.integers(0, 256, 9 << 20, np.uint8)
    # 3000 remote pieces of uneven length (more than one call's IOV_MAX), 7 local ones
    cuts = np.sort(rng.choice(np.arange(1, src.nbytes), 2999, replace=False))
    bounds = np.concatenate(([0], cuts, [src.nbytes]))
    remote = np.stack([src.ctypes.data + bounds[:-1], np.diff(bounds)], 1).astype(np.uint64)
    assert len(remote) > IOV_MAX
    dst = np.zeros_like(src)
    lb = np.linspace(0, dst.nbytes, 8).astype(np.int64)
    local = np.stack([dst.ctypes.data + lb[:-1], np.diff(lb)], 1).astype(np.uint64)
    with ThreadPoolExecutor(3) as pool:
        transfer(os.getpid(), local, remote, write=False, pool=pool, threads=3)
    assert np.array_equal(dst, src)
    with pytest.raises(ValueError, match="differ"):
        transfer(os.getpid(), local[:-1], remote, write=False)


def test_memory_that_is_not_mapped_is_an_error_not_a_partial_copy() -> None:
    dst = np.zeros(8192, np.uint8)
    with pytest.raises(PeerMemoryError, match="of 8192 bytes"):
        transfer(os.getpid(), segments([dst]), np.array([[4096, 8192]], np.uint64), write=False)


# ----------------------------------------------------------------- through the daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    with DaemonProc(write_config(tmp_path_factory.mktemp("peer"), disk=None)) as d:
        yield d
        assert d.stop() == 0


def _session(d: DaemonProc, stub: pb_grpc.KVStoreDaemonStub) -> tuple[object, str]:
    stream = stub.OpenSession(pb.OpenSessionRequest())
    return stream, next(stream).session_id


def _map(d: DaemonProc, sid: str, payload: bytes) -> int:
    """MAP over a raw lane connection; the reply's flags (descriptors closed)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(f"{d.socket}.lane")
        send_frame(s, HELLO, sid.encode())
        assert recv_frame(s, 1 << 16)[0] == OK  # type: ignore[index]
        send_frame(s, MAP, payload)
        data, fds, _, _ = socket.recv_fds(s, 1 << 12, 2)
        for fd in fds:
            os.close(fd)
        size, kind = HEADER.unpack(data[: HEADER.size])
        assert kind == OK and size == SEGMENTS.size
        return int(SEGMENTS.unpack(data[HEADER.size:])[3])


def _prepare(stub: pb_grpc.KVStoreDaemonStub, sid: str, n: int) -> tuple[int, list[bytes]]:
    metas = NS.chain(list(range(1000, 1000 + 16 * n))).metas()
    blocks = [pb.Block(key=m.key, parent=m.parent, token_ids=m.token_ids) for m in metas]
    r = stub.PrepareStore(pb.PrepareStoreRequest(session_id=sid, namespace_id=NS.id,
                                                 blocks=blocks), timeout=10)
    assert len(r.slots) == n
    return r.handle_id, [m.key for m in metas]


def _complete(stub: pb_grpc.KVStoreDaemonStub, sid: str, handle: int, segs: list[int]) -> str:
    with pytest.raises(grpc.RpcError) as info:
        stub.CompleteStore(pb.HandleRequest(session_id=sid, namespace_id=NS.id,
                                            handle_id=handle, ok=True, segments=segs), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return str(info.value.details())


def _held(d: DaemonProc, keys: list[bytes]) -> int:
    with DaemonStore(d.target, NS.id) as s:
        return s.lookup(keys).num_blocks


def test_a_forged_probe_gets_no_peer_copy_and_segments_are_refused(daemon: DaemonProc) -> None:
    page = np.random.default_rng(1).integers(0, 256, LAYOUT.page_bytes, np.uint8)
    with grpc.insecure_channel(daemon.target) as ch:
        stub = pb_grpc.KVStoreDaemonStub(ch)
        stream, sid = _session(daemon, stub)
        # bytes that are not at the address named: the daemon cannot tell it reads this client
        assert _map(daemon, sid, PROBE.pack(page.ctypes.data, bytes(16))) == 0
        handle, keys = _prepare(stub, sid, 1)
        msg = _complete(stub, sid, handle, [page.ctypes.data, page.nbytes])
        assert "no peer copy" in msg
        assert _held(daemon, keys) == 0  # nothing published
        assert f"session {sid[:8]}: no peer copy" in daemon.log()  # the operator learns why
        stream.cancel()  # type: ignore[attr-defined]


def test_bad_segments_are_refused_and_publish_nothing(daemon: DaemonProc) -> None:
    pages = np.random.default_rng(2).integers(0, 256, (2, LAYOUT.page_bytes), np.uint8)
    with grpc.insecure_channel(daemon.target) as ch:
        stub = pb_grpc.KVStoreDaemonStub(ch)
        stream, sid = _session(daemon, stub)
        probe_bytes = pages[0, :16].tobytes()
        assert _map(daemon, sid, PROBE.pack(pages.ctypes.data, probe_bytes)) & PEER_COPY
        base, size = pages.ctypes.data, pages.nbytes
        for segs, says in (
                ([4096, size], "memory"),              # not mapped in this process
                ([base, size - 1], "segments"),         # a byte short
                ([base, size, 0], "pairs"),             # not (address, length) pairs
                ([base, 0, base, size], "segments"),    # an empty segment
                ([x for i in range(2 * 4 * LAYOUT.num_layers + 1)  # more pieces than pages need
                  for x in (base + i, 1)], "at most")):
            handle, keys = _prepare(stub, sid, 2)
            assert says in _complete(stub, sid, handle, segs)
            assert _held(daemon, keys) == 0
            if says == "pairs":  # refused before the handle was taken: it is still open
                stub.Abort(pb.HandleRequest(session_id=sid, namespace_id=NS.id,
                                            handle_id=handle), timeout=10)
        # the same session then saves by peer copy, exactly
        handle, keys = _prepare(stub, sid, 2)
        stub.CompleteStore(pb.HandleRequest(session_id=sid, namespace_id=NS.id, handle_id=handle,
                                            ok=True, segments=[base, size]), timeout=10)
        assert _held(daemon, keys) == 2
        stream.cancel()  # type: ignore[attr-defined]
    with DaemonStore(daemon.target, NS.id) as s:
        assert s.peer_copy
        found = s.lookup(keys, lease=True)
        lh = s.prepare_load(NS.id, keys, lease=found.lease)
        out = np.zeros_like(pages)
        assert s.complete_load(lh, into=out) == 2 and np.array_equal(out, pages)
        assert s.stats().open_store_handles == 0


_SAVER = """
import sys, numpy as np
from connector.daemon import DaemonStore
from kvstore import KVLayout, Namespace
from tests.server.daemon_proc import TINY_LAYOUT
layout = KVLayout(**TINY_LAYOUT)
ns = Namespace("model", layout, "peer-faults")
with DaemonStore(sys.argv[1], ns.id) as store:
    assert store.peer_copy
    i = 0
    while True:
        metas = ns.chain([(i * 97 + j) % 30000 for j in range(16 * 8)]).metas()
        h = store.prepare_store(metas)
        pages = [np.frombuffer(m.key * (layout.page_bytes // 16), np.uint8) for m in h.metas]
        store.complete_store(h, pages=pages)
        print(i, flush=True)
        i += 1
"""


def _page_of(key: bytes) -> np.ndarray:
    return np.frombuffer(key * (LAYOUT.page_bytes // 16), np.uint8)


def test_clients_killed_and_stopped_mid_copy_leave_no_handle_and_no_wrong_page(
        daemon: DaemonProc) -> None:
    """Peer-copy savers SIGSTOPped and SIGKILLed while the daemon reads their memory: the
    daemon serves on, holds no handle of theirs, and every page it holds reads back as exactly
    the page its key names."""
    ns = Namespace("model", LAYOUT, "peer-faults")
    root = str(Path(__file__).parents[2])
    saved = 0
    for round_ in range(3):
        child = subprocess.Popen([sys.executable, "-c", _SAVER, daemon.target], cwd=root,
                                 stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, "PYTHONPATH": root})
        try:
            assert child.stdout is not None
            for _ in range(5 + round_ * 5):
                assert child.stdout.readline(), "the saver died"
            os.kill(child.pid, signal.SIGSTOP)
            time.sleep(0.3)
            os.kill(child.pid, signal.SIGCONT)
            child.stdout.readline()
            os.kill(child.pid, signal.SIGKILL)  # mid-save, most likely
        finally:
            child.kill()
            child.wait()
        saved = max(saved, 5 + round_ * 5)
    deadline = time.monotonic() + 10
    with DaemonStore(daemon.target, ns.id) as s:
        while s.stats().open_store_handles and time.monotonic() < deadline:
            time.sleep(0.1)  # the sessions of killed clients end as their streams break
        assert s.stats().open_store_handles == 0
        held = 0
        for i in range(saved):
            keys = ns.chain([(i * 97 + j) % 30000 for j in range(16 * 8)]).keys
            found = s.lookup(keys, lease=True)
            lh = s.prepare_load(ns.id, keys[: found.num_blocks], lease=found.lease)
            out = np.zeros((lh.num_blocks, LAYOUT.page_bytes), np.uint8)
            s.complete_load(lh, into=out)
            for k, page in zip(lh.keys, out):
                assert np.array_equal(page, _page_of(k)), "a wrong page was served"
            held += lh.num_blocks
        assert held > 0
        assert s.stats(check_integrity=True).integrity_error == ""


def test_the_daemon_counts_peer_copied_pages_by_direction_and_result() -> None:
    """In one process (the service is the daemon's domain layer; the copy is a real
    process_vm_readv of this process)."""
    from connector.daemon.shm import SharedSlab
    from kvstore import InvalidArgument, TieredStore
    from kvstore.tiers.host import HostTier
    from server.daemon.service import DaemonService

    slab = SharedSlab.create("test-peer-slab", 8 * LAYOUT.page_bytes)
    store = TieredStore(LAYOUT, [HostTier.build("host", LAYOUT, 8, slab=slab.array)])
    service = DaemonService(store, slab, peer_copy=True)
    try:
        s, _ = service.open_session()
        service.segments(s.id)
        pages = np.random.default_rng(4).integers(0, 256, (2, LAYOUT.page_bytes), np.uint8)
        assert service.attach_peer(s.id, os.getpid(), pages.ctypes.data, pages[0, :16].tobytes())
        metas = NS.chain(list(range(5000, 5000 + 16 * 2))).metas()
        h, _, _ = service.prepare_store(s.id, NS.id, metas, None)
        assert service.complete_store(s.id, NS.id, h.id, True, segments([pages])).stored == 2
        h, _, _ = service.prepare_store(s.id, NS.id, NS.chain(list(range(16 * 2))).metas(), None)
        with pytest.raises(InvalidArgument, match="memory"):
            service.complete_store(s.id, NS.id, h.id, True,
                                   np.array([[4096, pages.nbytes]], np.uint64))
        m = store.metrics
        assert m.value("kvstore_daemon_peer_copy_pages_total", direction="save", result="ok") == 2
        assert m.value("kvstore_daemon_peer_copy_pages_total", direction="save",
                       result="failed") == 2
        service.close_session(s.id)
    finally:
        store.close()
        slab.close()
