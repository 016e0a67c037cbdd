"""The daemon's docs pages run in order, as a user types them: every ```bash/```shell/```sh
and ```python block of docs/daemon.md and docs/admin.md, one after the other, each against the
daemon the blocks before it started.

The shell blocks are one shell session: what a block exports, the next block and the Python
blocks see. What a test cannot run as written is substituted, and only that: a background
``kvstore serve [ARGS] &`` is a subprocess the test starts (and waits for, as a user waits for its
"listening on" line) and ``kill %1 && wait %1`` stops it (exit status 0: a clean drain); the admin
API listens on a free port instead of 8470; the data directory and $XDG_DATA_HOME lie under the
test's temporary directory (the blocks' $PWD). A Python block that reads DAEMON_URL when no block
has started a daemon gets ``kvstore serve`` with no config, the embedded default the section
opens with. The ```toml blocks whose first line names a file are saved there, as in
tests/test_readme.py."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.docs_pages import page
from tests.test_readme import FENCE, run_python

#: the pages whose blocks run in one session, in this order
SECTIONS = ("daemon", "admin")
SHELL = ("bash", "shell", "sh")
KVSTORE = str(Path(sys.executable).parent / "kvstore")
SERVE = re.compile(r"^kvstore serve(?P<args>[^&#]*)&\s*(#.*)?$")
KILL = re.compile(r"^kill %1(\s*&&\s*wait( %1)?)?\s*(#.*)?$")
ADMIN_PORT = "127.0.0.1:8470"


def section_blocks() -> list[tuple[str, str]]:
    """(language, code) of every shell and Python block of the SECTIONS pages, in order."""
    return [(m[1], m[2]) for name in SECTIONS for m in FENCE.finditer(page(name))
            if m[1] in (*SHELL, "python")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daemon:
    """``kvstore serve ARGS`` started as the shell would, with the session's variables."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path, log: Path) -> None:
        self.log_path = log
        with open(log, "ab") as out:  # the child keeps its own copy
            self.proc = subprocess.Popen([KVSTORE, "serve", *args], cwd=cwd, env=env,
                                         stdout=out, stderr=subprocess.STDOUT)
        self.target = self._wait_serving(60.0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _wait_serving(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"kvstore serve exited {self.proc.returncode}:\n{self.log()}")
            assert time.monotonic() < deadline, f"kvstore serve not ready:\n{self.log()}"
            m = re.search(r"listening on (unix://\S+)", self.log())
            if m and self._serving(m[1]):  # SERVING once every listener, the admin API's too
                return m[1]
            time.sleep(0.1)

    @staticmethod
    def _serving(target: str) -> bool:
        with grpc.insecure_channel(target) as ch:
            try:
                r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
            except grpc.RpcError:
                return False
        return bool(r.status == health_pb2.HealthCheckResponse.SERVING)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"kvstore serve did not stop on SIGTERM:\n{self.log()}") from None


class Session:
    """One user's shell across the blocks, in ``cwd``."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KVSTORE_")}
        self.env.update(PATH=os.pathsep.join([str(Path(KVSTORE).parent), self.env["PATH"]]),
                        PWD=str(cwd), XDG_DATA_HOME=str(cwd / "xdg"),
                        KVSTORE_ADMIN__LISTEN=f"127.0.0.1:{free_port()}")
        self.daemon: Daemon | None = None
        self.transcript: list[str] = []

    def shell(self, code: str) -> None:
        """Run a shell block: its plain lines in bash (``set -euo pipefail``), its background
        ``kvstore serve`` and its ``kill %1`` as the test's daemon."""
        code = code.replace(ADMIN_PORT, self.env["KVSTORE_ADMIN__LISTEN"])
        pending: list[str] = []
        for line in code.replace("\\\n", " ").splitlines():
            serve, kill = SERVE.match(line.strip()), KILL.match(line.strip())
            if serve or kill:
                self._bash(pending)
                pending = []
            if serve:
                assert self.daemon is None, "a second `kvstore serve &` while one runs"
                self.start(shlex.split(serve["args"]))
            elif kill:
                assert self.daemon is not None, "`kill %1` but no daemon runs"
                code_ = self.daemon.stop()
                assert code_ == 0, f"kvstore serve exited {code_} on SIGTERM:\n{self.daemon.log()}"
                self.daemon = None
            else:
                assert not line.rstrip().endswith("&"), f"a background command to run: {line}"
                pending.append(line)
        self._bash(pending)

    def start(self, args: list[str]) -> Daemon:
        self.daemon = Daemon(args, self.env, self.cwd, self.cwd / "daemon.log")
        return self.daemon

    def _bash(self, lines: list[str]) -> None:
        if not any(line.strip() and not line.lstrip().startswith("#") for line in lines):
            return
        env_file = self.cwd / ".session-env"
        script = "set -euo pipefail\n" + "\n".join(lines) + f"\nenv -0 > {shlex.quote(str(env_file))}\n"
        proc = subprocess.run(["bash", "-c", script], cwd=self.cwd, env=self.env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (f"docs shell lines failed ({proc.returncode}):\n"
                                      + "\n".join(lines) + f"\n{proc.stdout}\n{proc.stderr}")
        self.transcript.append(proc.stdout)
        self.env = dict(kv.split("=", 1) for kv in env_file.read_text().split("\0") if "=" in kv)

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        if "DAEMON_URL" in code and self.daemon is None:
            # what the section opens with: `kvstore serve`, the embedded default
            self.env.setdefault("DAEMON_URL", self.start([]).target)
        return run_python(code, self.cwd, env=self.env)

    def close(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
            self.daemon = None


def run_sections(cwd: Path, *, blocks: list[tuple[str, str]] | None = None,
                 env_drop: tuple[str, ...] = ()) -> Session:
    """Run ``blocks`` ((language, code), default: the daemon and admin pages') in order in one
    session in ``cwd``, without the variables ``env_drop``."""
    session = Session(cwd)
    for name in env_drop:
        session.env.pop(name, None)
    try:
        for lang, code in (section_blocks() if blocks is None else blocks):
            if lang == "python":
                proc = session.python(code)
                assert proc.returncode == 0, f"docs python block failed:\n{code}\n{proc.stderr}"
                session.transcript.append(proc.stdout)
            else:
                session.shell(code)
    finally:
        session.close()
    return session


def test_daemon_sections_run_in_order(tmp_path: Path) -> None:
    langs = [lang for lang, _ in section_blocks()]
    assert "python" in langs and any(lang in SHELL for lang in langs)
    session = run_sections(tmp_path)
    out = "".join(session.transcript)
    assert '"ready":true' in out.replace(" ", "")  # the admin block's /readyz
    assert "tiers" in out  # its `kvstore stats`


def test_example_against_the_embedded_default_is_one_line_naming_both_layouts(
        tmp_path: Path) -> None:
    """Skip the block that starts the daemon with the tiny model's layout: the example meets
    `kvstore serve`'s embedded default (Llama-3-8B's layout) and raises one kvstore error that
    names both layouts and the [layout] to start the daemon with."""
    (example,) = [code for lang, code in section_blocks() if lang == "python"]
    session = Session(tmp_path)
    try:
        proc = session.python(example)
    finally:
        session.close()
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("kvstore.errors.InvalidArgument: the kvstore daemon at unix://"), last
    assert "stores pages of KVLayout(num_layers=32, num_kv_heads=8, head_dim=128" in last
    assert "this engine's are KVLayout(num_layers=2, num_kv_heads=2, head_dim=16" in last
    assert '(hint: start the daemon with [layout] num_layers = 2, num_kv_heads = 2' in last
