"""The README and the docs pages stay true: the README's results table is what bench/results/
holds, its commands exist, every page's code runs as written, their links resolve and the
metric list of the operations page is complete."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.report import BENCHMARKS_PAGE, readme_table, render
from kvstore import ConfigError, build_namespace, build_store, load_config
from tests.docs_pages import all_text, page, pages
from tests.redis_servers import RedisServer
from tests.server.daemon_proc import DaemonProc, write_config

ROOT = Path(__file__).parents[1]


def test_results_tables_come_from_bench_results() -> None:
    """The README's headline lines and the Benchmarks page's every line are what
    bench/results/ holds."""
    for path, table_now in (("README.md", render(headlines=True)),
                            (BENCHMARKS_PAGE, render())):
        table = readme_table((ROOT / path).read_text())
        assert table is not None, f"{path} lacks the results markers"
        assert table == table_now, f"{path}: results are stale: run python -m bench.report --write"
    assert 10 <= len(render(headlines=True).splitlines()) < len(render().splitlines())


def test_setup_commands_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/bootstrap.sh && .venv/bin/kvstore demo" in readme
    assert "bash scripts/test.sh" in readme
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    for script in ("scripts/bootstrap.sh", "scripts/test.sh"):
        assert (ROOT / script).exists()


# ----------------------------------------------------------------- the docs' code runs
#
# Every ```python block of the README and docs/ runs as written, each in a fresh interpreter in an empty directory, after
# the ```toml blocks whose first line names a file (``# kvstore.toml``) were saved there. A block
# that reads REDIS_URL gets a private redis-server; one that reads CHECKPOINT, a tiny Hugging Face
# checkpoint directory with a tokenizer.json (as save_pretrained and the tokenizers library
# write them); one that reads DAEMON_URL, a `kvstore serve` for the tiny model's pages. A block whose first line names a script
# (``# share.py``) is a recipe that a test below runs as real processes.

FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.M | re.S)
NAMED = re.compile(r"# (\S+\.(?:py|toml))\b")


def blocks(lang: str) -> list[tuple[str, str]]:
    """(heading above it, code) of every fenced ``lang`` block, in order."""
    out = []
    for m in FENCE.finditer(README):
        if m[1] == lang:
            heading = re.findall(r"^#+ (.+)$", README[: m.start()], re.M)[-1]
            out.append((heading, m[2]))
    return out


def file_name(code: str) -> str | None:
    m = NAMED.match(code)
    return m[1] if m else None


def run_python(code: str, cwd: Path, *args: str, env: dict[str, str] | None = None,
               ) -> subprocess.CompletedProcess[str]:
    """``code`` as a script in ``cwd``, with the README's files there, no KVSTORE_* variables
    and the checkout importable (as after ``scripts/bootstrap.sh``)."""
    for _, text in blocks("toml"):
        if file_name(text):
            (cwd / file_name(text)).write_text(text)  # type: ignore[operator]
    script = cwd / (file_name(code) or "block.py")
    script.write_text(code)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KVSTORE_")}
    clean["PYTHONPATH"] = os.pathsep.join([str(ROOT), clean.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, script.name, *args], cwd=cwd, capture_output=True,
                          text=True, env={**clean, **(env or {})}, timeout=240)


#: README.md and every docs page, one after another (blocks are found in all of them)
README = all_text()
SCRIPTS = {file_name(code): code for _, code in blocks("python") if file_name(code)}
#: the vLLM page's blocks run in order with its shell blocks, under vLLM (tests/vllm)
VLLM_SECTION = page("vllm")
SNIPPETS = [(h, code) for h, code in blocks("python")
            if not file_name(code) and f"```python\n{code}```" not in VLLM_SECTION]


def test_every_python_block_is_run() -> None:
    assert len(SNIPPETS) >= 4 and set(SCRIPTS) == {"share.py"}  # share.py: its own test below


@pytest.mark.parametrize("heading, code", SNIPPETS, ids=[h for h, _ in SNIPPETS])
def test_python_block_runs(heading: str, code: str, tmp_path: Path) -> None:
    env = {}
    if "CHECKPOINT" in code:
        env["CHECKPOINT"] = str(tiny_checkpoint(tmp_path / "ckpt"))
    server = RedisServer() if "REDIS_URL" in code else None
    if server is not None:
        env["REDIS_URL"] = server.url
    daemon = None
    if "DAEMON_URL" in code:
        (tmp_path / "daemon").mkdir()
        daemon = DaemonProc(write_config(tmp_path / "daemon")).start()
        env["DAEMON_URL"] = daemon.target
    try:
        proc = run_python(code, tmp_path, env=env)
    finally:
        if server is not None:
            server.stop()
        if daemon is not None:
            daemon.stop()
    assert proc.returncode == 0, f"README block under {heading!r} failed:\n{proc.stderr}"


def tiny_checkpoint(path: Path) -> Path:
    from runtime import get_model_config
    from tests.runtime.conftest import make_hf_checkpoint, make_tokenizer_json

    path.mkdir()
    cfg = get_model_config("tiny")
    make_hf_checkpoint(cfg, path, seed=5, shard=False)
    make_tokenizer_json(path, ["The capital of France is Paris ."], vocab_size=cfg.vocab_size)
    return path


def test_redis_sharing_recipe_runs_as_two_processes(redis_server: RedisServer,
                                                    tmp_path: Path) -> None:
    """One process puts a prompt's pages, a second one (another interpreter, as on another node)
    finds them in Redis and reads them back byte for byte."""
    share = SCRIPTS["share.py"]
    env = {"REDIS_URL": redis_server.url}
    writer = run_python(share, tmp_path, "put", env=env)
    assert writer.returncode == 0, writer.stderr
    assert writer.stdout == "put 4 pages\n"
    reader = run_python(share, tmp_path, "get", env=env)
    assert reader.returncode == 0, reader.stderr
    assert reader.stdout == "found 4 of 4 pages, identical to the writer's\n"
    assert redis_server.client().dbsize() == 4


def test_toml_blocks_are_valid_configs(tmp_path: Path) -> None:
    tomls = blocks("toml")
    assert tomls
    for heading, text in tomls:
        path = tmp_path / "c.toml"
        path.write_text(text)
        cfg = load_config(path)
        for tier in cfg.tiers:
            if tier.kind == "host":  # runs on a modest machine (the example used to ask 64GiB)
                assert tier.capacity <= 8 << 30, heading


def test_links_stay_inside_the_repository() -> None:
    for path, text in pages().items():
        assert "../" not in text, path
        for target in re.findall(r"\]\(([^)#]+)[^)]*\)", text):
            if not target.startswith(("http://", "https://")):
                assert (path.parent / target).exists(), (path, target)


def test_metric_names_are_documented(tmp_path: Path) -> None:
    """The operations page lists every metric a store with host and disk tiers and a connector
    exposes, and no other."""
    from connector import InProcessScheduler

    cfg = load_config(overrides={"tiers": [
        {"kind": "host", "capacity": "64MiB"},
        {"kind": "disk", "path": str(tmp_path / "disk"), "capacity": "64MiB"}]})
    with build_store(cfg) as store:
        InProcessScheduler(store, build_namespace(cfg), num_blocks=8)
        exposed = {m.name + ("_total" if m.type == "counter" else "")
                   for m in store.metrics.registry.collect()}
    notes = page("operations")
    documented = set(re.findall(r"^\| `(kvstore_\w+)", notes, re.M))
    assert documented == exposed


# The child maps torch before it lowers its address-space limit, so that only the slab meets it.
UNMAPPABLE_HOST_TIER = """
import resource
import torch  # noqa: F401
import kvstore
cfg = kvstore.load_config(overrides={"tiers": [
    {"kind": "host", "capacity": "2GiB", "pin_memory": False}]})
