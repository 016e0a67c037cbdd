"""``kvstore pin``, ``kvstore unpin``, ``kvstore budget`` and ``kvstore retention``: a namespace's
retention through a running daemon's admin API (its ``/v1/namespaces/{id}/pins``, ``budgets``
and ``retention`` routes). URL and token as for ``kvstore stats`` (:mod:`server.cli_admin`).
Input is checked here first, so a mistake is a usage error (exit 2) naming the option."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Optional
from urllib.parse import quote

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvstore.retention import MAX_TTL_S
from kvstore.sizes import format_size, parse_size
from server.cli_admin import AdminClient, ConfigOpt, UrlOpt

console = Console()
_HEX_ID = re.compile(r"[0-9a-fA-F]{32}")
NamespaceOpt = Annotated[str, typer.Option(
    help="the namespace id (32 hex digits), as `kvstore stats` lists them")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the admin API's answer as JSON")]


def _namespace(value: str) -> str:
    if not _HEX_ID.fullmatch(value):
        raise typer.BadParameter(f"{value!r} is not a namespace id (32 hex digits)",
                                 param_hint="--namespace")
    return value.lower()


def _read_items(path: Path, what: str, option: str) -> list[str]:
    """The items of a file (``-``: stdin): a JSON array, or items separated by whitespace or
    commas."""
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc.strerror}", param_hint=option) from None
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"{path} is not a JSON array: {exc}", param_hint=option) from None
        if not isinstance(items, list):
            raise typer.BadParameter(f"{path} is not a JSON array", param_hint=option)
        out = [str(x) if not isinstance(x, str) else x for x in items]
    else:
        out = [x for x in re.split(r"[\s,]+", text) if x]
    if not out:
        raise typer.BadParameter(f"{path} holds no {what}", param_hint=option)
    return out


def _keys(path: Path) -> list[str]:
    keys = _read_items(path, "block keys", "--keys-file")
    for i, k in enumerate(keys):
        if not _HEX_ID.fullmatch(k):
            raise typer.BadParameter(f"item {i} of {path}, {k[:40]!r}, is not a block key "
                                     "(32 hex digits)", param_hint="--keys-file")
    return keys


def _tokens(path: Path) -> list[int]:
    items = _read_items(path, "token ids", "--tokens-file")
    out = []
    for i, t in enumerate(items):
        if not t.isdigit() or int(t) > 2**31 - 1:
            raise typer.BadParameter(f"item {i} of {path}, {t[:40]!r}, is not a token id "
                                     "(an integer in [0, 2**31))", param_hint="--tokens-file")
        out.append(int(t))
    return out


def pin(
    namespace: NamespaceOpt,
    ttl: Annotated[float, typer.Option(help=f"seconds the pin lasts (at most {MAX_TTL_S:.0f}: "
                                            "30 days)")],
    keys_file: Annotated[Optional[Path], typer.Option(
        help="block keys to pin, 32 hex digits each: a JSON array, or one per line (-: stdin)")
    ] = None,
    tokens_file: Annotated[Optional[Path], typer.Option(
        help="a prompt's token ids (a system prompt, say): a JSON array, or separated by "
             "whitespace (-: stdin); its whole blocks are pinned")] = None,
    model_id: Annotated[Optional[str], typer.Option(
        help="with --tokens-file: check that the namespace is this model's (and "
             "--tenant-salt's; default: the daemon's configured ones)")] = None,
    tenant_salt: Annotated[Optional[str], typer.Option(help="see --model-id")] = None,
    url: UrlOpt = None, config: ConfigOpt = None, as_json: JsonOpt = False,
) -> None:
    """Keep a namespace's pages cached for --ttl seconds in every tier: no eviction takes them
    (a page not stored yet is kept once it arrives). Prints the pin's id, which `kvstore unpin`
    takes."""
    ns = _namespace(namespace)
    if (keys_file is None) == (tokens_file is None):
        raise typer.BadParameter("give exactly one of --keys-file and --tokens-file")
    if not 0 < ttl <= MAX_TTL_S:
        raise typer.BadParameter(f"{ttl:g} is not in (0, {MAX_TTL_S:.0f}] seconds",
                                 param_hint="--ttl")
    body: dict[str, Any] = {"ttl_s": ttl}
    if keys_file is not None:
        if model_id is not None or tenant_salt is not None:
            raise typer.BadParameter("--model-id and --tenant-salt go with --tokens-file")
        body["keys"] = _keys(keys_file)
    else:
        assert tokens_file is not None
        body["tokens"] = _tokens(tokens_file)
        if model_id is not None or tenant_salt is not None:
            body["namespace"] = {k: v for k, v in (("model_id", model_id),
                                                   ("tenant_salt", tenant_salt)) if v is not None}
    out = AdminClient(url, config).call("PUT", f"/v1/namespaces/{ns}/pins", json=body)
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    typer.echo(f"pinned {out['pages']} pages of namespace {ns} for {ttl:g}s: pin "
               f"{out['pin_id']} (`kvstore unpin --namespace {ns} {out['pin_id']}` removes it)")


def unpin(
    namespace: NamespaceOpt,
    pin_id: Annotated[int, typer.Argument(min=1, help="the pin's id, as `kvstore pin` or "
                                                      "`kvstore retention` shows it")],
    url: UrlOpt = None, config: ConfigOpt = None,
) -> None:
    """Remove a pin: its pages become evictable again. A pin that lapsed or was removed
    already is reported, not an error (exit 0)."""
    ns = _namespace(namespace)
    out = AdminClient(url, config).call("DELETE", f"/v1/namespaces/{ns}/pins/{pin_id}")
    if out["removed"]:
        typer.echo(f"removed pin {pin_id} of namespace {ns}")
    else:
        typer.echo(f"namespace {ns} has no pin {pin_id}: it lapsed, was removed already, or "
                   "never was")


def budget(
    namespace: NamespaceOpt,
    tier: Annotated[str, typer.Option(help="the tier's name (`kvstore stats` lists them)")],
    size: Annotated[Optional[str], typer.Argument(
        help="the most the namespace may hold there: bytes or a binary unit, \"4GiB\" "
             "(whole pages, rounded down)")] = None,
    clear: Annotated[bool, typer.Option("--clear", help="remove the budget instead")] = False,
    url: UrlOpt = None, config: ConfigOpt = None, as_json: JsonOpt = False,
) -> None:
    """Hold a namespace to a number of bytes of one tier: at its budget it makes room among its
    own pages there and never evicts another namespace's. --clear removes the budget."""
    ns = _namespace(namespace)
    if (size is None) == (not clear):
        raise typer.BadParameter("give a SIZE (\"4GiB\") or --clear, not both")
    nbytes: int | None = None
    if size is not None:
        try:
            nbytes = parse_size(size)
        except ValueError as exc:
            raise typer.BadParameter(f"{size!r}: {exc}", param_hint="SIZE") from None
    path = f"/v1/namespaces/{ns}/budgets/{quote(tier, safe='')}"
    client = AdminClient(url, config)
    if nbytes is None:
        out = client.call("DELETE", path)
    else:
        out = client.call("PUT", path, json={"bytes": nbytes})
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    cap = out["budget_bytes"]
    what = "no budget" if cap is None else f"budget {format_size(cap)} ({cap} bytes)"
    typer.echo(f"namespace {ns} in {out['tier']}: {what}; holds {format_size(out['used_bytes'])}, "
               f"{format_size(out['pinned_bytes'])} of it pinned")


