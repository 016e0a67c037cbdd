"""The daemon's byte path (ReadPages, WritePages: the cross-node path) seals every page with the
deployment secret: a page written by a client without the daemon's secret, or changed on the
way, is refused and counted; a page read under another secret is a counted miss. A real
``kvstore serve`` subprocess, real gRPC."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from connector.daemon import DaemonStore
from connector.proto import kvstore_daemon_pb2 as pb
from connector.proto import kvstore_daemon_pb2_grpc as pb_grpc
from kvstore import KVLayout, Namespace
from kvstore.record import WIRE, RecordMac, wire_fields
from tests.server.daemon_proc import TINY_LAYOUT, DaemonProc, write_config

SECRET = b"wire-secret-A-0123456789abcdef"
OTHER = b"wire-secret-B-0123456789abcdef"
LAYOUT = KVLayout(**TINY_LAYOUT)
NS = Namespace("model", LAYOUT, "tenant-wire")


def pages(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, LAYOUT.page_bytes), dtype=np.uint8)


def bad_seals(client: DaemonStore) -> float:
    return client.metrics.value("kvstore_tier_corrupt_records_total", tier=WIRE, reason="mac")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    cfg = write_config(tmp_path_factory.mktemp("wire"))
    with DaemonProc(cfg, env={"KVSTORE_SECURITY__SECRET": SECRET.decode()}) as d:
        yield d
        assert d.stop() == 0
    assert SECRET.decode() not in d.log()


def test_pages_round_trip_under_the_daemons_secret(daemon: DaemonProc) -> None:
    chain = NS.chain(list(range(3 * LAYOUT.block_size)))
    sent = pages(3, 1)
    with DaemonStore(daemon.target, NS.id, secret=SECRET) as c:
        assert c.write_pages(chain.metas(), sent).stored == 3
        got = np.zeros_like(sent)
        assert c.read_pages(list(chain.keys), got) == 3
        assert np.array_equal(got, sent) and bad_seals(c) == 0


@pytest.mark.parametrize("secret", [OTHER, None], ids=["another secret", "no secret"])
def test_pages_written_without_the_daemons_secret_are_refused(daemon: DaemonProc,
                                                              secret: bytes | None) -> None:
    chain = NS.chain([7] * LAYOUT.block_size + list(range(2 * LAYOUT.block_size)))
    with DaemonStore(daemon.target, NS.id, secret=secret) as forger:
        r = forger.write_pages(chain.metas(), pages(3, 2))
        assert (r.stored, r.refused) == (0, 3)
    with DaemonStore(daemon.target, NS.id, secret=SECRET) as owner:
        assert owner.read_pages(list(chain.keys), pages(3, 0)) == 0  # nothing was stored
    assert "refused: their seal does not verify" in daemon.log()


def test_pages_read_under_another_secret_are_a_counted_miss(daemon: DaemonProc) -> None:
    chain = NS.chain([8] * LAYOUT.block_size + list(range(LAYOUT.block_size)))
    with DaemonStore(daemon.target, NS.id, secret=SECRET) as owner:
        assert owner.write_pages(chain.metas(), pages(2, 3)).stored == 2
    with DaemonStore(daemon.target, NS.id, secret=OTHER) as other:
        assert other.read_pages(list(chain.keys), pages(2, 0)) == 0
        assert bad_seals(other) == 1  # the first page failed; the run ended there


def test_a_page_changed_on_the_way_or_unsealed_is_refused(daemon: DaemonProc) -> None:
    """What a client with the secret sealed, changed by one bit before it reaches the daemon
    (or sent with no seal, or sealed for another key), is never stored."""
    chain = NS.chain([9] * LAYOUT.block_size + list(range(LAYOUT.block_size)))
    m0, m1 = chain.metas()
    page = pages(1, 4)[0]
    mac = RecordMac(SECRET)
    seal = mac.seal(wire_fields(b"W", NS.id, m0.key, m0.parent, m0.token_ids), page)
    flipped = page.copy()
    flipped[100] ^= 1

    def write(meta, data: np.ndarray, seal: bytes) -> pb.PutReply:  # type: ignore[no-untyped-def]
        msg = pb.WritePage(namespace_id=NS.id, data=data.tobytes(), seal=seal,
                           block=pb.Block(key=meta.key, parent=meta.parent,
                                          token_ids=meta.token_ids))
        with grpc.insecure_channel(daemon.target) as ch:
            return pb_grpc.KVStoreDaemonStub(ch).WritePages(iter([msg]), timeout=10)

    assert write(m0, flipped, seal).refused == 1  # the page changed
    assert write(m0, page, b"").refused == 1  # no seal
    assert write(m0, page, seal[:-1] + bytes([seal[-1] ^ 1])).refused == 1  # the tag changed
    assert write(m1, page, seal).refused == 1  # the seal of another key
    with DaemonStore(daemon.target, NS.id, secret=SECRET) as owner:
        assert owner.read_pages([m0.key], pages(1, 0)) == 0
        assert write(m0, page, seal).stored == 1  # the page as sealed is stored
        got = pages(1, 0)
        assert owner.read_pages([m0.key], got) == 1 and np.array_equal(got[0], page)


def test_a_short_secret_is_refused_by_the_client(daemon: DaemonProc) -> None:
    with pytest.raises(ValueError, match="at least 16"):
        DaemonStore(daemon.target, NS.id, secret=b"short")
