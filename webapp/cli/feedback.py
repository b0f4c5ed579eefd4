"""Feedback out and in: ``export-feedback`` (JSONL for TRL), ``import-feedback`` (Open WebUI's export)."""
from __future__ import annotations

import click


@click.command("export-feedback")
@click.option("--format", "fmt", type=click.Choice(["pairs", "kto", "sft", "raw"]), required=True)
@click.option("--output", type=click.Path(dir_okay=False, writable=True), required=True,
              help="JSONL file to write ('-' for standard output).")
@click.option("--redact/--no-redact", default=True, show_default=True,
              help="Replace e-mail addresses and phone numbers in all texts with [EMAIL]/[PHONE].")
def export_feedback_command(fmt: str, output: str, redact: bool) -> None:
    """Write stored feedback as JSONL in TRL's column names (pairs: prompt/chosen/rejected,
    kto: prompt/completion/label, sft: prompt/completion; raw: whole conversations).
    Deleted conversations are never exported; e-mail addresses and phone numbers are redacted
    unless --no-redact."""
    import json
    import os

    from webapp.training.records import export_rows

    rows = export_rows(fmt, redact=redact)
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    if output == "-":
        click.echo(text, nl=False)
    else:
        tmp = f"{output}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, output)  # never a half-written export
        click.echo(f"Wrote {len(rows)} {fmt} rows to {output}", err=True)


@click.command("import-feedback")
@click.option("--format", "fmt", type=click.Choice(["open-webui"]), required=True,
              help="open-webui: the file Open WebUI's admin export writes (Admin > Evaluations > Export, "
                   "GET /api/v1/evaluations/feedbacks/all/export).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON summary object (counts and every record's outcome).")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
def import_feedback_command(fmt: str, file: str, as_json: bool) -> None:
    """Store another front end's ratings of this app's /v1 answers as feedback. Each record is
    matched to the stored answer it rates (by the chat and message ids forwarded at completion
    time, else by the exact answer text under the same question) and stored as the feedback of
    the user who owns that answer; records that match nothing are reported with the reason, never
    guessed. Importing the same file again changes nothing."""
    import json

    from webapp.training.openwebui import import_ratings, summary_lines
    from webapp.training.openwebui_export import ExportError, load_export

    try:
        if file == "-":
            raw = click.get_binary_stream("stdin").read()
        else:
            with open(file, "rb") as f:
                raw = f.read()
        records = load_export(raw)
    except OSError as exc:
        raise click.ClickException(f"cannot read {file}: {exc.strerror or exc}") from None
    except ExportError as exc:
        raise click.ClickException(f"{file} is {exc}") from None
    summary = import_ratings(records, source=file, actor="cli")
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
        return
    for line in summary_lines(summary):
        click.echo(line)
