"""The long-running processes: ``serve`` (gunicorn, the scheduler inside by default) and
``scheduler`` (the scheduler as its own process)."""
from __future__ import annotations

import sys

import click
from flask import current_app

from webapp.cli.common import ensure_model

# Every streamed answer holds a request thread until it ends (the answers themselves are generated
# by one batching thread per model): 32 threads serve 32 users streaming at once.
SERVE_DEFAULTS = {"workers": 1, "threads": 32}

# gunicorn's default access log line holds the request line with its query string (%(r)s) and the
# referrer (%(f)s, a full URL of this site's own pages): a search term or a token sent in a URL would
# be written to the log. This one has the path without the query, and no referrer.
ACCESS_LOG_FORMAT = '%(h)s %(l)s %(u)s %(t)s "%(m)s %(U)s %(H)s" %(s)s %(b)s "%(a)s"'


def gunicorn_settings(host: str, port: int, workers: int, threads: int) -> dict:
    """The production server's gunicorn settings (benchmarks serve their baselines with them too)."""
    return {"bind": f"{host}:{port}", "workers": workers, "threads": threads, "worker_class": "gthread",
            "timeout": 300,  # a streamed answer may take a while on a slow CPU
            "accesslog": "-", "access_log_format": ACCESS_LOG_FORMAT}


def write_json_error(sock, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn's answer to a request it cannot parse (a control character in a header, a bad request
    line, headers too large: it never reaches the app), as an OpenAI-shaped JSON error instead of its
    HTML page, so `/v1` clients read every error the same way. Replaces ``gunicorn.util.write_error``
    in the worker process (``serve``)."""
    import json

    from gunicorn.util import write_nonblock

    kind = "invalid_request_error" if status_int < 500 else "server_error"
    body = json.dumps({"error": {"message": f"{reason}: {mesg}" if mesg else reason, "type": kind,
                                 "param": None, "code": None}}).encode()
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1")
    write_nonblock(sock, head + body)


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
        ensure_model()
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
            import gunicorn.util

            gunicorn.util.write_error = write_json_error  # read at call time by the worker's handle_error
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
