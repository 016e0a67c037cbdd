"""schemathesis (its own command line) over the live OpenAPI schema of a real daemon's admin
API, with a valid token: no server error and no response that violates the schema, for every
operation but the event stream (endless text/event-stream; tests/admin/test_api.py reads it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.admin.conftest import TOKEN, AdminDaemon

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def test_schemathesis_finds_no_server_error_and_no_schema_violation(tmp_path: Path) -> None:
    with AdminDaemon(tmp_path) as d:
        cli = Path(sys.executable).with_name("schemathesis")
        proc = subprocess.run(
            [str(cli), "--no-color", "run", f"{d.url}/openapi.json", "--checks", CHECKS,
             "-H", f"Authorization: Bearer {TOKEN}",
             "--exclude-path", "/v1/events", "--max-examples", "30", "--seed", "1",
             "--generation-deterministic", "--request-timeout", "30"],
            capture_output=True, text=True, timeout=280, cwd=tmp_path)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-6000:]
        assert "No issues found" in out or "passed" in out, out[-3000:]
        assert TOKEN not in d.log()
