"""Reports: ``ab-report`` (an experiment's metrics as text or JSON), ``settings`` (every setting's
effective value and its source)."""
from __future__ import annotations

import click
from flask import current_app


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


@click.command("settings")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON list of {name, env, group, value, default, source}.")
@click.option("--markdown", is_flag=True,
              help="Print the configuration tables of docs/configuration.md (generated from the definitions).")
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
