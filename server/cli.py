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
    config: ConfigOpt = None,
    conversations: Annotated[int, typer.Option(min=1, max=1000)] = 4,
    turns: Annotated[int, typer.Option(min=1, max=100)] = 4,
) -> None:
    """Fill a store with multi-turn chat KV pages, read them back, verify, print stats."""
    from server.demo import run_demo

    cfg = _load(config)
    run_demo(cfg, conversations=conversations, turns=turns, console=console)


@app.command("config")
def show_config(config: ConfigOpt = None) -> None:
    """Validate the configuration and print it with every default filled in."""
    cfg = _load(config)
    console.print_json(cfg.model_dump_json())


def _load(path: Optional[Path]):  # noqa: ANN202 - typer needs the plain signature above
    try:
        return load_config(path)
    except KVStoreError as exc:
        err.print(f"[red]error:[/red] {exc.message}")
        if exc.hint:
            err.print(f"[yellow]hint:[/yellow] {exc.hint}")
        raise typer.Exit(2) from None


if __name__ == "__main__":
    app()
