"""Server settings sized to the active model: a setting of ``rlhf.models.size_settings.LARGE_DEPLOYMENT``
the operator did not set (settings file, environment, ``create_app``) takes its large-model value while
the active version has at least ``LARGE_PARAMETERS`` parameters, and its configured default otherwise.
Training settings are sized per run instead (webapp.training.runner), to the run's parent."""
from __future__ import annotations

from typing import Any

from flask import current_app

from rlhf.models import registry, size_settings
from webapp.core.models import active_version


def active_model_is_large() -> bool:
    """Whether the active version (its base's, for an adapter) has ``LARGE_PARAMETERS`` or more parameters."""
    version = active_version()
    if version is None or not registry.is_complete(version.location):
        return False
    return size_settings.is_large(size_settings.parameter_count(version.location))


def sized_setting(name: str) -> Any:
    """The value of the server setting ``name`` (``retrain_min_feedback``) for the active model."""
    value = current_app.config[f"RLHF_{name.upper()}"]
    large = size_settings.LARGE_DEPLOYMENT
    if name not in large or name in current_app.config.get("RLHF_SETTING_SOURCES", {}):
        return value
    return large[name] if active_model_is_large() else value
