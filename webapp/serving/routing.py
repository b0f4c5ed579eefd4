"""Which model answers a user, and the app's pool of loaded models.

A version that cannot be loaded (directory missing, ``config.json`` deleted, weights truncated
or garbage) does not take the chat down: its answers come from the last good version instead
(see :func:`fallback_versions`), and every answer records the version that really answered.
The problem is recorded where every process sees it -- ``metrics["unservable"]`` on the
version's row plus a ``version_unservable`` audit event -- and shown on the admin overview and
by ``/api/health``. The broken version is tried again as soon as its directory changes (or
every ``RETRY_SECONDS``); once it loads, the record is cleared (``version_recovered``).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from flask import current_app
from werkzeug.exceptions import ServiceUnavailable

from rlhf import registry
from rlhf.generation import GenerationSettings, LoadedModel, ModelPool
from rlhf.loading import ModelLoadError

from webapp.core.extensions import db
from webapp.core.models import AuditEvent, ModelVersion, User, active_version, utcnow
from webapp.experiments.assignment import assign, running_experiment
from webapp.serving.versions import fallback_versions

# A version that failed to load is retried at once when its directory changes, else after this.
RETRY_SECONDS = 60.0


@dataclass(frozen=True)
class Route:
    """The version that serves a user's next answer, and the experiment arm it came from.
    Plain values only, so a route stays valid after the request's database session ends."""

    version_id: int
    version_name: str
    version_path: str
    experiment_id: int | None = None
    arm: str | None = None

    @classmethod
    def of(cls, version: ModelVersion, experiment_id: int | None = None, arm: str | None = None) -> "Route":
        return cls(version.id, version.name, version.path, experiment_id, arm)


def model_pool() -> ModelPool:
    app = current_app._get_current_object()
    pool = app.extensions.get("model_pool")
    if pool is None:
        pool = app.extensions["model_pool"] = ModelPool(app.config["RLHF_DEVICE"])
    return pool


def route_for(user: User) -> Route:
    """Everyone gets the active version unless a running experiment assigns them an arm."""
    experiment = running_experiment()
    if experiment is not None:
        arm = assign(experiment, user)
        version = experiment.variant_version if arm == "variant" else experiment.control_version
        return Route.of(version, experiment.id, arm)
    version = active_version()
    if version is None:
        raise ServiceUnavailable("No model is ready yet: the base model is still being built. "
                                 "Try again in a minute.")
    return Route.of(version)


# ---------------------------------------------------------------------------- broken versions

@dataclass
class _Failure:
    fingerprint: tuple
    at: float  # time.monotonic() of the failed attempt
    error: str


@dataclass
class _Health:
    """This process's view: failed load attempts by path, and what it recorded in the database."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    failures: dict[str, _Failure] = field(default_factory=dict)
    recorded: dict[int, tuple[str, int | None]] = field(default_factory=dict)  # version id -> (error, fallback id)


def _health() -> _Health:
    app = current_app._get_current_object()
    health = app.extensions.get("serving_health")
    if health is None:
        health = app.extensions["serving_health"] = _Health()
    return health


def _fingerprint(path: str) -> tuple:
    """Names, sizes and modification times of a directory's entries: changes when it is fixed."""
    try:
        with os.scandir(path) as entries:
            stats = [(e.name, e.stat()) for e in entries]
    except OSError:
        return ("<missing>",)
    return tuple(sorted((name, st.st_size, st.st_mtime_ns) for name, st in stats))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ModelLoadError):
        return str(exc)
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _attempt(path: str, name: str) -> tuple[LoadedModel | None, str | None, bool]:
    """(loaded model or None, error, freshly loaded by this call). A path that failed is not
    tried again until its directory changes or RETRY_SECONDS pass."""
    pool, key = model_pool(), str(path)
    if key in pool.loaded():
        return pool.get(key, name), None, False
    health = _health()
    fingerprint = _fingerprint(key)
    with health.lock:
        failure = health.failures.get(key)
    if failure and failure.fingerprint == fingerprint and time.monotonic() - failure.at < RETRY_SECONDS:
        return None, failure.error, False
    try:
        loaded = pool.get(key, name)
    except Exception as exc:  # whatever a broken directory raises, the chat must not fail with it
        error = _describe(exc)
        with health.lock:
            health.failures[key] = _Failure(fingerprint, time.monotonic(), error)
        if failure is None or failure.error != error:
            current_app.logger.error("model version %s cannot be loaded: %s", name, error)
        return None, error, False
    with health.lock:
        health.failures.pop(key, None)
    return loaded, None, True


