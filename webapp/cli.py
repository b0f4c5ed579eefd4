"""Operator commands: ``flask --app webapp <command>`` (docs/cli.md is their contract)."""
from __future__ import annotations

import contextlib
import functools
import sys

import click
from flask import Flask, current_app

from rlhf.algorithms import ALGORITHMS
from rlhf.models.loading import ModelLoadError
from rlhf.progress import StageBars

from webapp.core.settings import ConfigError


def init_app(app: Flask) -> None:
    from webapp.admin.auth import create_admin_command
    from webapp.api.keys import COMMANDS as api_key_commands
    from webapp.core.backup import backup_command
    from webapp.core.restore import restore_command
    from webapp.core.database_copy import copy_database_command

    # commands that read or write the app's tables stop when the schema is not the code's
    for command in (init_model_command, serve_command, rl_train_command, export_feedback_command,
                    import_feedback_command, ab_report_command, scheduler_command, create_admin_command,
                    copy_database_command, *api_key_commands):
        app.cli.add_command(needs_current_schema(command))
    for command in (init_db_command, settings_command, backup_command, restore_command):
        app.cli.add_command(command)


def needs_current_schema(command: click.Command) -> click.Command:
    """``command``, refusing with the one-line reason when the database's schema is not the code's
    (webapp.core.migrations): behind with auto-upgrade off, or written by newer code."""
    callback = command.callback
    if callback is None or getattr(callback, "_checks_schema", False):
        return command

    def checked(*args, **kwargs):
        from webapp.core.migrations import schema_problem

        problem = schema_problem()
        if problem:
            raise click.ClickException(problem)
        return callback(*args, **kwargs)

    checked._checks_schema = True  # type: ignore[attr-defined]
    command.callback = functools.update_wrapper(checked, callback)
    return command


@click.command("init-db")
def init_db_command() -> None:
    """Create the tables, or upgrade the schema to the code's revision (safe to run again; the same
    as `flask --app webapp db upgrade`)."""
    from webapp.core.database import create_schema
    from webapp.core.migrations import SchemaError

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
    version = _ensure_model(force=force)
    click.echo(f"Active model version: {version.name} ({version.location})")


def _ensure_model(force: bool = False):
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


# Every streamed answer holds a request thread until it ends (the answers themselves are generated
# by one batching thread per model): 32 threads serve 32 users streaming at once.
SERVE_DEFAULTS = {"workers": 1, "threads": 32}


def gunicorn_settings(host: str, port: int, workers: int, threads: int) -> dict:
    """The production server's gunicorn settings (benchmarks serve their baselines with them too)."""
    return {"bind": f"{host}:{port}", "workers": workers, "threads": threads, "worker_class": "gthread",
            "timeout": 300,  # a streamed answer may take a while on a slow CPU
            "accesslog": "-"}


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--threads", default=SERVE_DEFAULTS["threads"], show_default=True, type=int,
              help="Request threads per worker (each streaming answer holds one until it ends).")
@click.option("--workers", default=SERVE_DEFAULTS["workers"], show_default=True, type=int,
              help="Worker processes; each holds its own copy of the models.")
def serve_command(host: str, port: int, threads: int, workers: int) -> None:
    """Run the production server (gunicorn), building the base model first if needed."""
    from gunicorn.app.base import BaseApplication

    if current_app.config["RLHF_AUTO_INIT_MODEL"]:
        _ensure_model()
    app = current_app._get_current_object()
    if app.config["RLHF_SCHEDULER"] and workers > 1:
        raise click.ClickException(
            f"the scheduler runs inside the web process (RLHF_SCHEDULER=1, the default) and would run once per "
            f"worker with --workers {workers}: set RLHF_SCHEDULER=0 and run `flask --app webapp scheduler` as "
            "its own process, or serve with --workers 1")

    class _Server(BaseApplication):
        def load_config(self) -> None:
            for key, value in gunicorn_settings(host, port, workers, threads).items():
                self.cfg.set(key, value)

        def load(self):
            # in the worker process, after gunicorn forked it
            inference_threads = int(app.config["RLHF_INFERENCE_THREADS"])
            if inference_threads > 0:
                import torch

                torch.set_num_threads(inference_threads)
            if app.config["RLHF_SCHEDULER"]:
                from webapp.training.scheduler import SchedulerAlreadyRunning, start_background

                try:
                    start_background(app)
                except SchedulerAlreadyRunning as exc:  # e.g. `flask scheduler` runs it: serve without it
                    click.echo(f"Warning: not starting the scheduler here: {exc}", err=True)
            return app

    click.echo(f"Serving on http://{host}:{port}/", err=True)
    sys.argv = sys.argv[:1]  # gunicorn parses argv; ours are already consumed
    _Server().run()


