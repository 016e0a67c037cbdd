"""Namespace labels: what a label says (model id and tenant, never the secret), its bounds (its
length, its text, how many namespaces a store labels) and the refusals at the store's API."""

from __future__ import annotations

import pytest

from kvstore import InvalidArgument, KVLayout, Metrics, Namespace, TieredStore
from kvstore.namespace_labels import MAX_LABEL_BYTES, NamespaceLabels, check_label, label_of
from kvstore.tiers.host import HostTier


def test_a_label_is_the_model_and_the_tenant_never_the_secret(layout: KVLayout) -> None:
    secret = b"deployment-secret-0123456789abcdef"
    ns = Namespace("meta-llama/Llama-3.1-8B", layout, "team-a", secret)
    assert ns.label == "meta-llama/Llama-3.1-8B · tenant team-a"
    assert Namespace("meta-llama/Llama-3.1-8B", layout).label == "meta-llama/Llama-3.1-8B"
    assert secret.decode() not in ns.label and ns.id.hex() not in ns.label
    # cut to size, whole characters, ending in an ellipsis; control characters blanked
    long = label_of("m" * 300, "é" * 300)
    assert len(long.encode()) <= MAX_LABEL_BYTES and long.endswith("…")
    assert check_label(long) == long
    assert label_of("model\n", "t\x1b[31m") == "model  · tenant t [31m"


@pytest.mark.parametrize("bad, match", [
    (b"\xff\xfe", "must be UTF-8 text"),
    ("\udc80", "must be UTF-8 text"),
    ("", "1 to 256 bytes"),
    ("x" * (MAX_LABEL_BYTES + 1), "1 to 256 bytes of UTF-8, got 257"),
    ("é" * 129, "got 258"),  # the cap is in bytes, not characters
    ("a\nb", "control character"),
    (7, "must be a string"),
])
def test_bad_labels_are_refused(bad: object, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        check_label(bad)


def test_labels_are_bounded_like_the_namespace_counters() -> None:
    labels = NamespaceLabels(max_namespaces=2)
    a, b, c = (bytes([i]) * 16 for i in range(3))
    assert labels.set(a, "A") and labels.set(b, "B")
    assert not labels.set(c, "C")  # past the cap: not kept
    assert labels.set(a, "A2")  # a labelled one is relabelled
    assert labels.snapshot() == {a: "A2", b: "B"} and len(labels) == 2
    assert labels.get(c) is None and labels.ids_of("B") == [b] and labels.ids_of("C") == []


def test_the_store_keeps_labels_and_refuses_bad_ones(layout: KVLayout) -> None:
    store = TieredStore(layout, [HostTier.build("host", layout, 4, Metrics(), pin_memory=False)])
    ns = Namespace("some/model", layout, "t1")
    store.label_namespace(ns.id, ns.label)
    assert store.namespace_labels.get(ns.id) == "some/model · tenant t1"
    with pytest.raises(InvalidArgument, match="namespace id must be 16 bytes"):
        store.label_namespace(b"short", "x")
    with pytest.raises(InvalidArgument, match="1 to 256 bytes"):
        store.label_namespace(ns.id, "y" * 300)
    assert store.namespace_labels.snapshot() == {ns.id: "some/model · tenant t1"}
    assert store.namespace_labels.max_namespaces == 1024
    store.close()
