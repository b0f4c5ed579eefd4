"""Experiment and version lifecycle: create/start, change split, stop, conclude, promote, roll back.

Rules:
* at most one running experiment (one traffic slot); with none running everyone gets the
  active version;
* failed versions never serve; a version must be complete on disk to serve;
* changing a running experiment's split only affects users not yet assigned (assignments
  are sticky); a new experiment has a new key, hence fresh, independent buckets;
* concluding with "promote" makes the variant active (the control is retired); "keep_control"
  retires the variant. Every change is an audit event.
"""
from __future__ import annotations

import re
from typing import Any

from werkzeug.exceptions import BadRequest, Conflict, NotFound

from rlhf.models import registry
from webapp.core.audit import audit
from webapp.core.extensions import db
from webapp.core.models import Experiment, ModelVersion, active_version, utcnow
from webapp.core.validation import MAX_ID, clip
from webapp.experiments.assignment import running_experiment

KEY_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
DECISIONS = ("promote", "keep_control")


def get_version(version_id: Any) -> ModelVersion:
    if isinstance(version_id, bool) or not isinstance(version_id, int):
        raise BadRequest("version ids must be integers")
    version = db.session.get(ModelVersion, version_id) if 1 <= version_id <= MAX_ID else None
    if version is None:
        raise NotFound(f"Model version {version_id} not found.")
    return version


def get_experiment(key: str) -> Experiment:
    exp = db.session.scalars(db.select(Experiment).filter_by(key=key)).first()
    if exp is None:
        raise NotFound(f"Experiment {clip(key)!r} not found.")
    return exp


def validate_split(split: Any) -> float:
    if isinstance(split, bool) or not isinstance(split, (int, float)) or not 0 < float(split) < 1:
        raise BadRequest("traffic_split must be a number strictly between 0 and 1 (the variant's share).")
    return float(split)


def _servable(version: ModelVersion, role: str) -> None:
    if version.status == "failed":
        raise Conflict(f"Version {version.name} failed its evaluation and cannot be used as the {role}.")
    if version.kind == "reward":
        raise Conflict(f"Version {version.name} is a reward model, not a policy.")
    if not registry.is_complete(version.location):
        raise Conflict(f"Version {version.name} is missing from the model store ({version.path}).")


def create_experiment(key: str, control_id: Any, variant_id: Any, split: Any = 0.5, start: bool = True,
                      actor: str | None = None) -> Experiment:
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise BadRequest("key must be 1-64 lower-case letters, digits, '-' or '_' (it is the hash seed).")
    if db.session.scalars(db.select(Experiment).filter_by(key=key)).first() is not None:
        raise Conflict(f"An experiment with key {key!r} already exists; keys are never reused.")
    control, variant = get_version(control_id), get_version(variant_id)
    if control.id == variant.id:
        raise BadRequest("control and variant must be different versions.")
    split = validate_split(split)
    _servable(control, "control")
    _servable(variant, "variant")
    if start and running_experiment() is not None:
        raise Conflict(f"Experiment {running_experiment().key!r} is already running; stop it first.")
    exp = Experiment(key=key, control_version_id=control.id, variant_version_id=variant.id, traffic_split=split,
                     status="running" if start else "draft", started_at=utcnow() if start else None)
    db.session.add(exp)
    audit("experiment_create", key, control=control.name, variant=variant.name, split=split, started=start,
          actor=actor or "system")
    db.session.commit()
    return exp


def start_experiment(key: str, actor: str | None = None) -> Experiment:
    exp = get_experiment(key)
    if exp.status != "draft":
        raise Conflict(f"Experiment {key!r} is {exp.status}; only a draft can start.")
    other = running_experiment()
    if other is not None:
        raise Conflict(f"Experiment {other.key!r} is already running; stop it first.")
    exp.status, exp.started_at = "running", utcnow()
    audit("experiment_start", key, actor=actor or "system")
    db.session.commit()
    return exp


