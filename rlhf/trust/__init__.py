"""Rater trust: how much each rater's feedback counts, estimated from agreement between raters
(docs/rater-trust.md). :func:`assess_raters` (rlhf.trust.assess) runs the method step by step.

The public names are loaded on first use, so that importing rlhf.trust.vocabulary (as the web
app's models do at start-up) does not import numpy and scipy.
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

from rlhf.trust.vocabulary import RATER_STATUSES, RULES, TRUST_LEVELS

_EXPORTS = {  # name -> the module of rlhf.trust that defines it
    "assess_raters": "assess", "trusted_bundle": "assess",
    "RaterInfo": "crowd",
    "RaterReport": "report", "TrustResult": "report",
    "water_fill": "rater_weights",
    "JOINED_SOURCES": "row_weights", "row_weight": "row_weights", "apply_trust": "row_weights",
    "normalized_weights": "row_weights", "resample_by_weight": "row_weights",
}
__all__ = ["RATER_STATUSES", "RULES", "TRUST_LEVELS", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
