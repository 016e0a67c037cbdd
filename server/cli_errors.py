"""How the ``kvstore`` command reports kvstore's errors: the message and its hint on stderr, no
traceback, and an exit code by class — 2 for a configuration error (a bad value, an unknown
variable, a tier whose settings do not fit this machine or its server), 1 for any other
``KVStoreError`` (a tier that cannot serve, such as a Redis server that does not answer).
Anything else is a bug and keeps its traceback."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from kvstore import ConfigError, KVStoreError

CONFIG_ERROR_EXIT = 2
OTHER_ERROR_EXIT = 1


def exit_code(exc: KVStoreError) -> int:
    return CONFIG_ERROR_EXIT if isinstance(exc, ConfigError) else OTHER_ERROR_EXIT


def report(exc: KVStoreError) -> None:
    """``error: <message>`` and ``hint: <hint>`` on stderr. Messages never hold secrets: the
    config and the tiers leave them out where they are made."""
    typer.secho("error: ", fg="red", err=True, nl=False)
    typer.echo(exc.message, err=True)
    if exc.hint:
        typer.secho("hint: ", fg="yellow", err=True, nl=False)
        typer.echo(exc.hint, err=True)


class ReportingGroup(TyperGroup):
    """The command group: every command's ``KVStoreError`` becomes a report and an exit code."""

    def invoke(self, ctx: Any) -> Any:  # click.Context (typer vendors click in newer releases)
        try:
            return super().invoke(ctx)
        except KVStoreError as exc:
            report(exc)
            raise typer.Exit(exit_code(exc)) from None


__all__ = ["CONFIG_ERROR_EXIT", "OTHER_ERROR_EXIT", "ReportingGroup", "exit_code", "report"]
