"""``kvstore engine serve``: the OpenAI-compatible server over a random-weight preset."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from kvstore.errors import KVStoreError

err = Console(stderr=True)
engine_app = typer.Typer(help="The bundled inference runtime.", no_args_is_help=True)


@engine_app.command("serve")
def serve(
    model: Annotated[str, typer.Option(help="'tiny' or 'small' (random weights, byte "
                                            "tokenizer)")] = "tiny",
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port")] = 8000,
    host_cache: Annotated[Optional[str], typer.Option(
        help="a host tier under the hbm pool, e.g. 256MiB (prefixes evicted from hbm are "
             "loaded back from it)")] = None,
    daemon: Annotated[Optional[str], typer.Option(
        help="a kvstore serve daemon to use as the store (unix:///path.sock, or host:port "
             "with KVSTORE_DAEMON__TOKEN): engines on one node share its tiers")] = None,
    num_blocks: Annotated[int, typer.Option(min=1, help="hbm pool blocks")] = 256,
    seed: Annotated[int, typer.Option(min=0, help="random-weight seed")] = 0,
    prefix_cache: Annotated[bool, typer.Option(
        "--prefix-cache/--no-prefix-cache",
        help="reuse cached prefixes (off: every prompt is computed -- the recompute "
             "baseline)")] = True,
) -> None:
    """Serve /v1/completions, /v1/chat/completions, /v1/models and /health (OpenAI's API)."""
    import uvicorn

    from server.engine_server.app import build_app
    from server.engine_server.build import build_served
    from server.engine_server.engine_loop import EngineLoop

    try:
        served = build_served(model, seed=seed, num_blocks=num_blocks, host_cache=host_cache,
                              daemon=daemon, daemon_token=os.environ.get("KVSTORE_DAEMON__TOKEN"),
                              prefix_cache=prefix_cache)
    except KVStoreError as exc:  # a bad option is a usage error: exit 2, as `kvstore demo`
        err.print(f"[red]error:[/red] {escape(exc.message)}")
        if exc.hint:
            err.print(f"[yellow]hint:[/yellow] {escape(exc.hint)}")
        raise typer.Exit(2) from None
    app = build_app(EngineLoop(served.engine), served.name, served.tokenizer)
    uvicorn.run(app, host=host, port=port, log_level="info")


def register(app: typer.Typer) -> None:
    """Add the ``engine`` command group to the ``kvstore`` app."""
    app.add_typer(engine_app, name="engine")
