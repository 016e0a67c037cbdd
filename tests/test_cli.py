"""The README's main command: `kvstore demo` on the embedded default, and config errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

import kvstore
from kvstore import build_namespace, build_store, load_config
from server.cli import app
from tests.redis_servers import RedisServer


def test_demo_runs_on_embedded_default() -> None:
    # a real process, as the README runs it
    env = {**os.environ, "KVSTORE_TIERS": '[{"kind": "host", "capacity": "64MiB"}]'}
    proc = subprocess.run(
        [sys.executable, "-m", "server.cli", "store-demo", "--conversations", "2", "--turns", "3"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "verified byte for byte" in proc.stdout
    assert "host" in proc.stdout


def test_default_demo_uses_host_over_disk() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "server.cli", "store-demo", "--conversations", "3", "--turns", "3"],
        capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("KVSTORE_")},
    )
    assert proc.returncode == 0, proc.stderr
    assert "disk" in proc.stdout and "write_back->disk" in proc.stdout
    assert "verified byte for byte" in proc.stdout


def test_bad_config_exits_with_a_named_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[store]\nwrite_policy = "sometimes"\n')
    result = CliRunner().invoke(app, ["store-demo", "--config", str(bad)])
    assert result.exit_code == 2
    assert "store.write_policy" in result.output


def test_main_demo_runs_the_runtime_with_and_without_the_prefix_cache() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "server.cli", "demo", "--model", "small", "--turns", "2",
         "--max-tokens", "4"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stdout and "reused" in proc.stdout
    # then two workers share a `kvstore serve` it started: worker 2 loads worker 1's prompt
    # from the daemon (all but the last, partial block) with the same greedy reply, and the
    # daemon stops cleanly on SIGTERM
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in proc.stdout.splitlines() if line.startswith("│ worker")}
    (prompt, _, computed1, loaded1, _), (prompt2, _, computed2, loaded2, same) = (
        rows["worker 1"], rows["worker 2"])
    assert prompt == prompt2 and (int(computed1), int(loaded1)) == (int(prompt), 0)
    assert int(loaded2) == int(prompt) // 16 * 16 and int(computed2) == int(prompt) - int(loaded2)
    assert same == "yes"
    assert "stopped on SIGTERM: exit status 0 (a clean drain)" in proc.stdout


def test_config_command_prints_effective_config() -> None:
    result = CliRunner().invoke(app, ["config"])
    assert result.exit_code == 0
    assert '"write_policy"' in result.output and '"block_size"' in result.output


# ----------------------------------------------------------------- errors are messages

def kvstore_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as a real process, with no KVSTORE_* variables but ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KVSTORE_")}
    return subprocess.run([sys.executable, "-m", "server.cli", *args], capture_output=True,
                          text=True, env={**clean, **(env or {})}, timeout=120)


def tiers_env(*tiers: str) -> dict[str, str]:
    # a deployment key, as a production node has (without one, a Redis tier warns at start)
    return {"KVSTORE_TIERS": "[" + ", ".join(['{"kind": "host", "capacity": "64MiB"}', *tiers]) + "]",
            "KVSTORE_SECURITY__SECRET": "k7Qz9-deployment-key-0001"}


def test_bad_json_in_a_variable_is_a_message_with_exit_2() -> None:
    proc = kvstore_cli("config", env={"KVSTORE_TIERS": '[{"kind": "host",'})
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: KVSTORE_TIERS is not valid JSON: Expecting property name enclosed in double "
        "quotes: line 1 column 18 (char 17)\n"
        "hint: tables and lists in KVSTORE_* variables are JSON, e.g. "
        """KVSTORE_TIERS='[{"kind": "host", "capacity": "8GiB"}]'\n"""
    )


def test_unknown_variable_is_a_message_with_exit_2() -> None:
    proc = kvstore_cli("config", env={"KVSTORE_MODLE_ID": "m"})
    assert proc.returncode == 2
    assert proc.stderr.startswith(
        "error: unknown KVSTORE_* variables:\n  KVSTORE_MODLE_ID (did you mean KVSTORE_MODEL_ID?)\n"
    )


def test_disk_path_that_is_a_file(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    proc = kvstore_cli("store-demo", env=tiers_env(f'{{"kind": "disk", "path": "{afile}"}}'))
    assert proc.returncode == 2
    assert proc.stderr == (
        f"error: disk tier 'disk': cannot use directory {afile}: Not a directory\n"
        "hint: point the disk tier's path at a writable local directory\n"
    )


def test_redis_down(redis_server: RedisServer) -> None:
    url = redis_server.url
    redis_server.stop()
    proc = kvstore_cli("store-demo", env=tiers_env(f'{{"kind": "redis", "url": "{url}"}}'))
    assert proc.returncode == 1
    assert proc.stderr.startswith(
        f"error: redis tier 'redis': no server answered within 0.5s: {redis_server.node}: "
    ), proc.stderr
    assert "hint: start the redis server(s), or fix the tier's url" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_serve_reports_a_tier_that_fails_to_start_like_every_command(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    """Exit 1 for a Redis server that does not answer, 2 for a disk path that is a file (it
    used to exit 2 for both), the lines unwrapped."""
    url = redis_server.url
    redis_server.stop()
    data = {"XDG_DATA_HOME": str(tmp_path)}
    down = kvstore_cli("serve", env={**tiers_env(f'{{"kind": "redis", "url": "{url}"}}'), **data})
    assert down.returncode == 1, down.stderr
    assert down.stderr.startswith(
        f"error: redis tier 'redis': no server answered within 0.5s: {redis_server.node}: "
    ), down.stderr
    assert down.stderr.endswith(
        "\nhint: start the redis server(s), or fix the tier's url (a server that only listens "
        "with TLS needs rediss:// or tls=True)\n"
    )
    afile = tmp_path / "afile"
    afile.write_text("")
    taken = kvstore_cli("serve", env={**tiers_env(f'{{"kind": "disk", "path": "{afile}"}}'), **data})
    assert taken.returncode == 2
    assert taken.stderr.endswith(
        f"error: disk tier 'disk': cannot use directory {afile}: Not a directory\n"
        "hint: point the disk tier's path at a writable local directory\n"
    ), taken.stderr


def test_redis_wrong_password() -> None:
    server = RedisServer("--requirepass", "right-secret")
    try:
        tier = f'{{"kind": "redis", "url": "{server.url}", "password": "wrong-secret"}}'
        proc = kvstore_cli("store-demo", env=tiers_env(tier))
    finally:
        server.stop()
    assert proc.returncode == 2
    assert proc.stderr.startswith(
        f"error: redis tier 'redis': {server.node} rejected the credentials: "
    ), proc.stderr
    assert "secret" not in proc.stdout + proc.stderr


def test_a_password_in_a_url_is_refused_without_echoing_it() -> None:
    tier = '{"kind": "redis", "url": "redis://app:Xq7-s3cret-pw@127.0.0.1:6379/0"}'
    proc = kvstore_cli("config", env=tiers_env(tier))
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: invalid kvstore configuration:\n"
        "  tiers.1.redis.url (KVSTORE_TIERS): put the password in the 'password' field (a "
        "secret), not in url (got 'redis://***@127.0.0.1:6379/0')\n"
        "hint: fix the variable(s) named above\n"
    )


def test_version() -> None:
    proc = kvstore_cli("--version")
    assert (proc.returncode, proc.stdout) == (0, f"kvstore {kvstore.__version__}\n")


def _disk_config(tmp_path: Path, write_policy: str = "write_back") -> Path:
    cfg = tmp_path / "kvstore.toml"
    cfg.write_text(f"""
