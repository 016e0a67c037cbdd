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
    """vLLM is an optional extra: one package adapts to it, nothing else may need it."""
    importers = {
        str(p.relative_to(ROOT))
        for d in ("kvstore", "connector", "runtime", "server")
        for p in (ROOT / d).rglob("*.py")
        if "vllm" in _imports(p)
    }
    assert importers and {p for p in importers if not p.startswith("connector/vllm/")} == set()


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


#: Everything above kvstore: none of it reaches a tier's module. The tiers are the store's own;
#: the engine's pool has its public home in kvstore.pool, every other tier is built from
#: configuration (kvstore.build_store, kvstore.build_tier) and used as a kvstore.Tier.
ABOVE_THE_STORE = ("connector", "runtime", "server", "bench", "scripts")


def _imported_names(path: Path) -> set[str]:
    """Every module ``path`` imports, and ``package.name`` of each ``from package import name``
    (so ``from kvstore import tiers`` is kvstore.tiers), at any depth of the file."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return names


def test_nothing_above_the_store_imports_a_tier() -> None:
    """No module of connector/, runtime/, server/, bench/ or scripts/ imports kvstore.tiers (nor
    one of its modules), with no exception."""
    bad = {
        str(p.relative_to(ROOT)): sorted(
            m for m in _imported_names(p) if m == "kvstore.tiers" or m.startswith("kvstore.tiers."))
        for d in ABOVE_THE_STORE
        for p in (ROOT / d).rglob("*.py")
    }
    assert {k: v for k, v in bad.items() if v} == {}


def test_public_surface() -> None:
    assert set(kvstore.__all__) == {
        "FORMAT_VERSION", "BlockChain", "BlockMeta", "ConfigError", "EvictionPolicy", "GetResult",
        "InvalidArgument", "KVLayout", "KVStoreConfig", "KVStoreError", "Lease", "LeaseError",
        "LookupResult", "Metrics", "Namespace", "PutResult", "RecordError", "StoreStats", "Tier",
        "TierStats", "TierUnavailable", "TieredStore", "UnknownComponent", "available_policies",
        "build_namespace", "build_store", "build_tier", "chain_keys", "load_config", "make_policy",
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
