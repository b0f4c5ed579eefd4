"""A/B routing: GrowthBook-compatible hashing with sticky first-exposure assignments.

bucket = fnv1a32(str(fnv1a32(seed + user_key))) % 10000 / 10000 (GrowthBook hash v2), the
seed being the experiment key. With split s (share of users in the variant) the control arm
owns buckets [0, 1 - s) and the variant [1 - s, 1), as GrowthBook's bucket ranges do for two
variations with weights (1 - s, s). The first exposure is stored in ``assignments``; later
requests read it back, so changing a running experiment's split never moves anyone who was
already assigned (only new users see the new split).
"""
from __future__ import annotations

from sqlalchemy.exc import IntegrityError

from webapp.core.extensions import db
from webapp.core.models import Assignment, Experiment, User

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


def fnv1a32(text: str) -> int:
    """32-bit FNV-1a over the string's code points, exactly as GrowthBook's SDKs compute it."""
    h = _FNV_OFFSET
    for ch in text:
        h = ((h ^ ord(ch)) * _FNV_PRIME) & 0xFFFFFFFF
    return h


def gb_hash(seed: str, value: str, version: int = 2) -> float | None:
    """GrowthBook's hash to [0, 1): version 2 (the default) or the legacy version 1; None for
    an unknown version, as GrowthBook's SDKs answer."""
    if version == 2:
        return (fnv1a32(str(fnv1a32(seed + value))) % 10000) / 10000
    if version == 1:
        return (fnv1a32(value + seed) % 1000) / 1000
    return None


def arm_for(experiment_key: str, user_key: str, split: float) -> str:
    """The arm a user falls in for a given split (no stickiness)."""
    bucket = gb_hash(experiment_key, user_key)
    assert bucket is not None
    return "variant" if bucket >= 1.0 - split else "control"


def user_hash_key(user: User) -> str:
    """The stable identity that is hashed: the database id, the same in every process."""
    return str(user.id)


def running_experiment() -> Experiment | None:
    return db.session.scalars(db.select(Experiment).filter_by(status="running")
                              .order_by(Experiment.id.desc())).first()


def assign(experiment: Experiment, user: User) -> str:
    """The user's arm in ``experiment``: the stored first exposure, else hashed and stored."""
    existing = db.session.scalars(db.select(Assignment).filter_by(experiment_id=experiment.id,
                                                                  user_id=user.id)).first()
    if existing is not None:
        return existing.arm
    arm = arm_for(experiment.key, user_hash_key(user), experiment.traffic_split)
    try:
        with db.session.begin_nested():
            db.session.add(Assignment(experiment_id=experiment.id, user_id=user.id, arm=arm))
        db.session.commit()
    except IntegrityError:  # another request of the same user got there first
        db.session.rollback()
        arm = db.session.scalars(db.select(Assignment.arm).filter_by(experiment_id=experiment.id,
                                                                     user_id=user.id)).one()
    return arm


