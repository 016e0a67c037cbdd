"""``kvstore stats`` and ``kvstore flush``: clients of a running daemon's admin API. The URL
comes from ``--url`` or the config's ``admin.listen``; the token from the environment
(``KVSTORE_ADMIN__TOKEN``) or the config's ``admin.token``, and is never printed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import httpx
import typer
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from kvstore import ConfigError, KVStoreError, load_config
from kvstore.errors import TierUnavailable

console = Console()
UrlOpt = Annotated[Optional[str], typer.Option(
    help="the admin API, e.g. http://127.0.0.1:8470 (default: admin.listen of the config)")]
ConfigOpt = Annotated[Optional[Path], typer.Option(
    "--config", "-c", help="TOML or YAML config file; KVSTORE_* variables override it.")]


class AdminClient:
    def __init__(self, url: str | None, config: Path | None) -> None:
        cfg = load_config(config)
        token = cfg.admin.token.get_secret_value() if cfg.admin.token is not None else ""
        if not token:
            raise ConfigError("no admin token", hint="export KVSTORE_ADMIN__TOKEN (or set "
                              "admin.token in the config given with --config)")
        if url is None:
            from server.admin.server import split_listen

            host, port = split_listen(cfg.admin.listen)
            url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=60,
                                  headers={"Authorization": f"Bearer {token}"})

    def call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise TierUnavailable(f"the admin API at {self.url} does not answer: "
                                  f"{type(exc).__name__}",
                                  hint="start `kvstore serve` with admin.token set, or pass "
                                  "--url") from None
        if r.status_code == 401:
            raise ConfigError(f"the admin API at {self.url} refused the token",
                              hint="export the daemon's KVSTORE_ADMIN__TOKEN")
        if r.status_code >= 400:
            body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
            detail = body.get("detail", r.text)
            raise KVStoreError(f"{method} {path}: HTTP {r.status_code}: {detail}",
                               hint=body.get("hint", "") if isinstance(body, dict) else "")
        return r.json()


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.2f}"


def _count(x: int | None) -> str:
    return "-" if x is None else str(x)


def _misses(m: dict[str, Any]) -> str:
    return (f"absent {m['absent']}, corrupt {m['corrupt']}, expired {_count(m['expired'])}, "
            f"timeout {m['timeout']}")


def _failed(n: dict[str, Any]) -> str:
    """Failed loads and saves by reason (only the reasons that happened): "load error 9; save
    none"."""
    def by_reason(d: dict[str, int]) -> str:
        return ", ".join(f"{r} {k}" for r, k in d.items() if k) or "none"

    return (f"load {by_reason(n.get('load_failed_blocks', {}))}; "
            f"save {by_reason(n.get('save_failed_blocks', {}))}")


def _summary(s: dict[str, Any]) -> str:
    # every number here is the daemon's own count of client calls (the namespaces' counters
    # summed) and of what clients told it: their declines and their failed loads and saves
    return (f"client lookups: {s['lookup_hit_blocks']} blocks hit, {s['lookup_miss_blocks']} "
            f"missed (1m {_pct(s['lookup_hit_rate_1m'])}); loads: {s['loaded_pages']} pages "
            f"served, {s['load_missed_pages']} missed; recomputed: {s['declined_blocks']} "
            f"blocks; failed blocks: {_failed(s)}; leases: {s['active_leases']}")


def _named(n: dict[str, Any]) -> str:
    """A namespace row's id, and its label (the model id and tenant) when it has one (null:
    the id alone)."""
    return n["namespace_id"] + (f" ({n['label']})" if n["label"] else "")


def _tables(st: dict[str, Any]) -> Group:
    """The wide layout: a table of tiers, one of namespaces. Headers are short so a table that
    fits never ellipsizes them; a read hit is a page a load or get read, not a lookup's."""
    tiers = Table(title="tiers", title_justify="left")
    for col in ("tier", "policy", "pages (bytes)", "read hit 1m", "15m", "read hits",
                "miss a/c/e/t", "in", "out", "evicted", "errors", "read ms p50/p99"):
        tiers.add_column(col, justify="left" if col in ("tier", "policy") else "right")
    for t in st["tiers"]:
        m, lat = t["misses"], t["latency"].get("read", {})
        tiers.add_row(
            f"{t['name']} ({t['kind']})", t["policy"],
            f"{t['used_pages']} / {t['capacity_pages']} ({_size(t['used_bytes'])})",
            _pct(t["hit_rate_1m"]), _pct(t["hit_rate_15m"]), str(t["hits"]),
            f"{m['absent']}/{m['corrupt']}/{_count(m['expired'])}/{m['timeout']}",
            _size(t["bytes_in"]), _size(t["bytes_out"]), str(t["evictions"]), str(t["errors"]),
            f"{_ms(lat.get('p50_s'))} / {_ms(lat.get('p99_s'))}")
    spaces = Table(title="top namespaces", title_justify="left")
    for col in ("namespace", "pages per tier", "bytes", "stored", "removed", "lookup 1m", "15m",
                "lookup hit/miss", "loaded", "miss c/e/t/d", "failed"):
        spaces.add_column(col, justify="left" if col in ("namespace", "pages per tier") else "right")
    for n in st["namespaces"][:10]:
        nm = n["misses"]
        spaces.add_row(escape(_named(n)),  # a label is client text: never rich markup
                       ", ".join(f"{k}: {v}" for k, v in n["pages"].items()),
                       _size(n["bytes"]), str(n["stored_pages"]), str(n["removed_pages"]),
                       _pct(n["hit_rate_1m"]), _pct(n["hit_rate_15m"]),
                       f"{n['lookup_hit_blocks']}/{n['lookup_miss_blocks']}",
                       str(n["loaded_pages"]),
                       f"{nm['corrupt']}/{nm['expired']}/{nm['timeout']}/{nm['declined']}",
                       _failed(n))
    return Group(tiers, _summary(st["store"]), spaces)


