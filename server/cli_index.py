"""``kvstore index``: the reference indexer (:mod:`kvstore.indexer`) over running daemons, from
the command line -- what a KV-aware router would know.

``kvstore index route`` asks which daemon holds the longest prefix of a prompt, and in which
tier: it builds an :class:`~kvstore.indexer.Indexer` from each daemon's event snapshot (and the
events after it) and ranks the daemons, best first. ``kvstore index watch`` follows the daemons'
event logs (:meth:`Indexer.follow`, a thread per daemon) and prints each one's pages per tier
every few seconds.

A daemon's events are read per namespace (``ReadEvents``/``EventSnapshot`` name one): the
namespace is ``--model`` and ``--tenant`` (the salt the engine uses), with the daemon's own
layout and the deployment secret (``security.secret`` of ``--config`` or
``KVSTORE_SECURITY__SECRET``: the keys are keyed with it), or ``--namespace-id`` as
``kvstore stats`` lists it. A TCP daemon needs its token (``KVSTORE_DAEMON__TOKEN`` or
``daemon.token`` of the config). The prompt's tokens stay in this process: only block keys are
compared.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from kvstore import InvalidArgument, KVStoreError, Namespace, load_config
from kvstore.event_log import Snapshot
from kvstore.indexer import Indexer
from kvstore.keys import chain_keys, token_bytes

index_app = typer.Typer(
    help="Where prompts' prefixes live across daemons: the reference indexer over their event "
         "logs.", no_args_is_help=True)

DaemonOpt = Annotated[list[str], typer.Option(
    "--daemon", "-d", help="a daemon: its socket path, unix:///path, or host:port (TCP, with "
                           "KVSTORE_DAEMON__TOKEN); repeat for several")]
ModelOpt = Annotated[Optional[str], typer.Option(
    "--model", "-m", help="the model id of the namespace (as the engine names it)")]
TenantOpt = Annotated[str, typer.Option(
    "--tenant", "-t", help="the tenant salt of the namespace")]
NamespaceOpt = Annotated[Optional[str], typer.Option(
    "--namespace-id", help="the namespace id (32 hex digits, as `kvstore stats` lists it), "
                           "instead of --model and --tenant")]
ConfigOpt = Annotated[Optional[Path], typer.Option(
    "--config", "-c", help="TOML or YAML config file (the deployment secret, the TCP token); "
                           "KVSTORE_* variables override it.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]

#: ReadEvents batches one catch-up reads at most (a daemon busier than this is caught up with
#: as far as it got: the result is as of a moment, whatever)
_MAX_BATCHES = 256


def target_of(daemon: str) -> str:
    """A gRPC target: ``unix:///abs/path`` for a socket path, the rest as given."""
    if "://" in daemon:
        return daemon
    if "/" in daemon or Path(daemon).exists():
        return f"unix://{Path(daemon).absolute()}"
    return daemon


def parse_tokens(text: str) -> list[int]:
    """Token ids from a JSON array, or integers separated by commas and/or whitespace."""
    text = text.strip()
    if text.startswith("["):
        try:
            ids = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"the tokens are not a JSON array of ints: {exc}") from None
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                for i in ids):
            raise InvalidArgument("the tokens are not a JSON array of ints")
        return ids
    parts = [p for p in re.split(r"[,\s]+", text) if p]
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise InvalidArgument("the tokens are not integers separated by commas or spaces",
                              hint='e.g. --tokens "1,2,3", or a file holding a JSON array') from None


def _prompt(tokens: str | None, tokens_file: Path | None) -> list[int]:
    if (tokens is None) == (tokens_file is None):
        raise InvalidArgument("give exactly one of --tokens and --tokens-file")
    if tokens_file is not None:
        try:
            text = sys.stdin.read() if str(tokens_file) == "-" else tokens_file.read_text()
        except OSError as exc:
            raise InvalidArgument(f"cannot read --tokens-file {tokens_file}: {exc.strerror}") from None
    else:
        assert tokens is not None
        text = tokens
    ids = parse_tokens(text)
    if not ids:
        raise InvalidArgument("the prompt has no tokens")
    token_bytes(ids)  # InvalidArgument for a negative id or one past int32
    return ids


@dataclass
class Node:
    """One daemon, as this command sees it: its client and namespace, or why it has none."""

    name: str
    client: Any = None  # a connector.daemon.DaemonStore
    namespace_id: bytes = b""
    error: str = ""
    tier_order: list[str] = field(default_factory=list)


