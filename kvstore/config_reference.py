"""The configuration reference, ``docs/configuration.md``, generated from the config models so it
cannot drift from them: every field of :class:`kvstore.config.KVStoreConfig` and of every tier
kind's model (:func:`kvstore.tiers.tier_config_models`), in declaration order, with its type,
default, bounds, description (the field's ``description``) and environment variable.

    python -m kvstore.config_reference           # print the page
    python -m kvstore.config_reference --write   # rewrite docs/configuration.md

``tests/unit/test_config_reference.py`` fails when the committed page differs from
:func:`render`, and when a field has no description.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeGuard, Union, get_args, get_origin

from pydantic import BaseModel, ByteSize, SecretStr
from pydantic.fields import FieldInfo
from pydantic.types import PathType

from kvstore.config import OTHER_VARIABLES, KVStoreConfig
from kvstore.policy import POLICIES
from kvstore.sizes import format_size
from kvstore.tiers import tier_config_models
from kvstore.tiers.config_base import TierConfigBase

#: Where ``--write`` puts the page: docs/configuration.md at the repository root.
PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

#: Names that make a default factory's value depend on the machine it runs on (looked up in
#: the factory's code and in the module functions it calls).
_MACHINE_NAMES = frozenset({"cpu_count", "process_cpu_count", "sched_getaffinity",
                            "usable_cores", "default_mac_threads", "virtual_memory",
                            "gethostname", "is_available", "device_count"})

_ENV_PREFIX: str = KVStoreConfig.model_config.get("env_prefix", "").upper()
_ENV_DELIMITER: str = KVStoreConfig.model_config.get("env_nested_delimiter") or "__"


def env_name(*path: str) -> str:
    """The variable that sets the field at ``path``, e.g. ``KVSTORE_STORE__WRITE_POLICY`` for
    ``("store", "write_policy")`` (pydantic-settings: the prefix, then the path joined by the
    nested delimiter; names are not case-sensitive, written upper-case)."""
    return _ENV_PREFIX + _ENV_DELIMITER.join(p.upper() for p in path)


def all_fields() -> Iterator[tuple[str, FieldInfo]]:
    """Every documented field as ``(dotted name, FieldInfo)``: ``KVStoreConfig``'s own (its
    tables included), each table's (``layout.block_size``) and each tier kind's
    (``tiers[].capacity``, once per kind)."""
    for name, field in KVStoreConfig.model_fields.items():
        yield name, field
        if _is_model(field.annotation):
            for sub, subfield in field.annotation.model_fields.items():
                yield f"{name}.{sub}", subfield
    for model in tier_config_models():
        for name, field in model.model_fields.items():
            yield f"tiers[].{name}", field


def render() -> str:
    """The whole page (Markdown), the same on every machine and every run."""
    out: list[str] = [
        "# Configuration reference",
        "",
        "<!-- Generated from the config models by `python -m kvstore.config_reference --write`;"
        " do not edit by hand. -->",
        "",
        *_INTRO,
        "",
        "## Top level",
        "",
        *_table([_row((name,), field, top=True)
                 for name, field in KVStoreConfig.model_fields.items()], env=True),
    ]
    for name, field in KVStoreConfig.model_fields.items():
        if name == "tiers":
            out += _tiers_part()
        elif _is_model(field.annotation):
            model = field.annotation
            out += ["", f"## `{name}`", ""]
            doc = _docstring(model)
            if doc:
                out += [doc, ""]
            out += _table([_row((name, sub), f) for sub, f in model.model_fields.items()],
                          env=True)
    out += ["", "## Other variables", "",
            f"`{_ENV_PREFIX}*` variables that set no field; any other `{_ENV_PREFIX}*` name is "
            "refused like a misspelt field.", "",
            "| variable | meaning |", "| --- | --- |"]
    out += [f"| `{name}` | {_cell(text)} |" for name, text in OTHER_VARIABLES.items()]
    return "\n".join(out) + "\n"


_INTRO = [
    "kvstore has one typed configuration, `kvstore.config.KVStoreConfig`, read from a TOML "
    "(`.toml`) or YAML (`.yaml`, `.yml`) file by `kvstore.load_config(path)` and overridden by "
    f"`{_ENV_PREFIX}*` environment variables: **environment beats file beats defaults**. A "
    f"variable names a field by its path, upper-case, with `{_ENV_DELIMITER}` between levels "
    f"(`{env_name('store', 'write_policy')}=selective`); a whole table or list is JSON "
    f"(`{env_name('tiers')}='[{{\"kind\": \"host\", \"capacity\": \"8GiB\"}}]'`). A bad value "
    "stops the start with a message naming the field (and the variable, when a variable set "
    "it), the value and what is allowed; unknown fields and variables are refused. "
    "`kvstore config [-c FILE]` prints the effective configuration (secrets never shown).",
    "",
    "```toml",
    'model_id = "meta-llama/Llama-3.1-8B"',
    "[store]",
    'write_policy = "write_back"',
    "[[tiers]]",
    'kind = "host"',
    'capacity = "8GiB"',
    "[[tiers]]",
    'kind = "disk"',
    'path = "/nvme/kvstore"',
    'capacity = "1TiB"',
    "```",
    "",
    "**Sizes** are bytes: an integer (`4194304`, or the string `\"4194304\"`: a number without "
    "a unit is bytes) or a number with a binary unit `B KiB MiB GiB TiB PiB` (`\"512MiB\"`, "
    "`\"1.5GiB\"`). Decimal (SI) units such as `\"1GB\"` are refused (some tools read them as "
    "10⁹ bytes, others as 2³⁰), and so are negative sizes and fractions of a byte. "
    "`kvstore config` prints each size in the largest binary unit that states it exactly "
    "(`\"1536MiB\"`).",
    "",
    "In the tables, *unset* means the field is left out (no value: TOML has no null), "
    "*required* that it has no default.",
]


def _tiers_part() -> list[str]:
    tiers = KVStoreConfig.model_fields["tiers"]
    models = tier_config_models()
    kinds = " · ".join(f"[`{_kind(m)}`](#{_kind(m)}-tier)" for m in models)
    out = [
        "", "## `tiers`", "",
        f"{_sentence(tiers.description)} Each entry is a table whose `kind` ({kinds}) selects "
        "its fields below; a tier's `capacity` must hold at least one page of the layout. "
        f"Default: {_default(tiers)} ({_default_tiers()}).",
        "",
        f"From the environment the list is set as a whole: `{env_name('tiers')}` holds it as "
        f"JSON (`{env_name('tiers')}='[{{\"kind\": \"host\", \"capacity\": \"8GiB\"}}, "
        "{\"kind\": \"disk\", \"path\": \"/nvme/kvstore\"}]'`); tier fields have no variables "
        "of their own.",
        "",
        "`policy`, the tier's eviction policy, is one of "
        + " · ".join(f"`{p}`" for p in POLICIES)
        + ", or the import path `package.module:Class` of an `EvictionPolicy` subclass.",
    ]
    for model in models:
        kind = _kind(model)
        out += ["", f"### `{kind}` tier", ""]
        doc = _docstring(model)
        if doc:
            out += [doc, ""]
        out += _table([_row(("tiers[]", name), f) for name, f in model.model_fields.items()],
                      env=False)
    return out


def _default_tiers() -> str:
    factory: Callable[..., Any] | None = KVStoreConfig.model_fields["tiers"].default_factory
    assert factory is not None
    return ", ".join(f"a {t.kind} tier of {format_size(int(t.capacity))}" for t in factory())


# ------------------------------------------------------------------------------------ rows


def _table(rows: list[list[str]], *, env: bool) -> list[str]:
    head = ["field", "type", "default", "bounds", *(["variable"] if env else []), "meaning"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = r if env else r[:4] + r[5:]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _row(path: tuple[str, ...], field: FieldInfo, *, top: bool = False) -> list[str]:
    """field, type, default, bounds, variable (empty for a tier's field), meaning."""
    name = ".".join(path)
    shown = f"`{name}`"
    if top and (_is_model(field.annotation) or name == "tiers"):
        shown = f"[`{name}`](#{name})"
    return [
        shown,
        _cell(_type(field.annotation, field.metadata)),
        _cell(_default(field)),
        _cell(_bounds(field)),
        "" if path[0] == "tiers[]" else f"`{env_name(*path)}`",
        _cell(_markdown(field.description or "")),
    ]


def _type(ann: Any, metadata: Sequence[Any] = ()) -> str:
    """A type written for people: ``int``, ``size``, ``one of: a · b``, ``list of str``."""
    ann, inner = _unwrap(ann)
    metadata = [*metadata, *inner]
    if any(isinstance(m, PathType) and m.path_type == "file" for m in metadata):
        return "path of an existing file"
    origin = get_origin(ann)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(ann) if a is not type(None)]
        if len(args) == 1:
            return _type(args[0], metadata)
        if all(get_origin(_unwrap(a)[0]) is Literal or _unwrap(a)[0] is bool for a in args):
            values: list[Any] = []
            for a in args:
                a = _unwrap(a)[0]
                values += [True, False] if a is bool else list(get_args(a))
            return "one of: " + " · ".join(_literal(v) for v in values)
        return " or ".join(_type(a) for a in args)
    if origin is Literal:
        return "one of: " + " · ".join(_literal(v) for v in get_args(ann))
    if origin is list:
        (item,) = get_args(ann)
        return "list of " + ("tier tables" if _is_tier_union(item) else _type(item))
    if isinstance(ann, type):
        if issubclass(ann, ByteSize):
            return 'size (e.g. "512MiB")'
        if issubclass(ann, SecretStr):
            return "secret (str, never printed)"
        if issubclass(ann, BaseModel):
            return "table"
        if issubclass(ann, Path):
            return "path"
        if ann in (str, int, float, bool):
            return ann.__name__
    return str(ann)  # pragma: no cover - a new kind of field: shows up in the page's review


