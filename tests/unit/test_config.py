"""Typed configuration: files, environment overrides, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore import ConfigError, build_store, load_config


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_defaults_build_a_store() -> None:
    cfg = load_config()
    assert cfg.layout.build().page_bytes == 2 * 2**20
    with build_store(cfg) as store:
        assert [t.name for t in store.tiers] == ["host"]
        assert store.tiers[0].capacity_pages == 512


def test_toml_and_yaml_agree(tmp_path: Path) -> None:
    toml = write(tmp_path, "c.toml", """
model_id = "m"
[layout]
num_layers = 2
num_kv_heads = 2
head_dim = 4
block_size = 4
dtype = "float16"
[store]
write_policy = "write_through"
[[tiers]]
kind = "host"
name = "hot"
capacity = "4KiB"
policy = "s3fifo"
[[tiers]]
kind = "host"
name = "warm"
capacity = "64KiB"
policy = "lineage"
""")
    yaml = write(tmp_path, "c.yaml", """
model_id: m
layout: {num_layers: 2, num_kv_heads: 2, head_dim: 4, block_size: 4, dtype: float16}
store: {write_policy: write_through}
tiers:
  - {kind: host, name: hot, capacity: 4KiB, policy: s3fifo}
  - {kind: host, name: warm, capacity: 64KiB, policy: lineage}
""")
    a, b = load_config(toml), load_config(yaml)
    assert a == b
    with build_store(a) as store:
        assert [t.capacity_pages for t in store.tiers] == [16, 256]
        assert [p.name for p in store.policies] == ["s3fifo", "lineage"]
        assert store.write_policy == "write_through"


def test_environment_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = write(tmp_path, "c.toml", 'model_id = "from-file"\n[store]\nwrite_policy = "write_back"\n')
    monkeypatch.setenv("KVSTORE_MODEL_ID", "from-env")
    monkeypatch.setenv("KVSTORE_STORE__WRITE_POLICY", "selective")
    monkeypatch.setenv("KVSTORE_LAYOUT__BLOCK_SIZE", "32")
    monkeypatch.setenv("KVSTORE_TIERS", '[{"kind": "host", "capacity": "1GiB", "policy": "arc"}]')
    cfg = load_config(p)
    assert cfg.model_id == "from-env"
    assert cfg.store.write_policy == "selective"
    assert cfg.layout.block_size == 32
    assert cfg.tiers[0].policy == "arc"


@pytest.mark.parametrize(
    "text, field, allowed",
    [
        ('[store]\nwrite_policy = "write_around"', "store.write_policy", "write_through"),
        ('[layout]\nnum_layers = 0', "layout.num_layers", "greater than 0"),
        ('[layout]\ndtype = "float64"', "layout.dtype", "bfloat16"),
        ('[[tiers]]\nkind = "host"\npolicy = "mru"', "tiers.0.host.policy", "lineage"),
        ('[[tiers]]\nkind = "host"\ncapacity = "lots"', "tiers.0.host.capacity", "byte"),
        ('[[tiers]]\nkind = "host"\ncapacity = "1KiB"', "tiers.0.capacity", "holds no page"),
        ('[[tiers]]\nkind = "tape"', "tiers.0", "host"),
        ('[store]\nlease_ttl_s = -1', "store.lease_ttl_s", "greater than 0"),
        ('bogus = 1', "bogus", "Extra inputs"),
        ('tiers = []', "tiers", "at least 1"),
        ('[connector]\nprefetch_policy = "sometimes"', "connector.prefetch_policy", "wait_complete"),
        ('[connector]\nprefetch_timeout_s = 0', "connector.prefetch_timeout_s", "greater than 0"),
        ('[connector]\nhost_tier = "nvme"', "connector.host_tier", "not a host tier"),

    ],
)
def test_bad_values_name_the_field(tmp_path: Path, text: str, field: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "bad.toml", text))
    msg = str(info.value)
    assert field in msg and allowed in msg


def test_bad_environment_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSTORE_STORE__SELECTIVE_HITS", "zero")
    with pytest.raises(ConfigError, match="store.selective_hits"):
        load_config()


@pytest.mark.parametrize(
    "name, text, match",
    [
        ("c.toml", "model_id = ", "not valid TOML"),
        ("c.yaml", "a: [1,", "not valid YAML"),
        ("c.json", "{}", "must end in"),
        ("c.yaml", "- 1\n- 2", "mapping"),
    ],
)
def test_bad_files(tmp_path: Path, name: str, text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(write(tmp_path, name, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.toml")


def test_redis_tier_settings_are_validated(tmp_path: Path) -> None:
    ok = load_config(write(tmp_path, "r.toml", """
[[tiers]]
kind = "host"
capacity = "1GiB"
[[tiers]]
kind = "redis"
url = "redis://127.0.0.1:6390/0"
password = "s3cret"
capacity = "8GiB"
policy = "lineage"
ttl_s = 3600
"""))
    redis = ok.tiers[1]
    assert redis.kind == "redis" and redis.tier_kwargs()["password"] == "s3cret"
    assert "s3cret" not in ok.model_dump_json()  # secrets never print
    for text, field in [
        ('url = "redis://u:pw@h:1/0"', "password"),
        ('url = "http://h:1"', "redis://"),
        ('cluster_nodes = ["h:1"]\nurl = "redis://h:1"', "exactly one"),
        ('url = "redis://h:1"\ntimeout_s = 0', "timeout_s"),
    ]:
        with pytest.raises(ConfigError, match=field):
            load_config(write(tmp_path, "bad.toml", f'[[tiers]]\nkind = "redis"\n{text}\n'))


def test_hbm_tier_from_config() -> None:
    cfg = load_config(overrides={
        "layout": {"num_layers": 2, "num_kv_heads": 2, "head_dim": 4, "block_size": 4,
                   "dtype": "float16"},
        "tiers": [{"kind": "hbm", "capacity": 8 * 256, "device": "cpu"},
                  {"kind": "host", "capacity": 16 * 256}],
    })
    with build_store(cfg) as store:
        hbm = store.tiers[0]
        assert hbm.kind == "hbm" and hbm.capacity_pages == 8
        assert hbm.allocate(8) is not None and hbm.allocate(1) is None  # back-pressure
