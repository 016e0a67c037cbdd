"""The per-deployment secret: where it comes from (config, environment, a file), what it keys
(tenant salts here; record MACs in test_record.py and tests/tiers/test_record_mac.py), and that
it never shows: not in messages, reprs, logs or ``kvstore config``."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import blake3
import pytest
import xxhash
from typer.testing import CliRunner

from kvstore import ConfigError, KVLayout, Namespace, build_namespace, build_store, load_config
from server.cli import app

LAYOUT = KVLayout(32, 8, 128, 16, "bfloat16")
MODEL = "meta-llama/Llama-3.1-8B"
SECRET_A = "deployment-A-7f3c9e1a5b2d4c6e8f0a"
SECRET_B = "deployment-B-7f3c9e1a5b2d4c6e8f0a"
TOKENS = list(range(40))


def test_without_a_secret_keys_are_todays() -> None:
    """The key spec's test vector (docs/keys-and-pages.md) holds with no secret (and with secret=None)."""
    for ns in (Namespace(MODEL, LAYOUT), Namespace(MODEL, LAYOUT, "", None)):
        assert ns.seed.hex() == "23b30a8b666ca22d42a312935d0ba2b1"
        assert ns.chain(TOKENS).keys[0].hex() == "d1e799d21a96c5ba1c39f989b0582e33"


def test_two_deployments_give_different_keys_for_the_same_salt_and_tokens() -> None:
    plain = Namespace(MODEL, LAYOUT, "tenant-a")
    a = Namespace(MODEL, LAYOUT, "tenant-a", SECRET_A.encode())
    b = Namespace(MODEL, LAYOUT, "tenant-a", SECRET_B.encode())
    seeds = {plain.seed, a.seed, b.seed}
    keys = {tuple(ns.chain(TOKENS).keys) for ns in (plain, a, b)}
    assert len(seeds) == 3 and len(keys) == 3
    assert a != b and a != plain
    # Deterministic: every process of one deployment computes the same keys.
    assert Namespace(MODEL, LAYOUT, "tenant-a", SECRET_A.encode()).chain(TOKENS).keys == (
        a.chain(TOKENS).keys
    )
    assert Namespace(MODEL, LAYOUT, "tenant-a", SECRET_A.encode()) == a


def test_the_keyed_salt_follows_the_spec() -> None:
    """The key spec (docs/keys-and-pages.md): with a secret, the salt field of the seed's material is
    BLAKE3(salt, key=derive_key("kvstore tenant salt v1", secret)), 32 bytes."""
    a = Namespace(MODEL, LAYOUT, "tenant-a", SECRET_A.encode())
    key = blake3.blake3(SECRET_A.encode(), derive_key_context="kvstore tenant salt v1").digest()
    salt = blake3.blake3(b"tenant-a", key=key).digest()
    material = (b"kvstore-ns/v1\0" + LAYOUT.fingerprint + struct.pack("<I", len(MODEL))
                + MODEL.encode() + struct.pack("<I", len(salt)) + salt)
    assert a.seed == xxhash.xxh3_128_digest(material)


def test_the_secret_is_not_in_a_namespace_repr() -> None:
    a = Namespace(MODEL, LAYOUT, "tenant-a", SECRET_A.encode())
    assert SECRET_A not in repr(a) and SECRET_A not in str(a)
    assert not any(SECRET_A.encode() in getattr(a, f, b"") for f in ("seed",))


# --------------------------------------------------------------------- configuration


def test_secret_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSTORE_SECURITY__SECRET", SECRET_A)
    cfg = load_config(overrides={"tenant_salt": "tenant-a"})
    assert cfg.security.secret_bytes() == SECRET_A.encode()
    assert build_namespace(cfg) == Namespace("default", cfg.layout.build(), "tenant-a",
                                             SECRET_A.encode())


def test_secret_from_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kvstore.secret"
    path.write_text(SECRET_B + "\n")  # as `openssl rand -hex 32 > file` leaves it
    path.chmod(0o600)
    monkeypatch.setenv("KVSTORE_SECURITY__SECRET_FILE", str(path))
    cfg = load_config()
    assert cfg.security.secret_bytes() == SECRET_B.encode()


def test_no_secret_by_default() -> None:
    assert load_config().security.secret_bytes() is None


@pytest.mark.parametrize(
    "security, match",
    [
        ({"secret": SECRET_A, "secret_file": "/etc/hostname"}, "exactly one"),
        ({"secret": "short-" + SECRET_A[:4]}, "at least 16"),
        ({"secret_file": "/nonexistent/kvstore.secret"}, "secret_file"),
    ],
)
def test_bad_secrets_are_refused_without_showing_them(security: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        load_config(overrides={"security": security})
    text = str(info.value) + info.value.hint
    assert security.get("secret", "\0") not in text and SECRET_A[:10] not in text


def test_short_secret_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s"
    path.write_text("tooshort\n")
    with pytest.raises(ConfigError, match="at least 16") as info:
        load_config(overrides={"security": {"secret_file": str(path)}})
    assert "tooshort" not in str(info.value)


def test_the_secret_never_shows(monkeypatch: pytest.MonkeyPatch, caplog, tmp_path: Path) -> None:
    monkeypatch.setenv("KVSTORE_SECURITY__SECRET", SECRET_A)
    monkeypatch.setenv(
        "KVSTORE_TIERS",
        '[{"kind": "host", "capacity": "8MiB"}, '
        f'{{"kind": "disk", "capacity": "8MiB", "path": "{tmp_path / "d"}"}}]',
    )
    caplog.set_level(logging.DEBUG)
    cfg = load_config()
    for text in (repr(cfg), str(cfg), cfg.model_dump_json(), repr(cfg.security)):
        assert SECRET_A not in text
    result = CliRunner().invoke(app, ["config"])
    assert result.exit_code == 0 and '"security"' in result.output
    assert SECRET_A not in result.output
    with build_store(cfg) as store:
        for tier in store.tiers:
            assert SECRET_A not in repr(tier) and SECRET_A not in repr(vars(tier))
    assert not any(SECRET_A in r.getMessage() for r in caplog.records)