class Namespacer:
    """The namespace id to read on a daemon of a given layout."""

    def __init__(self, model: str | None, tenant: str, namespace_id: str | None,
                 config: Path | None) -> None:
        if (model is None) == (namespace_id is None):
            raise InvalidArgument("give --model (and --tenant), or --namespace-id")
        self.model, self.tenant = model, tenant
        self.fixed: bytes | None = None
        if namespace_id is not None:
            try:
                self.fixed = bytes.fromhex(namespace_id)
            except ValueError:
                self.fixed = b""
            if len(self.fixed) != 16:
                raise InvalidArgument(f"--namespace-id {namespace_id!r} is not 32 hex digits")
        cfg = load_config(config)
        self.secret = cfg.security.secret_bytes()
        self.token = cfg.daemon.token.get_secret_value() if cfg.daemon.token is not None else None

    def id_for(self, layout: Any) -> bytes:
        if self.fixed is not None:
            return self.fixed
        assert self.model is not None
        return Namespace(self.model, layout, self.tenant, self.secret).id


@contextmanager
def connected(daemons: Sequence[str], names: Namespacer) -> Iterator[list[Node]]:
    """A client per daemon (a daemon that does not answer gets an error instead), closed on
    exit."""
    if not daemons:
        raise InvalidArgument("name at least one --daemon")
    from connector.daemon import DaemonStore

    with ExitStack() as stack:
        nodes = []
        for d in daemons:
            node = Node(target_of(d))
            try:
                client = DaemonStore(node.name, token=names.token, lane=False,
                                     reconnect_interval_s=0.2)
            except KVStoreError as exc:
                node.error = exc.message
            else:
                stack.callback(client.close)
                node.client = client
                node.namespace_id = names.id_for(client.layout)
                node.tier_order = [t.name for t in client.tiers]
            nodes.append(node)
        yield nodes


def catch_up(index: Indexer, node: Node) -> None:
    """``node``'s contents into ``index``: its event snapshot, then the events after it until
    the log has no more (a gap, i.e. a restart or a log that ran past its window meanwhile,
    starts again from a fresh snapshot)."""
    client, ns = node.client, node.namespace_id
    snap: Snapshot | None = None
    cursor, epoch = 0, b""
    for _ in range(_MAX_BATCHES):
        if snap is None:
            snap = client.event_snapshot(namespace_id=ns)
            index.apply_snapshot(node.name, snap)
            cursor, epoch = snap.cursor, snap.epoch
        batch = client.read_events(cursor, epoch=epoch or None, namespace_id=ns)
        if batch.gap:
            snap = None
            continue
        for event in batch.events:
            if event.seq >= cursor:
                index.apply(node.name, event)
        if batch.next_cursor <= cursor:  # nothing after it: caught up
            return
        cursor = batch.next_cursor


def _runs(tiers: Sequence[str]) -> list[tuple[str, int]]:
    """Consecutive blocks of the same tier: ``[("host", 4), ("disk", 2)]``."""
    out: list[tuple[str, int]] = []
    for t in tiers:
        if out and out[-1][0] == t:
            out[-1] = (t, out[-1][1] + 1)
        else:
            out.append((t, 1))
    return out