def set_split(key: str, split: Any, actor: str | None = None) -> Experiment:
    exp = get_experiment(key)
    if exp.status not in ("draft", "running"):
        raise Conflict(f"Experiment {key!r} is {exp.status}; its split can no longer change.")
    old, exp.traffic_split = exp.traffic_split, validate_split(split)
    audit("experiment_split", key, old=old, new=exp.traffic_split, actor=actor or "system")
    db.session.commit()
    return exp


def stop_experiment(key: str, actor: str | None = None) -> Experiment:
    exp = get_experiment(key)
    if exp.status not in ("draft", "running"):
        raise Conflict(f"Experiment {key!r} is already {exp.status}.")
    exp.status, exp.ended_at = "stopped", utcnow()
    audit("experiment_stop", key, actor=actor or "system")
    db.session.commit()
    return exp


def conclude_experiment(key: str, decision: Any, detail: dict | None = None, actor: str | None = None) -> Experiment:
    exp = get_experiment(key)
    if decision not in DECISIONS:
        raise BadRequest(f"decision must be one of: {', '.join(DECISIONS)}.")
    if exp.status == "concluded":
        raise Conflict(f"Experiment {key!r} is already concluded ({exp.decision}).")
    if decision == "promote":
        _servable(exp.variant_version, "active version")
        _activate(exp.variant_version)
    elif exp.variant_version.status == "candidate":
        exp.variant_version.status = "retired"
    exp.status, exp.decision, exp.ended_at = "concluded", decision, exp.ended_at or utcnow()
    exp.decision_detail = detail or {}
    audit("experiment_conclude", key, decision=decision, variant=exp.variant_version.name,
          control=exp.control_version.name, numbers=detail or {}, actor=actor or "system")
    db.session.commit()
    return exp


def _activate(version: ModelVersion) -> ModelVersion | None:
    """Make ``version`` the only active version; returns the one it replaced."""
    previous = active_version()
    for v in db.session.scalars(db.select(ModelVersion).filter_by(status="active")):
        if v.id != version.id:
            v.status = "retired"
    version.status = "active"
    return previous if previous is not None and previous.id != version.id else None


def promote_version(version_id: Any, actor: str | None = None) -> ModelVersion:
    version = get_version(version_id)
    if version.status == "active":
        raise Conflict(f"Version {version.name} is already active.")
    _servable(version, "active version")
    exp = running_experiment()
    if exp is not None and version.id == exp.variant_version_id:
        conclude_experiment(exp.key, "promote", {"reason": "promoted by an admin during the experiment"}, actor)
        return version
    if exp is not None:
        raise Conflict(f"Experiment {exp.key!r} is running; stop or conclude it before promoting another version.")
    previous = _activate(version)
    audit("promote", version.name, previous=previous.name if previous else None, actor=actor or "system")
    db.session.commit()
    return version


def rollback_version(version_id: Any, actor: str | None = None) -> ModelVersion:
    """Retire the active ``version`` and reactivate the version it replaced (its parent, or
    the most recently retired servable version)."""
    version = get_version(version_id)
    if version.status != "active":
        raise Conflict(f"Only the active version can be rolled back; {version.name} is {version.status}.")
    if running_experiment() is not None:
        raise Conflict("An experiment is running; stop it before rolling back.")
    target = version.parent if version.parent is not None and version.parent.status != "failed" else None
    if target is None:
        target = db.session.scalars(db.select(ModelVersion).where(ModelVersion.status == "retired",
                                                                   ModelVersion.id != version.id)
                                    .order_by(ModelVersion.id.desc())).first()
    if target is None or not registry.is_complete(target.location):
        raise Conflict(f"There is no earlier version to roll back to from {version.name}.")
    _activate(target)
    version.status = "retired"
    audit("rollback", version.name, to=target.name, actor=actor or "system")
    db.session.commit()
    return target
