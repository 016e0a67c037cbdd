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
        ("c.conf", "{}", "reads TOML"),
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
    assert redis.kind == "redis" and redis.password.get_secret_value() == "s3cret"
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


# ----------------------------------------------------------------- sizes

def _env_error(monkeypatch: pytest.MonkeyPatch, **env: str) -> ConfigError:
    """The ConfigError load_config() raises with these variables set."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        load_config()
    return info.value


def _tier_error(monkeypatch: pytest.MonkeyPatch, capacity: str) -> str:
    tiers = f'[{{"kind": "host", "capacity": {capacity}}}]'
    return _env_error(monkeypatch, KVSTORE_TIERS=tiers).message


@pytest.mark.parametrize(
    "capacity, why",
    [
        ("1.5", "not a whole number of bytes: give an integer or a size with a binary unit "
                "such as '512MiB' (got 1.5)"),
        ('"-1GiB"', "negative sizes are not allowed (got '-1GiB')"),
        ("-1", "negative sizes are not allowed (got -1)"),
        ('"1GB"', "'GB' is a decimal (SI) unit, which kvstore does not take: use KiB, MiB, GiB, "
                  "TiB or PiB (1GiB = 2**30 bytes) (got '1GB')"),
        ('"lots"', "not a size: give a number of bytes or a size with a binary unit such as '512MiB' "
                   "(got 'lots')"),
    ],
)
def test_bad_sizes_are_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capacity: str, why: str
) -> None:
    assert _tier_error(monkeypatch, capacity) == (
        f"invalid kvstore configuration:\n  tiers.0.host.capacity (KVSTORE_TIERS): {why}"
    )


def test_a_bare_number_is_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _tier_error(monkeypatch, '"4"') == (
        "invalid kvstore configuration:\n  tiers.0.capacity (KVSTORE_TIERS): 4B holds no page "
        "of 2MiB for this layout (a number without a unit is bytes)"
    )
    monkeypatch.setenv("KVSTORE_TIERS", '[{"kind": "host", "capacity": "4194304"}]')
    assert load_config().tiers[0].capacity == 4 << 20


def test_sizes_print_in_binary_units(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "c.toml", '[[tiers]]\nkind = "host"\ncapacity = 1610612736\n'))
    assert cfg.tiers[0].capacity == 1536 << 20
    dumped = cfg.model_dump(mode="json")
    assert dumped["tiers"][0]["capacity"] == "1536MiB"
    assert dumped["tiers"][0]["kind"] == "host"
    assert load_config(overrides={"tiers": [{"kind": "host", "capacity": "1000B"}],
                                  "layout": {"num_layers": 1, "num_kv_heads": 1, "head_dim": 1,
                                             "block_size": 1}}
                       ).model_dump(mode="json")["tiers"][0]["capacity"] == "1000B"


# ----------------------------------------------------------------- environment

def test_unknown_variable_is_refused_like_a_file_typo(monkeypatch: pytest.MonkeyPatch) -> None:
    error = _env_error(monkeypatch, KVSTORE_MODLE_ID="meta-llama/Llama-3.1-8B",
                       KVSTORE_STORE__PREFETCH_WORKRS="4")
    assert error.message == (
        "unknown KVSTORE_* variables:\n"
        "  KVSTORE_MODLE_ID (did you mean KVSTORE_MODEL_ID?)\n"
        "  KVSTORE_STORE__PREFETCH_WORKRS (did you mean KVSTORE_STORE__PREFETCH_WORKERS?)"
    )
    assert "docs/configuration.md" in error.hint


def test_tool_variables_are_not_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("KVSTORE_NATIVE_CACHE", "KVSTORE_TORCH_SPEC", "KVSTORE_COPY_BLOCKS"):
        monkeypatch.setenv(name, "x")
    monkeypatch.setenv("KVSTORE_NATIVE", "0")
    assert load_config().model_id == "default"


def test_every_kvstore_variable_the_code_reads_is_known() -> None:
    """A variable some code or script reads must not be refused as a typo: it is a config field
    or one of config.OTHER_VARIABLES."""
    import re

    from kvstore.config import OTHER_VARIABLES, setting_variables

    read = re.compile(r"""(?:environ\.get\(|environ\[|getenv\(|\$\{?)["']?(KVSTORE_[A-Z0-9_]+)""")
    root = Path(__file__).parents[2]
    seen: set[str] = set()
    for p in root.rglob("*"):
        if p.suffix in (".py", ".sh") and ".venv" not in p.parts and p.is_file():
            seen |= set(read.findall(p.read_text()))
    assert {"KVSTORE_NATIVE", "KVSTORE_CRASH_CYCLES", "KVSTORE_TORCH_SPEC"} <= seen
    assert seen - set(OTHER_VARIABLES) - setting_variables() == set()


@pytest.mark.parametrize("value", ["banana", "2", "yes"])
def test_bad_native_switch_is_an_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    error = _env_error(monkeypatch, KVSTORE_NATIVE=value)
    assert error.message == f"KVSTORE_NATIVE={value!r}: must be auto, 0 or 1"


def test_malformed_json_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    error = _env_error(monkeypatch, KVSTORE_TIERS='[{"kind": "host",')
    assert error.message == (
        "KVSTORE_TIERS is not valid JSON: Expecting property name enclosed in double quotes: "
        "line 1 column 18 (char 17)"
    )
    assert "KVSTORE_TIERS='[" in error.hint


def test_environment_errors_name_the_variable_not_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = write(tmp_path, "c.toml", 'model_id = "m"\n')
    monkeypatch.setenv("KVSTORE_STORE__PREFETCH_WORKERS", "0")
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert info.value.message == (
        "invalid kvstore configuration:\n  store.prefetch_workers "
        "(KVSTORE_STORE__PREFETCH_WORKERS): Input should be greater than or equal to 1 (got '0')"
    )
    assert info.value.hint == "fix the variable(s) named above"
    bad = write(tmp_path, "bad.toml", '[store]\nprefetch_workers = 0\n')
    monkeypatch.delenv("KVSTORE_STORE__PREFETCH_WORKERS")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert info.value.hint == f"fix the field(s) named above in {bad}"


def test_json_file_lists_the_formats(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "c.json", "{}"))
    assert info.value.message == (
        f"config file {tmp_path / 'c.json'}: kvstore reads TOML (.toml) and YAML (.yaml, .yml), "
        "not .json"
    )
    assert "rename" not in str(info.value)


def test_host_tier_larger_than_the_machine_can_map() -> None:
    cfg = load_config(overrides={"tiers": [{"kind": "host", "capacity": "64MiB"},
                                           {"kind": "host", "name": "big", "capacity": "1PiB"}]})
    with pytest.raises(ConfigError) as info:
        build_store(cfg)
    assert info.value.message.startswith(
        "tiers.1 ('big'): host tier 'big' asks for 1048576.0 GiB of memory; this machine has "
    )
    assert "tiers.1.capacity" in info.value.hint


def test_every_tier_kind_declares_its_config_model_and_the_union_is_the_registry_s() -> None:
    from typing import get_args

    from kvstore.config import TierConfig
    from kvstore.tiers import TIER_CONFIGS, TIERS, tier_class, tier_config_models

    assert set(TIER_CONFIGS) == set(TIERS)
    for kind, model in zip(TIER_CONFIGS, tier_config_models()):
        assert model.model_fields["kind"].default == kind
        assert tier_class(kind).config_model is model  # the constructor takes that model
    union, _discriminator = get_args(TierConfig)
    assert list(get_args(union)) == tier_config_models()


def test_loading_the_tier_config_models_imports_no_tier_dependency() -> None:
    """Every configuration load imports every kind's model: a model's module must not import
    what only its tier needs (lmdb, redis, torch)."""
    import subprocess
    import sys

    code = ("import sys; from kvstore.tiers import tier_config_models; tier_config_models(); "
            "print(sorted({'lmdb', 'redis', 'torch'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------- secrets

SECRET = "Xq7-s3cret-pw"
HOST = {"kind": "host", "capacity": "64MiB"}


def _redis(**fields: object) -> dict[str, object]:
    return {"tiers": [HOST, {"kind": "redis", **fields}]}


@pytest.mark.parametrize("overrides, loc, why", [
    (_redis(url=f"redis://u:{SECRET}@h:1/0"), "tiers.1.redis.url",
     "put the password in the 'password' field (a secret), not in url (got 'redis://***@h:1/0')"),
    (_redis(url=f"redis://:{SECRET}@h:1/0"), "tiers.1.redis.url",
     "put the password in the 'password' field (a secret), not in url (got 'redis://***@h:1/0')"),
    (_redis(url=f"redis://h:1/0?password={SECRET}"), "tiers.1.redis.url",
     "put the password in the 'password' field (a secret), not in url "
     "(got 'redis://h:1/0?password=***')"),
    (_redis(url=f"http://u:{SECRET}@h:1/0"), "tiers.1.redis.url",
     "must start with redis:// or rediss:// (got 'http://***@h:1/0')"),
    (_redis(cluster_nodes=[f"u:{SECRET}@h:1"]), "tiers.1.redis.cluster_nodes",
     "nodes are 'host:port': put the username and password in their fields (the password is "
     "a secret), not in cluster_nodes (got ['***@h:1'])"),
    (_redis(url="redis://h:1/0", pasword=SECRET),  # a misspelt secret field
     "tiers.1.redis.pasword", "Extra inputs are not permitted"),
    (_redis(url="redis://h:1/0", password=[SECRET]), "tiers.1.redis.password",
     "Input should be a valid string"),
    ({"tiers": [HOST, f"redis://:{SECRET}@h:1/0"]}, "tiers.1",
     "Input should be a valid dictionary or object to extract fields from "
     "(got 'redis://***@h:1/0')"),
    ({"security": {"secret": SECRET}}, "security",
     "the secret has 13 bytes, needs at least 16 (e.g. `openssl rand -hex 32`)"),
    ({"admin": {"token": [SECRET]}}, "admin.token", "Input should be a valid string"),
], ids=["userinfo", "password only", "query", "other scheme", "cluster node", "misspelt field",
        "not a string", "tier as a string", "short deployment secret", "admin token"])
def test_a_secret_in_a_bad_value_is_never_shown(
    overrides: dict[str, object], loc: str, why: str, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A value that holds a password is refused with the password masked or left out: in the
    message, the hint, the repr and the traceback, whether it came from overrides, a file or a
    variable."""
    import json
    import traceback

    import yaml

    ((name, value),) = overrides.items()
    with pytest.raises(ConfigError) as given:
        load_config(overrides=overrides)
    with pytest.raises(ConfigError) as in_file:
        load_config(write(tmp_path, "c.yaml", yaml.safe_dump(overrides)))
    monkeypatch.setenv(f"KVSTORE_{name.upper()}", json.dumps(value))
    with pytest.raises(ConfigError) as in_env:
        load_config()
    head = "invalid kvstore configuration:\n  "
    assert given.value.message == in_file.value.message == f"{head}{loc}: {why}"
    assert in_env.value.message == f"{head}{loc} (KVSTORE_{name.upper()}): {why}"
    for exc in (given.value, in_file.value, in_env.value):
        text = [exc.hint, str(exc), repr(exc), "".join(traceback.format_exception(exc))]
        assert not [t for t in text if SECRET in t]


def test_a_yaml_syntax_error_does_not_quote_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "c.yaml", f'tiers:\n  - kind: redis\n    password: {SECRET}: x\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.message == (
        f"config file {path} is not valid YAML: mapping values are not allowed here "
        "(line 3, column 28)"
    )
