"""The daemon's gRPC method handlers, built from the proto's service descriptor with request
parsers that never raise: a request that does not parse reaches the servicer as
:class:`Malformed` and is answered INVALID_ARGUMENT by it (logged once per client, counted),
where gRPC's own parser would log a traceback per call and answer INTERNAL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from connector.proto import kvstore_daemon_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["KVStoreDaemon"]


class Malformed:
    """A request message whose bytes did not parse as ``type_name``."""

    __slots__ = ("size", "type_name")

    def __init__(self, type_name: str, size: int) -> None:
        self.type_name, self.size = type_name, size


def _parser(cls: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except (DecodeError, ValueError, RuntimeError):
            return Malformed(cls.DESCRIPTOR.name, len(data))

    return parse


_KINDS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def add_servicer(servicer: Any, server: grpc.Server) -> None:
    """Register every method of the KVStoreDaemon service on ``server``, as the generated
    ``add_KVStoreDaemonServicer_to_server`` does, with tolerant request parsers."""
    handlers = {}
    for m in SERVICE.methods:
        request_cls = getattr(pb, m.input_type.name)
        reply_cls = getattr(pb, m.output_type.name)
        make = _KINDS[(m.client_streaming, m.server_streaming)]
        handlers[m.name] = make(getattr(servicer, m.name),
                                request_deserializer=_parser(request_cls),
                                response_serializer=reply_cls.SerializeToString)
    # both, as the generated code does: registered handlers serve stubs that name their
    # method as registered, the generic one every other caller
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))
    server.add_registered_method_handlers(SERVICE.full_name, handlers)


__all__ = ["Malformed", "SERVICE", "add_servicer"]
