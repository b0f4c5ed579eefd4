"""Operator commands: ``flask --app webapp <command>`` (docs/cli.md is their contract).

Grouped by what they do: the instance's database and base model (``instance``), the long-running
processes (``processes``), a training cycle (``training``), feedback out and in (``feedback``),
reports (``reports``); backup, restore, copy-database, create-admin and the API key commands live
with their features. ``init_app`` registers them all."""
from __future__ import annotations

from flask import Flask

from webapp.cli.common import needs_current_schema
from webapp.cli.feedback import export_feedback_command, import_feedback_command
from webapp.cli.instance import init_db_command, init_model_command
from webapp.cli.processes import scheduler_command, serve_command
from webapp.cli.reports import ab_report_command, settings_command
from webapp.cli.training import rl_train_command


def init_app(app: Flask) -> None:
    from webapp.admin.auth import create_admin_command
    from webapp.core.backup import backup_command
    from webapp.core.database_copy import copy_database_command
    from webapp.core.restore import restore_command
    from webapp.openai_api.keys import COMMANDS as api_key_commands

    # commands that read or write the app's tables stop when the schema is not the code's
    for command in (init_model_command, serve_command, rl_train_command, export_feedback_command,
                    import_feedback_command, ab_report_command, scheduler_command, create_admin_command,
                    copy_database_command, *api_key_commands):
        app.cli.add_command(needs_current_schema(command))
    for command in (init_db_command, settings_command, backup_command, restore_command):
        app.cli.add_command(command)
