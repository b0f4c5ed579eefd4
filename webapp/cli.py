"""Operator commands: ``flask --app webapp <command>`` (see DESIGN.md "CLI contract")."""
from __future__ import annotations

import sys

import click
from flask import Flask, current_app

from rlhf.loading import ModelLoadError
from rlhf.progress import StageBars

from .config import ConfigError


def init_app(app: Flask) -> None:
    app.cli.add_command(init_db_command)
    app.cli.add_command(init_model_command)
    app.cli.add_command(serve_command)


@click.command("init-db")
def init_db_command() -> None:
    """Create any missing tables (safe to run again)."""
    from .database import create_schema

    created = create_schema()
    click.echo(f"Created tables: {', '.join(created)}" if created else "Database is up to date.")


@click.command("init-model")
@click.option("--force", is_flag=True, help="Rebuild even if an active model version exists.")
def init_model_command(force: bool) -> None:
    """Build the embedded base model (or import RLHF_BASE_MODEL) as the active version."""
    version = _ensure_model(force=force)
    click.echo(f"Active model version: {version.name} ({version.path})")


def _ensure_model(force: bool = False):
    from .bootstrap import ensure_base_version

    try:
        with StageBars() as bars:
            version, created = ensure_base_version(progress=bars, force=force)
    except (ModelLoadError, ConfigError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if created:
        m = version.metrics or {}
        details = ", ".join(f"{k}={m[k]}" for k in ("parameters", "val_loss", "total_seconds") if k in m)
        click.echo(f"Built {version.name}" + (f" ({details})" if details else ""), err=True)
    return version


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--threads", default=8, show_default=True, type=int, help="Request threads per worker.")
@click.option("--workers", default=1, show_default=True, type=int,
              help="Worker processes; each holds its own copy of the models.")
def serve_command(host: str, port: int, threads: int, workers: int) -> None:
    """Run the production server (gunicorn), building the base model first if needed."""
    from gunicorn.app.base import BaseApplication

    if current_app.config["RLHF_AUTO_INIT_MODEL"]:
        _ensure_model()
    app = current_app._get_current_object()

    class _Server(BaseApplication):
        def load_config(self) -> None:
            self.cfg.set("bind", f"{host}:{port}")
            self.cfg.set("workers", workers)
            self.cfg.set("threads", threads)
            self.cfg.set("worker_class", "gthread")
            self.cfg.set("timeout", 300)  # a streamed answer may take a while on a slow CPU
            self.cfg.set("accesslog", "-")

        def load(self):
            return app

    click.echo(f"Serving on http://{host}:{port}/", err=True)
    sys.argv = sys.argv[:1]  # gunicorn parses argv; ours are already consumed
    _Server().run()