vm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, ((vm << 10) + (512 << 20),) * 2)
try:
    kvstore.build_store(cfg)
except kvstore.ConfigError as exc:
    print(exc.message)
"""


def test_host_tier_refusals_are_what_the_operator_notes_quote(tmp_path: Path) -> None:
    """'Sizing the host tier' quotes the two refusals of a host tier the machine cannot hold:
    larger than its memory, and an allocation the kernel refuses (here under ``ulimit -v``)."""
    notes = page("operations")
    notes = notes[notes.index("**Sizing the host tier.**"):]
    notes = notes[: notes.index("\n\n")]
    quoted = [" ".join(q.split()) for q in re.findall(r"`(tiers\.N [^`]+)`", notes)]
    assert len(quoted) == 2, quoted
    too_big, unmappable = (
        re.compile(re.escape(q).replace(r"tiers\.N", r"tiers\.\d+").replace("…", ".+"))
        for q in quoted)
    cfg = load_config(overrides={"tiers": [{"kind": "host", "capacity": "1PiB"}]})
    with pytest.raises(ConfigError) as info:
        build_store(cfg)
    assert too_big.fullmatch(info.value.message), info.value.message
    child = run_python(UNMAPPABLE_HOST_TIER, tmp_path)
    assert child.returncode == 0, child.stderr
    assert unmappable.fullmatch(child.stdout.strip()), child.stdout
