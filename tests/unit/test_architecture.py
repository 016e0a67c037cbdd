"""Arrows point down: kvstore imports no connector/runtime/server code and no transport library;
the public surface is pinned."""

from __future__ import annotations

import ast
from pathlib import Path

import kvstore

ROOT = Path(__file__).parents[2]
FORBIDDEN_IN_CORE = {"connector", "runtime", "server", "fastapi", "grpc", "starlette", "uvicorn"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_core_imports_point_down() -> None:
    bad = {
        str(p.relative_to(ROOT)): sorted(_imports(p) & FORBIDDEN_IN_CORE)
        for p in (ROOT / "kvstore").rglob("*.py")
        if _imports(p) & FORBIDDEN_IN_CORE
    }
    assert bad == {}


def test_connector_does_not_import_server_or_runtime() -> None:
    bad = {
        str(p.relative_to(ROOT)): sorted(_imports(p) & {"server", "runtime"})
        for p in (ROOT / "connector").rglob("*.py")
        if _imports(p) & {"server", "runtime"}
    }
    assert bad == {}


def test_only_the_vllm_plugin_imports_vllm() -> None:
    """vLLM is an optional extra: one module adapts to it, nothing else may need it."""
    importers = {
        str(p.relative_to(ROOT))
        for d in ("kvstore", "connector", "runtime", "server")
        for p in (ROOT / d).rglob("*.py")
        if "vllm" in _imports(p)
    }
    assert importers == {"connector/vllm.py"}


def _module_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_tiers_know_nothing_of_policies() -> None:
    """Tiers store bytes; whoever owns a tier (the store, a pool's owner) chooses victims. (A
    tier's config model names the policy its owner runs, and checks that it builds.)"""
    bad = {
        str(p.relative_to(ROOT)): sorted(m for m in _module_imports(p) if m.startswith("kvstore.policy"))
        for p in (ROOT / "kvstore" / "tiers").rglob("*.py")
        if p.name != "config_base.py"
    }
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_connector_reaches_no_tier() -> None:
    """The connector takes a store of the one face (kvstore.api.StoreAPI) and nothing below it:
    no module of connector/ imports kvstore.tiers, with no exception."""
    bad = {
        str(p.relative_to(ROOT)): sorted(m for m in _module_imports(p) if m.startswith("kvstore.tiers"))
        for p in (ROOT / "connector").rglob("*.py")
    }
    assert {k: v for k, v in bad.items() if v} == {}


#: what the runtime may take from kvstore.tiers: its own pool, the tier seam, and the host tier
#: its demo stages through; disk and Redis reach it only through configuration (kvstore.build)
RUNTIME_TIERS = {"kvstore.tiers.base", "kvstore.tiers.hbm", "kvstore.tiers.hbm_owner",
                 "kvstore.tiers.slab", "kvstore.tiers.host"}


def test_runtime_reaches_tiers_only_through_the_seams() -> None:
    bad = {
        str(p.relative_to(ROOT)): sorted(
            m for m in _module_imports(p)
            if m.startswith("kvstore.tiers") and m not in RUNTIME_TIERS)
        for p in (ROOT / "runtime").rglob("*.py")
    }
    assert {k: v for k, v in bad.items() if v} == {}


def test_public_surface() -> None:
    assert set(kvstore.__all__) == {
        "FORMAT_VERSION", "BlockChain", "BlockMeta", "ConfigError", "EvictionPolicy", "GetResult",
        "InvalidArgument", "KVLayout", "KVStoreConfig", "KVStoreError", "Lease", "LeaseError",
        "LookupResult", "Metrics", "Namespace", "PutResult", "RecordError", "StoreStats", "Tier",
        "TierStats", "TierUnavailable", "TieredStore", "UnknownComponent", "available_policies",
        "build_namespace", "build_store", "chain_keys", "load_config", "make_policy",
        "token_bytes",
    }
    for name in kvstore.__all__:
        assert hasattr(kvstore, name)


def test_only_config_reads_the_environment() -> None:
    readers = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "kvstore").rglob("*.py")
        if "os.environ" in p.read_text() or "getenv" in p.read_text()
    ]
    assert readers == []  # config reads it through pydantic-settings
