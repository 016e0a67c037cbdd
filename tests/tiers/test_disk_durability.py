"""The disk tier's durability modes (``durability`` = group | batch | none): when a put is
acknowledged, when it becomes power-safe, in which order the slab and the index are flushed, and
that no acknowledged put is lost to a SIGKILL before any flush ran. Real files, a real LMDB, a
real child process; the flushes are observed by wrapping the real ``Slab.sync`` and
``DiskIndex.flush`` (they still run)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvstore import ConfigError
from kvstore.config import DiskTierConfig
from kvstore.tiers.disk import DiskTier, aligned_empty
from kvstore.tiers.disk_index import DiskIndex
from kvstore.tiers.disk_slab import Slab
from tests.tiers.disk_child import (
    CRASH_CAPACITY,
    CRASH_LAYOUT,
    block_metas,
    expected_page,
    in_buffer,
    namespace,
)

REPO = Path(__file__).resolve().parents[2]
LAYOUT = CRASH_LAYOUT


@pytest.fixture
def flushes(monkeypatch) -> list[tuple[str, str]]:
    """Every slab and index flush, in order: (what, the thread that ran it)."""
    seen: list[tuple[str, str]] = []
    real_slab, real_index = Slab.sync, DiskIndex.flush

    def slab_sync(self: Slab) -> None:
        seen.append(("slab", threading.current_thread().name))
        real_slab(self)

    def index_sync(self: DiskIndex) -> None:
        seen.append(("index", threading.current_thread().name))
        real_index(self)

    monkeypatch.setattr(Slab, "sync", slab_sync)
    monkeypatch.setattr(DiskIndex, "flush", index_sync)
    return seen


@pytest.fixture
def tier_at(tmp_path: Path) -> Iterator:
    opened: list[DiskTier] = []

    def make(**kw) -> DiskTier:
        tier = DiskTier.build("dur", LAYOUT, CRASH_CAPACITY, path=tmp_path / "d", check_index=False, **kw)
        opened.append(tier)
        return tier

    yield make
    for t in opened:
        t.close()


def _put(tier: DiskTier, ids: range) -> None:
    metas = block_metas(LAYOUT, ids)
    pages = [in_buffer(expected_page(m.key, LAYOUT.page_bytes), True) for m in metas]
    assert all(tier.write(metas, pages))


def test_group_is_the_default_and_flushes_off_the_calling_thread(tier_at, flushes) -> None:
    tier = tier_at(sync_interval_ms=20)
    assert tier.durability == "group" and DiskTierConfig(path="/x").durability == "group"
    _put(tier, range(4))
    deadline = time.monotonic() + 5
    while tier.unsynced and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not tier.unsynced, "no group commit within 5 s of a 20 ms interval"
    # the slab first, then the index: a durable index entry names a durable record
    assert [w for w, _ in flushes[:2]] == ["slab", "index"]
    assert all(t.startswith("kvstore-disk-sync-") for _, t in flushes)


def test_one_group_commit_covers_many_puts(tier_at, flushes) -> None:
    tier = tier_at(sync_interval_ms=300)
    for i in range(8):
        _put(tier, range(4 * i, 4 * i + 4))
    assert tier.unsynced and flushes == [], "a put waited for a flush"
    deadline = time.monotonic() + 5
    while tier.unsynced and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [w for w, _ in flushes] == ["slab", "index"], "eight puts, one group commit"


def test_sync_and_close_make_every_acknowledged_put_power_safe(tier_at, flushes) -> None:
    tier = tier_at(sync_interval_ms=60_000)
    _put(tier, range(4))
    assert tier.unsynced
    assert tier.sync() is True
    assert not tier.unsynced and [w for w, _ in flushes] == ["slab", "index"]
    assert tier.sync() is True and len(flushes) == 2, "nothing new: no flush"
    _put(tier, range(4, 8))
    tier.close()
    assert [w for w, _ in flushes] == ["slab", "index", "slab", "index"]


def test_batch_flushes_before_acknowledging(tier_at, flushes) -> None:
    tier = tier_at(durability="batch")
    _put(tier, range(4))
    me = threading.current_thread().name
    assert ("slab", me) in flushes and not tier.unsynced
    assert tier.sync() is True


def test_none_never_flushes_unless_asked(tier_at, flushes) -> None:
    tier = tier_at(durability="none")
    _put(tier, range(4))
    time.sleep(0.15)
    assert flushes == [] and not tier.unsynced
    assert tier.sync() is True and [w for w, _ in flushes] == ["slab", "index"]


@pytest.mark.parametrize("bad", [{"durability": "fsync"}, {"sync_interval_ms": 0}])
def test_bad_durability_settings_are_refused(tier_at, bad) -> None:
    with pytest.raises(ConfigError, match=f"tier 'dur':\n  {next(iter(bad))}: "):
        tier_at(**bad)


def test_sigkill_before_any_group_commit_loses_no_acknowledged_put(tmp_path: Path) -> None:
    """The definition of acknowledged: ``write`` returned True. A child acknowledges 24 puts
    under a group commit that is 60 s away and is SIGKILLed; every one of them reopens and
    reads back exactly."""
    directory = tmp_path / "ack"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.tiers.disk_child", "ack", str(directory), "24"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None
        words = child.stdout.readline().split()
    finally:
        child.kill()
        child.wait(timeout=10)
    assert words[0] == "acked" and words[-1] == "unsynced", words
    acked = [bytes.fromhex(k) for k in words[1:-1]]
    assert len(acked) == 24
    with DiskTier.build("ack", LAYOUT, CRASH_CAPACITY, path=directory) as tier:
        outs = [aligned_empty(LAYOUT.page_bytes) for _ in acked]
        assert tier.read(namespace(LAYOUT).id, acked, outs) == [True] * len(acked)
        for k, o in zip(acked, outs):
            assert np.array_equal(o, expected_page(k, LAYOUT.page_bytes))


def test_a_close_between_the_interval_and_the_clear_still_ends_the_committer() -> None:
    """The group-commit thread woke, waited out its interval (no stop yet), and a close lands
    before it clears its wake-up: the close's wake-up is cleared with the put's. The thread must
    still end (a tier's close joins it; it used to wait forever)."""
    from kvstore.tiers.disk_sync import GroupCommitter

    syncs: list[str] = []
    committer = GroupCommitter("race", lambda: syncs.append("slab"),
                               lambda: syncs.append("index"), 0.01, lambda why: None)

    class CloseLandsHere(threading.Event):
        def clear(self) -> None:
            committer._stop.set()  # what close() does first: stop, then wake
            threading.Event.set(self)
            super().clear()

    parked = committer._wake  # the thread waits on this one now
    committer._wake = CloseLandsHere()
    committer.noted += 1
    parked.set()
    committer._thread.join(5)
    assert not committer._thread.is_alive()
    assert syncs == ["slab", "index"]  # the put it woke for was synced
    committer.close()  # and a close afterwards returns at once
