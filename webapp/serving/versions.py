"""First-start set-up: the base model version. Tables are created by ``create_app`` itself.

Several processes (gunicorn workers, the CLI) may start at once on a fresh instance, so the
build runs under an exclusive file lock in the instance folder; the others wait and reuse it.
"""
from __future__ import annotations

from flask import current_app

from rlhf.models import registry
from rlhf.models.embedded import build_embedded_model, spec_for
from rlhf.models.loading import import_pretrained
from rlhf.progress import ProgressFn
from webapp.core import locks
from webapp.core.extensions import db
from webapp.core.instance_paths import to_stored
from webapp.core.models import ModelVersion, active_version


def _can_fall_back(version: ModelVersion) -> bool:
    """Whether an earlier complete version can answer while ``version`` cannot: then a broken
    active version is reported and served around, not silently replaced by a new base model."""
    return any(registry.is_complete(v.location) for v in fallback_versions(version.id))


def _noop(stage: str, done: int, total: int) -> None:
    pass


def ensure_base_version(progress: ProgressFn = _noop, force: bool = False) -> tuple[ModelVersion, bool]:
    """The active model version, building/importing the base model first if there is none
    (or if ``force``). Returns (version, created)."""
    with locks.held(locks.lock_path("init-model")):
        db.session.expire_all()  # another process may have finished the build while we waited
        current = active_version()
        if current is not None and not force and (registry.is_complete(current.location) or _can_fall_back(current)):
            return current, False  # a broken active version is served by a fallback (webapp.serving.routing)

        cfg = current_app.config
        source = str(cfg["RLHF_BASE_MODEL"]).strip()
        store = cfg["MODEL_STORE"]
        registry.remove_stale_temporaries(store)
        if source == "embedded":
            spec = spec_for(cfg["RLHF_EMBEDDED_PRESET"])
            name, path, metrics = registry.write_version(
                store, "base", lambda tmp: build_embedded_model(tmp, spec, progress),
                lineage={"parent": None, "source": "embedded", "preset": cfg["RLHF_EMBEDDED_PRESET"]})
        else:
            name, path, metrics = registry.write_version(
                store, "base", lambda tmp: import_pretrained(source, tmp),
                lineage={"parent": None, "source": source})

        version = ModelVersion(name=name, path=to_stored(path), kind="base", status="active", metrics=metrics,
                               config={"source": source, "preset": cfg["RLHF_EMBEDDED_PRESET"]})
        if current is not None:
            current.status = "retired"  # --force replaces the active base model
        db.session.add(version)
        db.session.commit()
        return version, True


def fallback_versions(version_id: int) -> list[ModelVersion]:
    """What serves instead of a broken version, best first: its ancestors, nearest first (each
    was the active version when its child was trained from it, so this is the chain of earlier
    good versions), then the base versions, newest first. Failed versions never serve."""
    out: list[ModelVersion] = []
    seen = {version_id}
    version = db.session.get(ModelVersion, version_id)
    parent = version.parent if version is not None else None
    while parent is not None and parent.id not in seen:
        seen.add(parent.id)
        if parent.status != "failed":
            out.append(parent)
        parent = parent.parent
    for base in db.session.scalars(db.select(ModelVersion).filter_by(kind="base")
                                   .where(ModelVersion.status != "failed").order_by(ModelVersion.id.desc())):
        if base.id not in seen:
            seen.add(base.id)
            out.append(base)
    return out
