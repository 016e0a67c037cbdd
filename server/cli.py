"""The ``kvstore`` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from kvstore import KVStoreError, load_config

app = typer.Typer(help="kvstore: tiered KV-cache storage for LLM inference.", no_args_is_help=True)
console = Console()
err = Console(stderr=True)

ConfigOpt = Annotated[
    Optional[Path],
    typer.Option("--config", "-c", help="TOML or YAML config file; KVSTORE_* variables override it."),
]


@app.command()
def demo(
    model: Annotated[str, typer.Option(help="named model config: tiny, small, llama3-8b")] = "small",
    turns: Annotated[int, typer.Option(min=1, max=50)] = 4,
    max_tokens: Annotated[int, typer.Option(min=1, max=512)] = 16,
) -> None:
    """The bundled runtime on a multi-turn chat, with and without the prefix cache: per-turn
    TTFT and tokens computed vs reused."""
    from runtime.demo import run_chat_demo

    try:
        run_chat_demo(model, turns, max_tokens=max_tokens, console=console)
    except KVStoreError as exc:
        err.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(2) from None


@app.command("store-demo")
def store_demo(
    config: ConfigOpt = None,
    conversations: Annotated[int, typer.Option(min=1, max=1000)] = 4,
    turns: Annotated[int, typer.Option(min=1, max=100)] = 4,
) -> None:
    """Fill a store with multi-turn chat KV pages, read them back, verify, print stats.

    Without --config it runs on an embedded default: a small host tier over a disk tier in a
    temporary directory, so evictions, write-back and promotion all show."""
    import tempfile

    from server.demo import demo_overrides, run_demo

    with tempfile.TemporaryDirectory(prefix="kvstore-demo-", dir="/var/tmp") as tmp:
        cfg = _load(config, overrides=None if config else demo_overrides(tmp))
        run_demo(cfg, conversations=conversations, turns=turns, console=console)


@app.command()
def serve(config: ConfigOpt = None) -> None:
    """Run the sidecar daemon: the store's host tier in shared memory, gRPC on a Unix socket
    (and TCP with a bearer token when configured). Without --config: a host tier over a disk
    tier in $XDG_DATA_HOME/kvstore (or ./kvstore-data). SIGTERM/SIGINT drain and exit 0."""
    import logging

    from server.daemon.app import load_serve_config
    from server.daemon.app import serve as run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s kvstore %(levelname)s %(message)s")
    try:
        cfg = load_serve_config(config)
        code = run(cfg)
    except KVStoreError as exc:
        err.print(f"[red]error:[/red] {exc.message}")
        if exc.hint:
            err.print(f"[yellow]hint:[/yellow] {exc.hint}")
        raise typer.Exit(2) from None
    raise typer.Exit(code)


@app.command("config")
def show_config(config: ConfigOpt = None) -> None:
    """Validate the configuration and print it with every default filled in."""
    cfg = _load(config)
    console.print_json(cfg.model_dump_json())


def _load(path: Optional[Path], overrides: Optional[dict] = None):  # noqa: ANN202
    try:
        return load_config(path, overrides=overrides)
    except KVStoreError as exc:
        err.print(f"[red]error:[/red] {exc.message}")
        if exc.hint:
            err.print(f"[yellow]hint:[/yellow] {exc.hint}")
        raise typer.Exit(2) from None


if __name__ == "__main__":
    app()