def _commit_quietly(what: str) -> None:
    """The health record must never fail an answer: a database hiccup is logged, not raised."""
    try:
        db.session.commit()
    except Exception:
        db.session.rollback()
        current_app.logger.exception("could not record %s", what)


def _record_problem(route: Route, error: str, fallback: Route | None) -> None:
    health = _health()
    key = (error, fallback.version_id if fallback else None)
    with health.lock:
        if health.recorded.get(route.version_id) == key:
            return
        health.recorded[route.version_id] = key
    version = db.session.get(ModelVersion, route.version_id)
    if version is None:
        return
    old = (version.metrics or {}).get("unservable") or {}
    if (old.get("error"), old.get("serving_id")) == key:
        return  # another process recorded it already
    problem = {"error": error, "serving": fallback.version_name if fallback else None, "serving_id": key[1],
               "since": old.get("since") or utcnow().isoformat(timespec="seconds")}
    version.metrics = {**(version.metrics or {}), "unservable": problem}
    db.session.add(AuditEvent(actor="server", action="version_unservable", subject=version.name,
                              detail={"error": error, "serving": problem["serving"]}))
    _commit_quietly(f"that {version.name} cannot be loaded")


def _clear_problem(route: Route) -> None:
    health = _health()
    with health.lock:
        health.recorded.pop(route.version_id, None)
    version = db.session.get(ModelVersion, route.version_id)
    if version is None or "unservable" not in (version.metrics or {}):
        return
    metrics = dict(version.metrics)
    problem = metrics.pop("unservable")
    version.metrics = metrics
    db.session.add(AuditEvent(actor="server", action="version_recovered", subject=version.name,
                              detail={"was": problem}))
    _commit_quietly(f"that {version.name} loads again")
    current_app.logger.warning("model version %s loads again; it serves its answers again", version.name)


def serve(route: Route) -> tuple[Route, LoadedModel]:
    """The route that really answers and its loaded model: ``route`` itself when its version
    loads, else the first fallback version that loads. A fallback answers outside any
    experiment (no experiment id, no arm): its answers are not the arm's model's answers.
    503 only when nothing at all can be loaded."""
    loaded, error, fresh = _attempt(route.version_path, route.version_name)
    if loaded is not None:
        if fresh:
            _clear_problem(route)
        return route, loaded
    for version in fallback_versions(route.version_id):
        fallback_loaded, _, fresh = _attempt(version.path, version.name)
        if fallback_loaded is not None:
            fallback = Route.of(version)
            if fresh:
                _clear_problem(fallback)
            _record_problem(route, error or "cannot be loaded", fallback)
            return fallback, fallback_loaded
    _record_problem(route, error or "cannot be loaded", None)
    # no version name: users are not told which version (or arm) serves them; the admin
    # overview and the log name it
    raise ServiceUnavailable("The model cannot be loaded right now; please try again later.")


def serving_problems() -> list[dict[str, Any]]:
    """Versions users should be getting (the active one, the arms of a running experiment) that
    cannot serve: as recorded by any process, or -- before any request tried them -- visibly
    incomplete on disk. Each: version, path, error, serving (the fallback's name or None), since."""
    wanted = [v for v in [active_version()] if v is not None]
    exp = running_experiment()
    if exp is not None:
        wanted += [v for v in (exp.control_version, exp.variant_version) if v.id not in {w.id for w in wanted}]
    problems = []
    for version in wanted:
        recorded = (version.metrics or {}).get("unservable")
        if recorded:
            problems.append({"version": version.name, "path": version.path, "error": recorded.get("error"),
                             "serving": recorded.get("serving"), "since": recorded.get("since")})
        elif not registry.has_model_config(version.path):  # config.json, or a LoRA adapter's config
            serving = next((v.name for v in fallback_versions(version.id)
                            if registry.has_model_config(v.path)), None)
            problems.append({"version": version.name, "path": version.path, "since": None, "serving": serving,
                             "error": "its directory is missing or incomplete (no config.json)"})
    return problems


def generation_settings() -> GenerationSettings:
    cfg = current_app.config
    return GenerationSettings(max_new_tokens=int(cfg["RLHF_MAX_NEW_TOKENS"]),
                              temperature=float(cfg["RLHF_TEMPERATURE"]), top_p=float(cfg["RLHF_TOP_P"]))

