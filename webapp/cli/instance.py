"""The instance's database and base model: ``init-db``, ``init-model``."""
from __future__ import annotations

import click
from flask import current_app

from webapp.cli.common import ensure_model


@click.command("init-db")
def init_db_command() -> None:
    """Create the tables, or upgrade the schema to the code's revision (safe to run again; the same
    as `flask --app webapp db upgrade`)."""
    from webapp.core.database import create_schema
    from webapp.core.schema_revision import SchemaError

    state = current_app.extensions.get("schema_state")
    if state is not None and state.status == "ahead":
        raise click.ClickException(state.problem())
    try:
        created = create_schema()
    except SchemaError as exc:
        raise click.ClickException(str(exc)) from None
    current_app.extensions["schema_problem"] = None
    click.echo(f"Created tables: {', '.join(created)}" if created else "Database is up to date.")


@click.command("init-model")
@click.option("--force", is_flag=True, help="Rebuild even if an active model version exists.")
def init_model_command(force: bool) -> None:
    """Build the embedded base model (or import RLHF_BASE_MODEL) as the active version."""
    version = ensure_model(force=force)
    click.echo(f"Active model version: {version.name} ({version.location})")