def route(
    daemon: DaemonOpt,
    model: ModelOpt = None,
    tenant: TenantOpt = "",
    namespace_id: NamespaceOpt = None,
    tokens: Annotated[Optional[str], typer.Option(
        help='the prompt\'s token ids: "1,2,3" (or a JSON array)')] = None,
    tokens_file: Annotated[Optional[Path], typer.Option(
        help="a file of token ids (a JSON array, or ints separated by commas or spaces); "
             "- reads stdin")] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Which daemon holds the longest prefix of a prompt, and in which tier.

    Per daemon, best first: the longest prefix; on a tie, more of it in the daemon's fastest
    tier. A daemon that does not answer is listed last."""
    ids = _prompt(tokens, tokens_file)
    names = Namespacer(model, tenant, namespace_id, config)
    data = token_bytes(ids)
    index = Indexer()
    rows: list[dict[str, Any]] = []
    with connected(daemon, names) as nodes:
        for node in nodes:
            row: dict[str, Any] = {"daemon": node.name, "error": node.error or None}
            rows.append(row)
            if node.client is None:
                continue
            block_size = node.client.layout.block_size
            keys = chain_keys(node.namespace_id, data, block_size)
            row.update(namespace_id=node.namespace_id.hex(), block_size=block_size,
                       blocks=len(keys), matched_blocks=0, matched_tokens=0, tiers=[])
            try:
                catch_up(index, node)
            except KVStoreError as exc:
                row["error"] = exc.message
                continue
            match = next((m for m in index.longest_prefix(keys, tier_order=node.tier_order)
                          if m.node == node.name), None)
            if match is not None:
                row.update(matched_blocks=match.length,
                           matched_tokens=match.length * block_size,
                           tiers=[{"tier": t, "blocks": n} for t, n in _runs(match.tiers)],
                           fastest_blocks=sum(t == node.tier_order[0] for t in match.tiers))
    if all(r["error"] for r in rows):
        raise KVStoreError("no daemon answered: " + "; ".join(
            f"{r['daemon']}: {r['error']}" for r in rows),
            hint="check the --daemon paths and addresses (and KVSTORE_DAEMON__TOKEN for TCP)")
    ranked = sorted(enumerate(rows), key=lambda ir: (
        ir[1]["error"] is not None, -ir[1].get("matched_blocks", 0),
        -ir[1].get("fastest_blocks", 0), ir[0]))
    rows = [r for _, r in ranked]
    for r in rows:
        r.pop("fastest_blocks", None)
    if as_json:
        typer.echo(json.dumps({"model": model, "tenant": tenant if model is not None else None,
                               "tokens": len(ids), "daemons": rows}, indent=2))
        return
    what = (f"model {model!r}, tenant {tenant!r}" if model is not None
            else f"namespace {namespace_id}")
    typer.echo(f"prompt of {len(ids)} tokens ({what}); best first:")
    for rank, r in enumerate(rows, 1):
        if r["error"]:
            typer.echo(f"  -  {r['daemon']}: unreachable: {r['error']}")
            continue
        where = ", ".join(f"{t['tier']} {t['blocks']}" for t in r["tiers"])
        typer.echo(f"  {rank}. {r['daemon']}: {r['matched_blocks']} of {r['blocks']} blocks "
                   f"({r['matched_tokens']} tokens)" + (f" in {where}" if where else ""))


def _counts(index: Indexer, nodes: Sequence[Node]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for node in nodes:
        if node.client is None:
            out.append({"daemon": node.name, "error": node.error})
            continue
        known = node.name in index.nodes()
        contents = index.contents(node.name)
        tiers = {t: len(contents.get(t, ())) for t in node.tier_order}
        tiers.update({t: len(k) for t, k in contents.items() if t not in tiers})
        pages = len(set().union(*contents.values())) if contents else 0
        out.append({"daemon": node.name, "synced": known, "pages": pages, "tiers": tiers})
    return out


def watch(
    daemon: DaemonOpt,
    model: ModelOpt = None,
    tenant: TenantOpt = "",
    namespace_id: NamespaceOpt = None,
    interval: Annotated[float, typer.Option(min=0.1, help="seconds between prints")] = 2.0,
    seconds: Annotated[Optional[float], typer.Option(
        min=0, help="stop after this many seconds (default: at Ctrl-C)")] = None,
    once: Annotated[bool, typer.Option(
        help="print once every daemon's snapshot is in, then exit")] = False,
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="print one JSON object a line")] = False,
) -> None:
    """Follow the daemons' event logs and print their pages per tier every few seconds.

    One thread per daemon follows its log (the namespace's part); every --interval seconds
    each daemon's pages of the namespace are printed, per tier, until Ctrl-C (or --seconds,
    or --once)."""
    names = Namespacer(model, tenant, namespace_id, config)
    index, stop = Indexer(), threading.Event()
    with connected(daemon, names) as nodes:
        live = [n for n in nodes if n.client is not None]
        if not live:
            raise KVStoreError("no daemon answered: " + "; ".join(
                f"{n.name}: {n.error}" for n in nodes), hint="check the --daemon paths and "
                "addresses (and KVSTORE_DAEMON__TOKEN for TCP)")
        threads = [threading.Thread(target=index.follow,
                                    args=(n.name, n.client),
                                    kwargs={"stop": stop, "timeout_s": 0.5,
                                            "namespace_id": n.namespace_id},
                                    name=f"kvstore-index-{i}", daemon=True)
                   for i, n in enumerate(live)]
        for t in threads:
            t.start()

        def show() -> None:
            counts = _counts(index, nodes)
            if as_json:
                typer.echo(json.dumps({"at": round(time.time(), 3), "daemons": counts}))
                return
            typer.echo(time.strftime("%H:%M:%S"))
            for c in counts:
                if "error" in c:
                    typer.echo(f"  {c['daemon']}: unreachable: {c['error']}")
                elif not c["synced"]:
                    typer.echo(f"  {c['daemon']}: (reading its snapshot)")
                else:
                    per = ", ".join(f"{t} {n}" for t, n in c["tiers"].items())
                    typer.echo(f"  {c['daemon']}: {c['pages']} pages ({per})")

        try:
            start = time.monotonic()
            if once:
                # every snapshot in (or a while: a daemon that stopped answering shows so)
                while (not all(n.name in index.nodes() for n in live)
                       and time.monotonic() - start < 30):
                    time.sleep(0.05)
                show()
                return
            end = None if seconds is None else start + seconds
            while True:
                now = time.monotonic()
                wait = interval if end is None else min(interval, end - now)
                if wait > 0:
                    time.sleep(wait)
                show()
                if end is not None and time.monotonic() >= end:
                    return
        except KeyboardInterrupt:
            pass
        finally:
            stop.set()
            for t in threads:
                t.join(5)


def register(app: typer.Typer) -> None:
    index_app.command()(route)
    index_app.command()(watch)
    app.add_typer(index_app, name="index")


__all__ = ["catch_up", "parse_tokens", "register", "target_of"]