def _unwrap(ann: Any) -> tuple[Any, list[Any]]:
    """``Annotated[T, m...]`` -> ``(T, [m...])``; other types unchanged."""
    if get_origin(ann) is Annotated:
        base, *meta = get_args(ann)
        inner_base, inner_meta = _unwrap(base)
        return inner_base, [*meta, *inner_meta]
    return ann, []


def _is_tier_union(ann: Any) -> bool:
    base, _ = _unwrap(ann)
    args = get_args(base) if get_origin(base) in (Union, types.UnionType) else (base,)
    return all(isinstance(a, type) and issubclass(a, TierConfigBase) for a in args)


def _is_model(ann: Any) -> TypeGuard[type[BaseModel]]:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def _literal(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        factory: Callable[..., Any] = field.default_factory
        if _machine_dependent(factory):
            return "(depends on this machine)"
        if len(inspect.signature(factory).parameters) == 0:
            return _toml(factory())
        return "(computed from the other fields)"  # pragma: no cover - no such field yet
    if field.is_required():
        return "required"
    if field.default is None:
        return "unset"
    if isinstance(field.default, BaseModel):
        return "(the defaults below)"
    return _toml(field.default)


def _machine_dependent(fn: Callable[..., Any], depth: int = 0) -> bool:
    code = getattr(fn, "__code__", None)
    if code is None or depth > 3:
        return False
    names = set(code.co_names)
    if names & _MACHINE_NAMES:
        return True
    scope = getattr(fn, "__globals__", {})
    return any(inspect.isfunction(scope.get(n)) and _machine_dependent(scope[n], depth + 1)
               for n in names)


def _toml(value: Any) -> str:
    """``value`` as it would be written in TOML, in backticks."""
    return f"`{_toml_value(value)}`"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, ByteSize):
        return json.dumps(format_size(int(value)))
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (str, Path)):
        return json.dumps(str(value), ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, TierConfigBase):
        # the fields a file would set: the kind alone gives every other default
        data = {"kind": value.kind, **value.model_dump(mode="json", exclude_defaults=True)}
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in data.items()) + " }"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {value!r}")  # pragma: no cover


