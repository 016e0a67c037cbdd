"""The wire format's files and the one error mapping."""

from __future__ import annotations

import inspect
from pathlib import Path

import grpc

from connector.daemon.errors import STATUS_OF, status_of
from connector.proto import generate
from kvstore import errors


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    generate.generate(tmp_path)
    for name in generate.OUTPUTS:
        assert (tmp_path / name).read_text() == (generate.HERE / name).read_text(), name


def test_every_kvstore_error_has_its_own_status() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, errors.KVStoreError)]
    mapped = {cls for cls, _ in STATUS_OF}
    assert set(classes) <= mapped
    assert status_of(errors.QuotaExceeded("x")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status_of(errors.UnknownComponent("x")) == grpc.StatusCode.INVALID_ARGUMENT
    assert status_of(errors.LeaseError("x")) == grpc.StatusCode.NOT_FOUND
    assert status_of(errors.StoreClosed()) == grpc.StatusCode.UNAVAILABLE
    assert status_of(ValueError("x")) == grpc.StatusCode.INTERNAL
