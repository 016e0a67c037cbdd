"""kvstore errors <-> gRPC status codes: the one mapping, used by the daemon (to answer) and by
its client (to raise the same class again)."""

from __future__ import annotations

import grpc

from kvstore import errors as E

#: most specific first: the first class an error is an instance of decides its code
STATUS_OF: tuple[tuple[type[E.KVStoreError], grpc.StatusCode], ...] = (
    (E.UnknownComponent, grpc.StatusCode.INVALID_ARGUMENT),
    (E.ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    (E.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (E.QuotaExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (E.LeaseError, grpc.StatusCode.NOT_FOUND),
    (E.TierUnavailable, grpc.StatusCode.UNAVAILABLE),
    (E.StoreClosed, grpc.StatusCode.UNAVAILABLE),
    (E.RecordError, grpc.StatusCode.DATA_LOSS),
    (E.KVStoreError, grpc.StatusCode.INTERNAL),
)

#: what a client raises for a code the daemon answered (codes the transport itself produces --
#: UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED -- mean "daemon unreachable", see DaemonUnavailable)
ERROR_OF: dict[grpc.StatusCode, type[E.KVStoreError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: E.InvalidArgument,
    grpc.StatusCode.RESOURCE_EXHAUSTED: E.QuotaExceeded,
    grpc.StatusCode.NOT_FOUND: E.LeaseError,
    grpc.StatusCode.FAILED_PRECONDITION: E.InvalidArgument,
    grpc.StatusCode.UNAUTHENTICATED: E.InvalidArgument,
    grpc.StatusCode.DATA_LOSS: E.KVStoreError,
    grpc.StatusCode.INTERNAL: E.KVStoreError,
}

#: codes that mean the daemon could not be reached or stopped answering
UNREACHABLE = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
})


class DaemonUnavailable(E.TierUnavailable):
    """The daemon did not answer (down, restarting, or too slow for the call's deadline)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, hint="start `kvstore serve`, or check its socket path/address")


def status_of(exc: BaseException) -> grpc.StatusCode:
    for cls, code in STATUS_OF:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


def message_of(exc: BaseException) -> str:
    """What the daemon tells the client: the error and its hint (never a secret: kvstore errors
    never carry one), or a generic line for an unexpected exception (details go to the log)."""
    if isinstance(exc, E.KVStoreError):
        return _bounded(str(exc))
    return f"internal error ({type(exc).__name__}); see the daemon's log"


#: the longest status message sent: it travels as trailing metadata, which gRPC caps (8 KiB
#: by default, headers included), and an error may quote what a client sent
MAX_MESSAGE_CHARS = 1024


def _bounded(text: str) -> str:
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return text[: MAX_MESSAGE_CHARS - 40] + f" ... ({len(text)} characters in all)"


#: a status code by its number (the code a stream's message carries, see ``pb.Status``)
CODE_OF: dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}


def error_of(err: grpc.RpcError) -> E.KVStoreError:
    """The kvstore error a client raises for a failed call."""
    return error_of_status(err.code(), err.details())  # type: ignore[attr-defined]


def error_of_status(code: grpc.StatusCode | int, details: str | None) -> E.KVStoreError:
    """The kvstore error a client raises for a failed call's status (``code`` as a
    ``grpc.StatusCode`` or its number: a stream message's :class:`pb.Status`)."""
    if isinstance(code, int):
        code = CODE_OF.get(code, grpc.StatusCode.UNKNOWN)
    text = details or code.name
    if code in UNREACHABLE:
        return DaemonUnavailable(f"kvstore daemon: {code.name}: {text}")
    cls = ERROR_OF.get(code, E.KVStoreError)
    if cls is E.LeaseError or cls is E.QuotaExceeded or cls is E.KVStoreError:
        return cls(text)
    return cls(f"{code.name}: {text}")


__all__ = ["CODE_OF", "DaemonUnavailable", "ERROR_OF", "STATUS_OF", "UNREACHABLE", "error_of",
           "error_of_status", "message_of", "status_of"]