def _stacked(st: dict[str, Any]) -> str:
    """The narrow layout (a pipe, a terminal narrower than the tables): one block per tier and
    per namespace, a label and its numbers a line; the console wraps what is still too long."""
    out = ["tiers"]
    for t in st["tiers"]:
        lat = t["latency"].get("read", {})
        out += [f"  {t['name']} ({t['kind']}), policy {t['policy']}",
                f"    pages     {t['used_pages']} / {t['capacity_pages']} "
                f"({_size(t['used_bytes'])})",
                f"    reads     {t['hits']} hit; 1m {_pct(t['hit_rate_1m'])}, "
                f"15m {_pct(t['hit_rate_15m'])}",
                f"    misses    {_misses(t['misses'])}",
                f"    bytes     in {_size(t['bytes_in'])}, out {_size(t['bytes_out'])}",
                f"    evicted   {t['evictions']}, errors {t['errors']}, read ms p50/p99 "
                f"{_ms(lat.get('p50_s'))} / {_ms(lat.get('p99_s'))}"]
    out += ["", _summary(st["store"]), "", "top namespaces"]
    for n in st["namespaces"][:10]:
        nm = n["misses"]
        pages = ", ".join(f"{k}: {v}" for k, v in n["pages"].items()) or "none"
        out += [f"  {_named(n)}",
                f"    pages     {pages} ({_size(n['bytes'])}); stored {n['stored_pages']}, "
                f"removed {n['removed_pages']}",
                f"    lookups   {n['lookup_hit_blocks']} hit, {n['lookup_miss_blocks']} missed; "
                f"1m {_pct(n['hit_rate_1m'])}, 15m {_pct(n['hit_rate_15m'])}",
                f"    loads     {n['loaded_pages']} served, {n['load_missed_pages']} missed; "
                f"recomputed {nm['declined']}",
                f"    misses    corrupt {nm['corrupt']}, expired {nm['expired']}, "
                f"timeout {nm['timeout']}",
                f"    failed    {_failed(n)}"]
    return "\n".join(out)


def render(st: dict[str, Any], width: int | None = None) -> Group | Text:
    """The tables where they fit ``width`` (default: the console's) at their natural width,
    else the stacked layout: a squeezed table ellipsizes its headers ("pol…")."""
    width = console.width if width is None else width
    wide = _tables(st)
    unbounded = console.options.update_width(10_000)  # measure() clamps to the options' width
    fits = all(console.measure(r, options=unbounded).maximum <= width for r in wide.renderables
               if isinstance(r, Table))
    # Text, not str: a label is client text, and a str would be read as rich markup by --watch
    return wide if fits else Text(_stacked(st))


def stats(
    url: UrlOpt = None, config: ConfigOpt = None,
    watch: Annotated[Optional[float], typer.Option(
        min=0.1, help="refresh every this many seconds until Ctrl-C")] = None,
    times: Annotated[int, typer.Option(min=0, help="with --watch: stop after this many "
                                                    "refreshes (0: never)")] = 0,
    as_json: Annotated[bool, typer.Option(
        "--json", help="print the snapshot as JSON (the admin API's GET /v1/stats) and exit")] = False,
) -> None:
    """Print a running daemon's stats per tier and per namespace (its admin API)."""
    client = AdminClient(url, config)
    if as_json:
        typer.echo(json.dumps(client.call("GET", "/v1/stats"), indent=2))
        return
    if watch is None:
        console.print(render(client.call("GET", "/v1/stats")), markup=False)
        return
    n = 0
    with Live(render(client.call("GET", "/v1/stats")), console=console, auto_refresh=False) as live:
        try:
            while True:
                n += 1
                if times and n >= times:
                    break
                time.sleep(watch)
                live.update(render(client.call("GET", "/v1/stats")), refresh=True)
        except KeyboardInterrupt:
            pass


def flush(
    namespace: Annotated[str, typer.Option(help="the namespace id (32 hex digits), as "
                                                "`kvstore stats` lists them")],
    url: UrlOpt = None, config: ConfigOpt = None,
) -> None:
    """Delete every page of a namespace (a tenant or a model) from every tier of a running
    daemon, Redis and disk included, with progress per tier."""
    client = AdminClient(url, config)
    job = client.call("DELETE", f"/v1/namespaces/{namespace}", params={"wait": "false"})
    progress = Progress(TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.completed} scanned, {task.fields[deleted]} deleted"),
                        console=console, transient=False)
    tasks: dict[str, Any] = {}
    with progress:
        while True:
            for t in job["tiers"]:
                if t["tier"] not in tasks:
                    tasks[t["tier"]] = progress.add_task(t["tier"], total=None, deleted=0)
                progress.update(tasks[t["tier"]], completed=t["scanned"], deleted=t["deleted"],
                                total=t["scanned"] if t["done"] else None)
            if job["state"] != "running":
                break
            time.sleep(0.2)
            job = client.call("GET", f"/v1/flushes/{job['id']}")
    if job["state"] == "failed":
        raise KVStoreError(f"the flush failed: {job['error']}", hint="run it again")
    console.print(f"flushed namespace {job['namespace_id']}: {job['deleted']} pages deleted "
                  f"across {len(job['tiers'])} tiers")


def register(app: typer.Typer) -> None:
    app.command()(stats)
    app.command()(flush)
