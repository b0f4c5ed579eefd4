"""The output rail as the chat serves it: the rules from the database, the served version's cost
head, the settings, and the interventions it stores (rlhf.safety does the checking).

``rail_for(route)`` is None when the rail is off (``RLHF_RAIL_ENABLED=0``). Rules are read once per
answer (one small query) and compiled once per distinct rule set (cached). The cost head is the
served version's reward model's ``CriteriaScorer`` (``metrics["reward_model_path"]``), loaded once
per path; a version without one is checked by the rules only.
"""
from __future__ import annotations

import functools
import threading
from typing import Sequence

from flask import current_app

from rlhf.reward.criteria_heads import CriteriaScorer
from rlhf.safety import PRESETS, Block, Rail, RailPolicy, build_rules
from webapp.core.extensions import db
from webapp.core.instance_paths import resolve
from webapp.core.models import ModelVersion, RailIntervention, RailRule
from webapp.serving.routing import Route


def preset_states() -> dict[str, bool]:
    """Each built-in preset's on/off state (on unless an admin switched it off)."""
    states = {name: True for name in PRESETS}
    for row in db.session.scalars(db.select(RailRule).filter_by(kind="preset")):
        if row.value in states:
            states[row.value] = bool(row.enabled)
    return states


def rule_specs() -> tuple[tuple[str, str], ...]:
    """The enabled rules as ``(kind, value)``: presets switched on, admins' phrases and patterns."""
    rows = db.session.execute(db.select(RailRule.kind, RailRule.value, RailRule.enabled)
                              .order_by(RailRule.id)).all()
    off = {value for kind, value, enabled in rows if kind == "preset" and not enabled}
    specs = [("preset", name) for name in PRESETS if name not in off]
    specs += [(kind, value) for kind, value, enabled in rows if kind != "preset" and enabled]
    return tuple(specs)


@functools.lru_cache(maxsize=32)
def _compiled(specs: tuple[tuple[str, str], ...]):
    return build_rules(specs)


_scorer_lock = threading.Lock()


def _scorer(reward_dir: str) -> CriteriaScorer | None:
    """The cost head of ``reward_dir``, loaded once per path in this process (None: it has none)."""
    cache = current_app.extensions.setdefault("rail_scorers", {})
    with _scorer_lock:
        if reward_dir not in cache:
            try:
                cache[reward_dir] = CriteriaScorer.load(reward_dir)
            except Exception:  # a broken reward model must not take the chat down: the rules still apply
                current_app.logger.exception("loading the cost head of %s failed", reward_dir)
                cache[reward_dir] = None
        return cache[reward_dir]


def reward_dir_of(version_id: int) -> str | None:
    """The reward model of a served version's training run (as webapp.experiments.metrics reads it)."""
    version = db.session.get(ModelVersion, version_id)
    stored = (version.metrics or {}).get("reward_model_path") if version is not None else None
    path = resolve(stored) if stored else None
    return str(path) if path and (path / "config.json").is_file() else None


def rail_for(route: Route) -> Rail | None:
    """The rail for an answer of ``route``'s version; None when the rail is off."""
    cfg = current_app.config
    if not cfg["RLHF_RAIL_ENABLED"]:
        return None
    risk = None
    reward_dir = reward_dir_of(route.version_id)
    scorer = _scorer(reward_dir) if reward_dir else None
    if scorer is not None:
        def risk(history, text, scorer=scorer):
            return scorer.flag_risk([list(history)], [text])[0]
    policy = RailPolicy(action=cfg["RLHF_RAIL_ACTION"], attempts=int(cfg["RLHF_RAIL_REGENERATE_ATTEMPTS"]),
                    refusal=cfg["RLHF_RAIL_REFUSAL_TEXT"])
    return Rail(_compiled(rule_specs()), policy, risk, float(cfg["RLHF_RAIL_COST_THRESHOLD"]))


def record_interventions(blocks: Sequence[Block], *, message_id: int | None, user_id: int | None,
                         conversation_id: int | None, version_id: int | None) -> None:
    """Store the answer's interventions (committed with the caller's transaction)."""
    for block in blocks:
        db.session.add(RailIntervention(message_id=message_id, user_id=user_id, conversation_id=conversation_id,
                                        reason=block.reason[:500], kind=block.kind, action=block.action,
                                        attempt=block.attempt, blocked_text=block.text, model_version_id=version_id))