def _tables(r: dict[str, Any]) -> tuple[Table, Table]:
    tiers = Table(title="per tier", title_justify="left")
    for col in ("tier", "used", "pinned", "budget"):
        tiers.add_column(col, justify="left" if col == "tier" else "right")
    for t in r["tiers"]:
        cap = t["budget_bytes"]
        tiers.add_row(escape(t["tier"]), format_size(t["used_bytes"]),
                      format_size(t["pinned_bytes"]), "-" if cap is None else format_size(cap))
    pins = Table(title=f"pins ({len(r['pins'])})", title_justify="left")
    for col in ("pin", "pages", "expires in"):
        pins.add_column(col, justify="right")
    for p in r["pins"]:
        pins.add_row(str(p["pin_id"]), str(p["pages"]), f"{p['expires_in_s']:.0f}s")
    return tiers, pins


def retention(
    namespace: NamespaceOpt, url: UrlOpt = None, config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a namespace's live pins and, per tier, the bytes it holds, pins and may hold."""
    ns = _namespace(namespace)
    out = AdminClient(url, config).call("GET", f"/v1/namespaces/{ns}/retention")
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    tiers, pins = _tables(out)
    typer.echo(f"namespace {out['namespace_id']}")
    console.print(tiers)
    console.print(pins)


def register(app: typer.Typer) -> None:
    for command in (pin, unpin, budget, retention):
        app.command()(command)
