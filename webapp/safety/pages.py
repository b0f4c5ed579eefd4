"""The admin's Safety page: the output rail's rules (add a phrase or pattern, switch presets and
rules on or off, delete) and the latest interventions. Plain HTML forms (each with its CSRF
token), admin login required; every change is recorded in the audit log. A bad phrase or
pattern is a 400 with the page and the reason, never a 500."""
from __future__ import annotations

from flask import Blueprint, current_app, redirect, render_template, request, url_for
from flask_login import current_user
from werkzeug.exceptions import NotFound

from rlhf.safety import MAX_PATTERN_CHARS, PRESETS, validate_pattern, validate_phrase
from webapp.admin.auth import admin_page
from webapp.core.audit import audit
from webapp.core.extensions import db
from webapp.core.models import RailIntervention, RailRule
from webapp.safety.rail import preset_states

bp = Blueprint("safety_pages", __name__, url_prefix="/admin/safety")

LATEST = 100


def _render(error: str | None = None, status: int = 200, form: dict | None = None):
    rules = db.session.scalars(db.select(RailRule).where(RailRule.kind != "preset").order_by(RailRule.id)).all()
    interventions = db.session.scalars(db.select(RailIntervention).order_by(RailIntervention.id.desc())
                                       .limit(LATEST)).all()
    cfg = current_app.config
    return render_template("admin/safety.html", rules=rules, presets=PRESETS, states=preset_states(),
                           interventions=interventions, error=error, form=form or {},
                           max_pattern=MAX_PATTERN_CHARS,
                           rail={"enabled": cfg["RLHF_RAIL_ENABLED"], "action": cfg["RLHF_RAIL_ACTION"],
                                 "refusal": cfg["RLHF_RAIL_REFUSAL_TEXT"],
                                 "threshold": cfg["RLHF_RAIL_COST_THRESHOLD"],
                                 "attempts": cfg["RLHF_RAIL_REGENERATE_ATTEMPTS"]}), status


@bp.get("/")
@admin_page
def page():
    return _render()


@bp.post("/rules")
@admin_page
def add_rule():
    kind = request.form.get("kind", "")
    value = request.form.get("value", "")
    form = {"kind": kind, "value": value}
    if kind not in ("phrase", "pattern"):
        return _render("Choose a phrase or a pattern.", 400, form)
    value = value.strip() if kind == "phrase" else value
    problem = validate_phrase(value) if kind == "phrase" else validate_pattern(value)
    if problem:
        return _render(problem, 400, form)
    if db.session.scalars(db.select(RailRule).filter_by(kind=kind, value=value)).first() is not None:
        return _render(f"That {kind} is already a rule.", 409, form)
    rule = RailRule(kind=kind, value=value, enabled=True, created_by=current_user.id)
    db.session.add(rule)
    audit("rail_rule_add", f"{kind}: {value}"[:200], kind=kind, value=value)
    db.session.commit()
    return redirect(url_for("safety_pages.page"), 303)


def _rule_or_404(rule_id: int) -> RailRule:
    rule = db.session.get(RailRule, rule_id)
    if rule is None or rule.kind == "preset":
        raise NotFound("No such rule.")
    return rule


@bp.post("/rules/<int:rule_id>/toggle")
@admin_page
def toggle_rule(rule_id: int):
    rule = _rule_or_404(rule_id)
    rule.enabled = not rule.enabled
    audit("rail_rule_enable" if rule.enabled else "rail_rule_disable", f"{rule.kind}: {rule.value}"[:200],
          kind=rule.kind, value=rule.value)
    db.session.commit()
    return redirect(url_for("safety_pages.page"), 303)


@bp.post("/rules/<int:rule_id>/delete")
@admin_page
def delete_rule(rule_id: int):
    rule = _rule_or_404(rule_id)
    audit("rail_rule_delete", f"{rule.kind}: {rule.value}"[:200], kind=rule.kind, value=rule.value)
    db.session.delete(rule)
    db.session.commit()
    return redirect(url_for("safety_pages.page"), 303)


@bp.post("/presets/<name>")
@admin_page
def set_preset(name: str):
    if name not in PRESETS:
        raise NotFound("No such preset.")
    enabled = request.form.get("enabled") == "1"
    row = db.session.scalars(db.select(RailRule).filter_by(kind="preset", value=name)).first()
    if row is None:
        row = RailRule(kind="preset", value=name, created_by=current_user.id)
        db.session.add(row)
    old = True if row.enabled is None else bool(row.enabled)
    row.enabled = enabled
    audit("rail_preset_enable" if enabled else "rail_preset_disable", f"preset: {name}", preset=name,
          was=old, now=enabled)
    db.session.commit()
    return redirect(url_for("safety_pages.page"), 303)
