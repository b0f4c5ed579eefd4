"""What the commands share: the schema check around those that use the app's tables, and building
the base model (``init-model``, and ``serve`` before it starts)."""
from __future__ import annotations

import functools

import click

from rlhf.models.loading import ModelLoadError
from rlhf.progress import StageBars
from webapp.core.settings import ConfigError


def needs_current_schema(command: click.Command) -> click.Command:
    """``command``, refusing with the one-line reason when the database's schema is not the code's
    (webapp.core.schema_revision): behind with auto-upgrade off, or written by newer code."""
    callback = command.callback
    if callback is None or getattr(callback, "_checks_schema", False):
        return command

    def checked(*args, **kwargs):
        from webapp.core.schema_revision import schema_problem

        problem = schema_problem()
        if problem:
            raise click.ClickException(problem)
        return callback(*args, **kwargs)

    checked._checks_schema = True  # type: ignore[attr-defined]
    command.callback = functools.update_wrapper(checked, callback)
    return command


def ensure_model(force: bool = False):
    from webapp.serving.versions import ensure_base_version

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
