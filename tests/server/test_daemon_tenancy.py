"""Tenancy below the API (issue 33, item 3): a client of the shared memory cannot change what
another client loads. Clients get the slab as a sealed descriptor and map it read-only; each
session writes its saves into a staging area of its own, which the daemon copies into the slab.
Every attack here is a real one, made from a real client process's own descriptors."""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from connector.daemon import DaemonStore
from connector.daemon.lane import map_segments
from kvstore import KVLayout, Namespace
from tests.server.daemon_proc import ROOT, TINY_LAYOUT, DaemonProc, write_config

LAYOUT = KVLayout(**TINY_LAYOUT)
VICTIM = Namespace("model", LAYOUT, "victim")
ATTACKER = Namespace("model", LAYOUT, "attacker")
_FALLOC_FL_PUNCH_HOLE_KEEP_SIZE = 0x02 | 0x01


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> DaemonProc:
    cfg = write_config(tmp_path_factory.mktemp("tenancy"), disk=None,
                       extra_daemon=f'staging_bytes = "{4 * LAYOUT.page_bytes}B"')
    with DaemonProc(cfg) as d:
        yield d


def _store(store: DaemonStore, ns: Namespace, tokens: list[int], seed: int) -> tuple[list[bytes], np.ndarray]:
    chain = ns.chain(tokens)
    pages = np.random.default_rng(seed).integers(0, 255, (len(chain.keys), LAYOUT.page_bytes), np.uint8)
    h = store.prepare_store(chain.metas())
    row = {m.key: i for i, m in enumerate(chain.metas())}
    for slot, m in zip(h.slots, h.metas):
        h.slab[slot] = pages[row[m.key]]
    assert store.complete_store(h).stored == len(chain.keys)
    return list(chain.keys), pages


def _load(store: DaemonStore, ns: Namespace, keys: list[bytes]) -> np.ndarray:
    lh = store.prepare_load(ns.id, keys)
    try:
        return np.stack([lh.slab[s] for s in lh.slots]) if lh.slots else np.empty((0,))
    finally:
        store.complete_load(lh)


def _session_fds(daemon: DaemonProc, store: DaemonStore) -> tuple[int, int]:
    """This client's own descriptors of the slab and of its staging area, as the lane hands
    them to any client of the session."""
    mapped = map_segments(f"{daemon.socket}.lane", store._session.session_id, 5.0)
    return mapped.slab_fd, mapped.staging_fd


def _refused(fn) -> bool:  # noqa: ANN001
    try:
        fn()
    except OSError:
        return True
    return False