@click.command("rl-train")
@click.option("--algorithm", type=click.Choice(ALGORITHMS), default=None,
              help="Policy-training algorithm [default: the training.algorithm setting, RLHF_RETRAIN_ALGORITHM].")
@click.option("--min-feedback", type=int, default=None,
              help="Refuse below this many feedback events [default: RLHF_RETRAIN_MIN_FEEDBACK].")
@click.option("--max-steps", type=int, default=None, help="Cap on policy optimisation steps.")
@click.option("--lora/--no-lora", default=None,
              help="Train a LoRA adapter; the new version is the adapter, served on its parent's weights.")
@click.option("--trigger", type=click.Choice(["cli", "manual", "schedule"]), default="cli", hidden=True)
@click.option("--run-id", type=int, default=None, hidden=True, help="Take over this queued run (the web app's).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON summary object at the end.")
def rl_train_command(algorithm: str | None, min_feedback: int | None, max_steps: int | None, lora: bool | None,
                     trigger: str, run_id: int | None, as_json: bool) -> None:
    """Run one training cycle: feedback -> reward model -> policy -> evaluation gate -> new version.

    Exit codes: 0 new candidate version; 3 the evaluation gate rejected it (stored as failed);
    2 refused to start (not enough feedback, another run in progress, invalid setting);
    1 the run failed (marked failed; the active version is unchanged).

    Under ``accelerate launch --num_processes N`` every process runs this command: the main one
    (rank 0) is the run; the others train alongside it on the data it sends (rlhf.training.distributed).
    """
    import torch

    from rlhf.models.embedded import torch_threads
    from rlhf.training import distributed

    from webapp.training.runner import dumps, run_training
    from webapp.training.runs import EXIT_FAILED, EXIT_GATE_REJECTED, EXIT_REFUSED, RunRefused

    threads = int(current_app.config["RLHF_TRAIN_THREADS"])  # leave cores to a web server on the same machine
    if distributed.unsupported():
        click.echo(f"Error: {distributed.unsupported()}", err=True)
        sys.exit(EXIT_REFUSED)
    if distributed.is_distributed():
        _join_training_processes()
        if not distributed.is_main():
            _follow_main_process(threads or torch.get_num_threads())
            return
    bars = StageBars(disable=not sys.stderr.isatty())
    try:
        # Libraries print to stdout during training; keep stdout for the result alone.
        with torch_threads(threads or torch.get_num_threads()), bars, contextlib.redirect_stdout(sys.stderr):
            result = run_training(trigger=trigger, algorithm=algorithm, min_feedback=min_feedback,
                                  max_steps=max_steps, lora=lora, bars=bars, run_id=run_id, watchdog=True)
    except RunRefused as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    except Exception as exc:  # the run is already marked failed in the database
        click.echo(f"Error: training run failed: {type(exc).__name__}: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    if as_json:
        click.echo(dumps(result))
    else:
        ev, rm, version = result["evaluation"], result["reward_model"], result["version"]
        click.echo(f"Run #{result['run_id']} {result['status']}: {version['name']} registered as {version['status']}")
        click.echo(f"  reward model held-out accuracy: {rm['heldout_accuracy']} "
                   f"({rm['train_pairs']} train / {rm['eval_pairs']} held-out pairs)")
        click.echo(f"  evaluation gate: {ev['verdict']}; judged by: {'; '.join(ev['judged_by'] or [])}")
        heldout, judge = ev["heldout"] or {}, ev["judge"]
        click.echo(f"  held-out preferences: candidate ahead of the parent on {heldout.get('wins')} of "
                   f"{heldout.get('pairs')} pairs (share {heldout.get('share')}, 95% CI {heldout.get('ci95')}, "
                   f"sign test p {heldout.get('p_value')}); judge reward gain "
                   f"{judge['gain'] if judge else 'not measured'}; KL {ev['kl_from_parent']}")
        click.echo(f"  reward gain on the reward model the policy was optimized against (reported, never decides): "
                   f"{ev['optimized_against']['reward_gain']}")
        if not ev["passed"]:
            click.echo(f"  rejected by the evaluation gate: {'; '.join(ev['reasons'])}")
    if result["decision"] == "rejected_by_gate":
        sys.exit(EXIT_GATE_REJECTED)


def _join_training_processes() -> None:
    """Join the launcher's process group. A collective that waits longer than the stall limit fails
    (the process group's timeout): a process that waits that long for the others waits on a hung
    or dead one. The launcher stops every process as soon as one exits with an error; on the main
    process that SIGTERM becomes SystemExit, so the run is marked failed on the way out."""
    import signal

    from rlhf.models.loading import resolve_device
    from rlhf.training import distributed

    from webapp.core.settings import current_settings
    from webapp.training.runs import EXIT_FAILED

    device = resolve_device(current_settings().training.device)
    distributed.init(cpu=device.type == "cpu", timeout_seconds=float(current_app.config["RLHF_RUN_STALL_SECONDS"]))
    if distributed.is_main():
        def stopped(signum: int, frame: object) -> None:
            raise StoppedByLauncher(EXIT_FAILED)

        signal.signal(signal.SIGTERM, stopped)


class StoppedByLauncher(SystemExit):
    """SIGTERM on the main training process: the launcher stops every process when one fails."""

    def __str__(self) -> str:
        return "SIGTERM from accelerate launch: another training process failed (or the launcher was stopped)"


def _follow_main_process(threads: int) -> None:
    """A process other than the main one: train alongside it, then leave (exit 0, or 1 on an error)."""
    from rlhf.cycle import follow_main
    from rlhf.models.embedded import torch_threads
    from rlhf.training import distributed

    try:
        with torch_threads(threads), contextlib.redirect_stdout(sys.stderr):
            follow_main()
    except Exception as exc:
        click.echo(f"Error: training process {distributed.rank()} failed: {type(exc).__name__}: {exc}", err=True)
        sys.exit(1)
    finally:
        distributed.finish()


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

    from webapp.training.openwebui import ExportError, import_ratings, load_export, summary_lines

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


@click.command("ab-report")
@click.option("--experiment", "key", help="Experiment key [default: the running one, else the latest].")
@click.option("--json", "as_json", is_flag=True, help="Print the full metrics object (as GET /api/admin/metrics).")
def ab_report_command(key: str | None, as_json: bool) -> None:
    """Per-arm A/B metrics over users: sequential (always-valid) and fixed-horizon intervals and
    p-values, chance to beat control, the primary metric's power, and the SRM check."""
    import json

    from webapp.core.extensions import db
    from webapp.core.models import Experiment
    from webapp.experiments.metrics import default_experiment, experiment_metrics

    exp = db.session.scalars(db.select(Experiment).filter_by(key=key)).first() if key else default_experiment()
    if exp is None:
        raise click.ClickException(f"no experiment {key!r}" if key else "there are no experiments yet")
    data = experiment_metrics(exp)
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
        return
    for line in ab_report_lines(data):
        click.echo(line)


def _interval(low: float | None, high: float | None, signed: bool = False) -> str:
    if low is None or high is None:
        return ""
    fmt = "{:+.3f}" if signed else "{:.3f}"
    return f"[{fmt.format(low)}, {fmt.format(high)}]"


def _arm_cell(est: dict) -> str:
    if est.get("value") is None:
        return "-"
    return f"{est['value']:.3f} {_interval(est.get('low'), est.get('high'))} n={est.get('n')}".replace("  ", " ")


def ab_report_lines(data: dict) -> list[str]:
    """The text report of a metrics dict."""
    e, arms = data["experiment"], data["arms"]
    policy = data.get("policy") or {}
    lines = [f"Experiment {e['key']} ({e['status']}): {e['control']} (control) vs {e['variant']} (variant), "
             f"split {e['traffic_split']:.2f}",
             f"  users {arms['control']['users']} / {arms['variant']['users']}, answers "
             f"{arms['control']['answers']} / {arms['variant']['answers']}",
             f"  users are the unit (n = users with data); verdicts use the sequential interval and its "
             f"always-valid p (tuning {policy.get('sequential_tuning', 0):g}); fixed-horizon ones for reference",
             f"  {'metric':<18}{'control':>28}{'variant':>28}{'diff [sequential 95%]':>30}{'p (seq)':>9}"
             f"{'fixed-horizon 95%':>20}{'p':>9}{'P(beat)':>9}"]
    for row in data["metrics"]:
        c, seq = row["comparison"], row["sequential"]
        if row["enough_data"] and c["diff"] is not None:
            tail = (f"{c['diff']:>+9.3f} {_interval(seq['low'], seq['high'], True):>20}{seq['p_value']:>9.4f}"
                    f"{_interval(c['low'], c['high'], True):>20}{c['p_value']:>9.4f}{c['chance_to_beat']:>9.3f}")
        else:
            tail = f"{'not enough data yet':>30}"
        lines.append(f"  {row['name']:<18}{_arm_cell(row['control']):>28}{_arm_cell(row['variant']):>28}{tail}")
        if row["name"] == policy.get("primary_metric") and row.get("power"):
            lines.append(f"    power ({row['name']}, the primary metric): {row['power']['summary']}")
    srm = data["srm"]
    if srm["p_value"] is not None:
        flag = "MISMATCH - check routing" if srm["mismatch"] else "ok"
        lines.append(f"  sample ratio: chi2 {srm['chi2']:.2f}, p {srm['p_value']:.4g} ({flag})")
    return lines


@click.command("scheduler")
def scheduler_command() -> None:
    """Run the APScheduler loop (retrain, experiment monitor, housekeeping) as its own process."""
    import logging

    from webapp.training.scheduler import SchedulerAlreadyRunning, build_scheduler, claim_scheduler

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    app = current_app._get_current_object()
    try:
        claim_scheduler(app, "scheduler process")
    except SchedulerAlreadyRunning as exc:
        raise click.ClickException(str(exc)) from None
    scheduler = build_scheduler(app, blocking=True)
    click.echo("Scheduler running (Ctrl-C to stop). Jobs: " + ", ".join(
        f"{j.id} every {j.trigger.interval}" for j in scheduler.get_jobs()), err=True)
    try:
        scheduler.start()
    except (KeyboardInterrupt, SystemExit):
        pass


@click.command("settings")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of {name, env, group, value, default, source}.")
@click.option("--markdown", is_flag=True, help="Print the configuration tables of docs/configuration.md (generated from the definitions).")
def settings_command(as_json: bool, markdown: bool) -> None:
    """Every setting's effective value and where it came from (default, a file, the environment,
    create_app). Secrets are masked."""
    import json

    from webapp.core.settings import effective, markdown_tables

    if markdown:
        click.echo(markdown_tables(), nl=False)
        return
    rows = effective(current_app.config["RLHF_SETTINGS"], current_app.config["RLHF_SETTING_SOURCES"])
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    width = max(len(r["name"]) for r in rows)
    group = None
    for r in rows:
        if r["group"] != group:
            group = r["group"]
            click.echo(f"[{group}]")
        click.echo(f"  {r['name']:<{width}}  {r['value']:<24} {r['source']}  ({r['env']})")

