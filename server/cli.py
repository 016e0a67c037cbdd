"""The ``kvstore`` command line. Errors are reported by ``server.cli_errors``; ``-v`` sets the
log level of kvstore's loggers (the tiers log what they find at start, and what fails later)."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

import kvstore
from kvstore import KVStoreError, load_config
from server.cli_admin import register as register_admin_commands
from server.cli_errors import ReportingGroup

app = typer.Typer(
    cls=ReportingGroup,
    help="kvstore: tiered KV-cache storage for LLM inference.",
    no_args_is_help=True,
)
console = Console()
err = Console(stderr=True)

ConfigOpt = Annotated[
    Optional[Path],
    typer.Option("--config", "-c", help="TOML or YAML config file; KVSTORE_* variables override it."),
]
_LEVELS = (logging.WARNING, logging.INFO, logging.DEBUG)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvstore {kvstore.__version__}")
        raise typer.Exit()


@app.callback()
def main(
    verbose: Annotated[
        int, typer.Option("--verbose", "-v", count=True, help="-v: info, -vv: debug log lines.")
    ] = 0,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """kvstore: tiered KV-cache storage for LLM inference."""
    logging.basicConfig(
        level=_LEVELS[min(verbose, len(_LEVELS) - 1)],
        format="%(levelname)s %(name)s: %(message)s",
    )


@app.command()
def demo(
    model: Annotated[str, typer.Option(
        help="'small' (random weights) or a Hugging Face checkpoint directory (config.json + "
             "*.safetensors; its tokenizer.json when present, else UTF-8 byte ids)")] = "small",
    turns: Annotated[int, typer.Option(  # max: len(runtime.demo.USER_TURNS), kept by a test
        min=1, max=6, help="chat turns; the scripted chat has 6")] = 4,
    max_tokens: Annotated[int, typer.Option(min=1, max=512, help="new tokens per reply")] = 16,
    daemon: Annotated[bool, typer.Option(
        help="also start `kvstore serve` (embedded default, a temporary data directory), run "
             "two workers against it, then stop it")] = True,
) -> None:
    """The bundled runtime on a multi-turn chat, with and without the prefix cache: per-turn
    TTFT and tokens computed vs reused; two chats over a host tier; then two workers sharing a
    sidecar daemon. Progress goes to stderr."""
    from runtime.demo import demo_layout, run_chat_demo

    try:
        if not daemon:
            run_chat_demo(model, turns, max_tokens=max_tokens, console=console, progress=err)
            return
        from server.daemon.process import DaemonProcess, layout_env

        layout = demo_layout(model)
        with tempfile.TemporaryDirectory(prefix="kvstore-demo-daemon-") as tmp:
            err.print(f"starting kvstore serve (embedded default, data in {tmp})")
            proc = DaemonProcess(Path(tmp), layout_env(layout)).start()
            try:
                run_chat_demo(model, turns, max_tokens=max_tokens, console=console,
                              progress=err, daemon=proc.target)
            finally:
                code = proc.stop()
            console.print(f"kvstore serve (pid {proc.proc.pid}, {proc.target}) stopped on "  # type: ignore[union-attr]
                          f"SIGTERM: exit status {code}"
                          f"{' (a clean drain)' if code == 0 else '; its log: ' + proc.tail()}",
                          highlight=False, markup=False)
    except KVStoreError as exc:  # a model the demo cannot run is a usage error: exit 2
        err.print(f"[red]error:[/red] {escape(exc.message)}")
        if exc.hint:
            err.print(f"[yellow]hint:[/yellow] {escape(exc.hint)}")
        raise typer.Exit(2) from None


@app.command("store-demo")
def store_demo(
    config: ConfigOpt = None,
    conversations: Annotated[int, typer.Option(min=1, max=1000)] = 4,
    turns: Annotated[int, typer.Option(min=1, max=100)] = 4,
) -> None:
    """Fill a store with multi-turn chat KV pages, read them back, verify, print stats.

    Without --config it runs on an embedded default: a small host tier over a disk tier in a
    temporary directory, so evictions, write-back and promotion all show. With --config it runs
    on those tiers in a namespace of its own and deletes its pages at the end (it may still
    evict other pages to make room)."""
    from server.demo import demo_overrides, run_demo

    with tempfile.TemporaryDirectory(prefix="kvstore-demo-", dir="/var/tmp") as tmp:
        cfg = load_config(config, overrides=None if config else demo_overrides(tmp))
        run_demo(cfg, conversations=conversations, turns=turns, console=console)


@app.command()
def serve(config: ConfigOpt = None) -> None:
    """Run the sidecar daemon: the store's host tier in shared memory, gRPC on a Unix socket
    (and TCP with a bearer token when configured). Without --config: a host tier over a disk
    tier in $XDG_DATA_HOME/kvstore (or ./kvstore-data). SIGTERM/SIGINT drain and exit 0."""
    import logging

    from server.daemon.app import load_serve_config
    from server.daemon.app import serve as run

    # a service logs its listeners and its stop at INFO, whatever -v said (-vv still debugs);
    # timestamps, since its log outlives a terminal
    level = min(logging.getLogger().level or logging.WARNING, logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s kvstore %(levelname)s %(message)s",
                        force=True)
    # a KVStoreError is reported by the command group, with the exit code of its class
    raise typer.Exit(run(load_serve_config(config)))


@app.command("config")
def show_config(config: ConfigOpt = None) -> None:
    """Validate the configuration and print it with every default filled in (sizes with their
    binary unit, secrets masked)."""
    console.print_json(load_config(config).model_dump_json())


register_admin_commands(app)  # kvstore stats, kvstore flush
__import__("server.cli_index").cli_index.register(app)  # kvstore index route, kvstore index watch
from server.cli_retention import register as register_retention; register_retention(app)
__import__("server.engine_server.cli").engine_server.cli.register(app)  # kvstore engine serve


if __name__ == "__main__":
    app()
