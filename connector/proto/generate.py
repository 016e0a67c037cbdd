"""Regenerate ``kvstore_daemon_pb2.py`` (with its ``.pyi`` types) and ``kvstore_daemon_pb2_grpc.py``
from the .proto
(``python -m connector.proto.generate [OUT_DIR]``). Needs grpcio-tools."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
PROTO = "kvstore_daemon.proto"
OUTPUTS = ("kvstore_daemon_pb2.py", "kvstore_daemon_pb2.pyi", "kvstore_daemon_pb2_grpc.py")


def generate(out_dir: Path = HERE) -> None:
    from grpc_tools import protoc

    # -I at the repository root, so the stubs import each other as connector.proto.*
    root = HERE.parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        rc = protoc.main([
            "grpc_tools.protoc", f"-I{root}", f"--python_out={tmp}", f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            str((HERE / PROTO).relative_to(root)),
        ])
        if rc != 0:
            raise SystemExit(f"protoc failed with exit status {rc}")
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in OUTPUTS:
            shutil.copyfile(Path(tmp, "connector", "proto", name), out_dir / name)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