def test_the_slab_cannot_be_written_through_any_descriptor(daemon: DaemonProc) -> None:
    with DaemonStore(daemon.target, ATTACKER.id) as store:
        slab_fd, stage_fd = _session_fds(daemon, store)
        size = os.fstat(slab_fd).st_size
        # the descriptor as received, and the segment reopened read-write through /proc
        reopened = os.open(f"/proc/self/fd/{slab_fd}", os.O_RDWR)
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            for fd in (slab_fd, reopened):
                assert _refused(lambda: mmap.mmap(fd, size, mmap.MAP_SHARED,
                                                  mmap.PROT_READ | mmap.PROT_WRITE))
                assert _refused(lambda: os.pwrite(fd, b"x", 0))
                assert _refused(lambda: os.ftruncate(fd, 0))
                assert _refused(lambda: os.ftruncate(fd, size * 2))
                # a hole punched in the slab would zero another client's page
                assert libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE_KEEP_SIZE, 0, 4096) != 0
            # read-only mapping works: that is how loads read it
            ro = mmap.mmap(slab_fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
            ro.close()
            # the staging area is this session's to write, but not to shrink under the
            # daemon's copy (which would fault the daemon)
            assert _refused(lambda: os.ftruncate(stage_fd, 0))
        finally:
            for fd in (slab_fd, stage_fd, reopened):
                os.close(fd)


def test_the_mapping_clients_get_is_read_only(daemon: DaemonProc) -> None:
    with DaemonStore(daemon.target, VICTIM.id) as victim:
        keys, pages = _store(victim, VICTIM, list(range(48)), seed=1)
        lh = victim.prepare_load(VICTIM.id, keys)
        with pytest.raises(ValueError, match="read-only"):
            lh.slab[lh.slots[0]] = 0  # numpy refuses before the hardware does
        victim.complete_load(lh)
        assert np.array_equal(_load(victim, VICTIM, keys), pages)


def test_a_client_that_writes_the_slab_dies_and_the_victims_pages_stand(
        daemon: DaemonProc, tmp_path: Path) -> None:
    with DaemonStore(daemon.target, VICTIM.id) as victim:
        keys, pages = _store(victim, VICTIM, list(range(100, 148)), seed=2)
        # another client process writes over every byte of its slab mapping behind numpy's
        # back (ctypes): the kernel stops it at the first byte
        attack = textwrap.dedent(f"""
            import ctypes
            from connector.daemon import DaemonStore
            s = DaemonStore({daemon.target!r}, bytes(16))
            print("mapped", flush=True)
            ctypes.memset(s._memory.slab.address, 0x5A, s._memory.slab.nbytes)
            print("wrote", flush=True)
        """)
        r = subprocess.run([sys.executable, "-c", attack], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == -signal.SIGSEGV, r.stdout + r.stderr
        assert "mapped" in r.stdout and "wrote" not in r.stdout
        assert np.array_equal(_load(victim, VICTIM, keys), pages)


def test_sessions_write_staging_areas_of_their_own(daemon: DaemonProc) -> None:
    with DaemonStore(daemon.target, VICTIM.id) as victim, \
            DaemonStore(daemon.target, ATTACKER.id) as attacker:
        a_slab, a_stage = _session_fds(daemon, attacker)
        v_slab, v_stage = _session_fds(daemon, victim)
        try:
            assert os.fstat(a_slab).st_ino == os.fstat(v_slab).st_ino  # one slab
            assert os.fstat(a_stage).st_ino != os.fstat(v_stage).st_ino  # two staging areas
        finally:
            for fd in (a_slab, a_stage, v_slab, v_stage):
                os.close(fd)
        # the victim's save is in flight (written to its staging rows, not yet completed)
        # while the attacker scribbles over its own whole staging area: the victim's pages
        # are what the victim wrote
        chain = VICTIM.chain(list(range(200, 248)))
        pages = np.random.default_rng(3).integers(0, 255, (3, LAYOUT.page_bytes), np.uint8)
        h = victim.prepare_store(chain.metas())
        for i, slot in enumerate(h.slots):
            h.slab[slot] = pages[i]
        attacker._memory.staging_view()[:] = 0x5A
        assert victim.complete_store(h).stored == 3
        assert np.array_equal(_load(victim, VICTIM, list(chain.keys)), pages)


def test_a_save_past_the_staging_area_is_refused(daemon: DaemonProc) -> None:
    # the daemon gives each session 4 rows (staging_bytes): a 6-page save reserves 4
    with DaemonStore(daemon.target, VICTIM.id) as store:
        chain = VICTIM.chain(list(range(300, 396)))
        h = store.prepare_store(chain.metas())
        assert len(h.slots) == 4 and h.refused == 2
        for slot in h.slots:
            h.slab[slot] = 7
        assert store.complete_store(h).stored == 4  # (the connector counts h.refused)
        # the rows are free again: the rest of the prompt saves
        keys, _ = _store(store, VICTIM, list(range(400, 464)), seed=4)
        assert len(keys) == 4


def test_the_daemon_is_not_dumpable(daemon: DaemonProc) -> None:
    # no process of this user can reach the daemon's writable mapping through /proc, or
    # ptrace it: the daemon drops its dumpable flag (what prctl reports, in a process that
    # does what serve() does; and as seen from outside, where this test is not root -- root
    # reads any process's /proc)
    probe = ("import ctypes; from server.daemon.app import _not_dumpable; _not_dumpable(); "
             "print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))")  # PR_GET_DUMPABLE
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.stdout.strip() == "0", r.stderr
    if os.geteuid() != 0:
        pid = daemon.proc.pid  # type: ignore[union-attr]
        with pytest.raises(PermissionError):
            os.listdir(f"/proc/{pid}/fd")
        with pytest.raises(PermissionError):
            open(f"/proc/{pid}/mem", "rb").close()


def test_a_block_chains_from_a_save_being_completed(tmp_path: Path) -> None:
    # a prompt saved in parts, each completed on a save thread while the next is prepared (as
    # the connector does): the next part chains from pages the daemon is still copying into
    # the slab -- they count as being written, so nothing is refused. (256 KiB pages: the
    # copy takes long enough for the next part to be prepared during it.)
    from concurrent.futures import ThreadPoolExecutor

    big = {"num_layers": 4, "num_kv_heads": 8, "head_dim": 128, "block_size": 16,
           "dtype": "bfloat16"}
    ns = Namespace("model", KVLayout(**big), "parts")  # type: ignore[arg-type]
    cfg = write_config(tmp_path, host="64MiB", disk=None, layout=big)
    with DaemonProc(cfg) as daemon, DaemonStore(daemon.target, ns.id) as store, \
            ThreadPoolExecutor(1) as saver:
        for r in range(8):
            chain = ns.chain([20000 + r * 1000 + i for i in range(16 * 32)])
            metas, futures, refused = chain.metas(), [], 0
            for part in range(0, 32, 8):
                h = store.prepare_store(metas[part: part + 8])
                refused += h.refused
                for slot in h.slots:
                    h.slab[slot] = r
                futures.append(saver.submit(store.complete_store, h))
            assert sum(f.result().stored for f in futures) == 32 and refused == 0
            assert store.lookup(chain.keys).num_blocks == 32
