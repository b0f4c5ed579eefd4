"""``rl-train``: one training cycle, in this process or as one of several under ``accelerate launch``."""
from __future__ import annotations

import contextlib
import sys

import click
from flask import current_app

from rlhf.algorithms import ALGORITHMS
from rlhf.progress import StageBars


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
    from webapp.training.model_size import sized_setting
    from webapp.training.runner import dumps, run_training
    from webapp.training.runs import EXIT_FAILED, EXIT_GATE_REJECTED, EXIT_REFUSED, RunRefused

    # one thread leaves a core to a web server on the same machine; a large model's run in one process takes
    # every core (several processes share them: each keeps the configured count)
    threads = int(current_app.config["RLHF_TRAIN_THREADS"] if distributed.is_distributed()
                  else sized_setting("train_threads"))
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