def _bounds(field: FieldInfo) -> str:
    """``≥ 1, ≤ 65535``, ``> 0``, ``length ≥ 1``, ``matches `regex```, or empty."""
    metadata = [*field.metadata, *_unwrap(field.annotation)[1]]
    base = _unwrap(field.annotation)[0]
    if get_origin(base) in (Union, types.UnionType):
        for arg in get_args(base):
            metadata += _unwrap(arg)[1]
    size = _type(field.annotation, field.metadata).startswith("size")

    def num(v: Any) -> str:
        return f'"{format_size(int(v))}"' if size else repr(v)

    found: list[str] = []
    for attr, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
        found += [f"{sign} {num(getattr(m, attr))}" for m in metadata
                  if getattr(m, attr, None) is not None]
    for attr, sign in (("min_length", "≥"), ("max_length", "≤")):
        found += [f"length {sign} {getattr(m, attr)}" for m in metadata
                  if getattr(m, attr, None) is not None]
    found += [f"matches `{m.pattern}`" for m in metadata if getattr(m, "pattern", None)]
    return ", ".join(found)


# ------------------------------------------------------------------------------------ text


def _kind(model: type[BaseModel]) -> str:
    return str(model.model_fields["kind"].default)


def _docstring(model: type[BaseModel]) -> str:
    """The model's own docstring (not an inherited one) as Markdown paragraphs."""
    doc = model.__dict__.get("__doc__")
    if not doc:
        return ""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(_markdown(" ".join(p.split())) for p in paragraphs)


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def _markdown(text: str) -> str:
    """reST inline markup to Markdown: ``code`` and :role:`target` become `code`."""
    text = _ROLE.sub(r"`\1`", text).replace("``", "`")
    # outside code spans, <word> would be read as an HTML tag
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;")
    return "`".join(parts)


def _sentence(text: str | None) -> str:
    text = (text or "").strip()
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".") if text else ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvstore.config_reference",
        description="Generate the configuration reference from the config models.")
    parser.add_argument("--write", action="store_true",
                        help=f"write {PAGE.parent.name}/{PAGE.name} instead of printing the page")
    args = parser.parse_args(argv)
    page = render()
    if args.write:
        PAGE.parent.mkdir(parents=True, exist_ok=True)
        PAGE.write_text(page, encoding="utf-8")
        print(f"wrote {PAGE}")
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
