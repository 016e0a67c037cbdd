"""docs/configuration.md is generated from the config models (kvstore.config_reference): it is
what render() gives, it names every field of every model, and every field says what it does."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from kvstore.config import KVStoreConfig, setting_variables
from kvstore.config_reference import PAGE, all_fields, env_name, main, render
from kvstore.tiers import tier_config_models


def _models() -> list[type[BaseModel]]:
    """KVStoreConfig, its tables and every tier kind's model."""
    tables = [f.annotation for f in KVStoreConfig.model_fields.values()
              if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)]
    return [KVStoreConfig, *tables, *tier_config_models()]


def _tier_section(page: str, kind: str) -> str:
    start = page.index(f"### `{kind}` tier")
    ends = [i for i in (page.find("\n### ", start + 1), page.find("\n## ", start + 1)) if i != -1]
    return page[start:min(ends)]


def test_the_page_is_up_to_date() -> None:
    assert PAGE.exists(), "run `python -m kvstore.config_reference --write`"
    assert PAGE.read_text(encoding="utf-8") == render(), (
        "docs/configuration.md is stale: run `python -m kvstore.config_reference --write`")


def test_render_is_deterministic() -> None:
    assert render() == render()


def test_every_field_is_on_the_page() -> None:
    page = render()
    for name, field in KVStoreConfig.model_fields.items():
        assert f"`{name}`" in page, name
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            assert f"## `{name}`" in page, name
            for subname in sub.model_fields:
                row = f"| `{name}.{subname}` |"
                assert row in page, row
                assert f"`{env_name(name, subname)}`" in page, (name, subname)
    for model in tier_config_models():
        kind = model.model_fields["kind"].default
        section = _tier_section(page, kind)
        for fname in model.model_fields:
            assert f"| `tiers[].{fname}` |" in section, (kind, fname)


def test_variables_are_the_ones_the_config_reads() -> None:
    """Each variable on the page is one the config accepts (kvstore.config.setting_variables)."""
    page = render()
    for name, _ in all_fields():
        if not name.startswith("tiers[]."):
            var = env_name(*name.split("."))
            assert var in setting_variables(), name
            assert f"`{var}`" in page, var
    assert env_name("store", "write_policy") == "KVSTORE_STORE__WRITE_POLICY"
    assert env_name("tiers") == "KVSTORE_TIERS"


def test_every_field_has_a_description() -> None:
    missing = [
        f"{model.__module__}.{model.__qualname__}.{name}"
        for model in _models()
        for name, field in model.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert missing == [], (
        "give these fields a Field(description=...): the configuration reference shows it")


def test_all_fields_covers_every_model() -> None:
    names = {n for n, _ in all_fields()}
    for model in _models()[1:]:
        for fname in model.model_fields:
            assert any(n.endswith(f".{fname}") for n in names), (model, fname)


def test_main_prints_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert capsys.readouterr().out == render()