model_id = "my-model"
[store]
write_policy = "{write_policy}"
[[tiers]]
kind = "host"
capacity = "16MiB"
[[tiers]]
kind = "disk"
path = "{tmp_path / 'disk'}"
capacity = "256MiB"
""")
    return cfg


def test_verbose_shows_the_tiers_log_lines(tmp_path: Path) -> None:
    cfg = _disk_config(tmp_path)
    quiet = kvstore_cli("store-demo", "-c", str(cfg), "--conversations", "1", "--turns", "1")
    loud = kvstore_cli("-v", "store-demo", "-c", str(cfg), "--conversations", "1", "--turns", "1")
    assert quiet.returncode == loud.returncode == 0, quiet.stderr + loud.stderr
    line = f"disk tier 'disk': {tmp_path / 'disk'} "
    assert line not in quiet.stderr and line in loud.stderr


def test_warnings_are_seen_without_verbose(redis_server: RedisServer) -> None:
    tiers = f'[{{"kind": "host", "capacity": "64MiB"}}, {{"kind": "redis", "url": "{redis_server.url}"}}]'
    proc = kvstore_cli("store-demo", "--conversations", "1", "--turns", "1",
                       env={"KVSTORE_TIERS": tiers})  # no deployment secret
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith(
        "WARNING kvstore.build: shared tier(s) ['redis'] run without security.secret: "
    ), proc.stderr


def test_config_prints_sizes_with_units() -> None:
    proc = kvstore_cli("config", env=tiers_env())
    assert proc.returncode == 0, proc.stderr
    assert '"capacity": "64MiB"' in proc.stdout


# ----------------------------------------------------------------- store-demo on a real cache

def test_store_demo_leaves_a_real_cache_as_it_found_it(tmp_path: Path) -> None:
    cfg_path = _disk_config(tmp_path, write_policy="write_through")
    cfg = load_config(cfg_path)
    ns = build_namespace(cfg)
    chain = ns.chain(list(range(3 * cfg.layout.block_size)))
    page = np.random.default_rng(1).integers(0, 256, (3, ns.layout.page_bytes), dtype=np.uint8)
    with build_store(cfg) as store:
        store.put(chain.metas(), page)  # a real user's pages, written through to disk
    for _ in range(2):  # the second run used to crash with KeyError on the persistent disk
        proc = kvstore_cli("store-demo", "-c", str(cfg_path), "--conversations", "2",
                           "--turns", "2")
        assert proc.returncode == 0, proc.stderr
        assert "verified byte for byte" in proc.stdout
    with build_store(cfg) as store:
        assert store.tier("disk").used_pages == 3  # only the user's pages: the demo cleaned up
        out = np.empty_like(page)
        assert all(store.get(ns.id, chain.keys, out).found)
        assert np.array_equal(out, page)
