"""The app's settings: one typed, validated object (:class:`Settings`), built once at start-up.

Sources, each overriding the one before: the defaults (fields.py) < ``instance/config.py`` (plain
Python, upper-case names) < ``instance/config.toml`` < environment variables < the dict given to
``create_app(config)``. Every value is parsed to its field's type and range-checked; a value the
app cannot use stops it with a one-line error naming the setting and where it came from.

The training settings are ``rlhf.settings.CycleSettings`` itself: every field of it (and of the
stage dataclasses in it) is settable the same way, as ``[training]`` / ``[training.policy]``
tables in config.toml, ``TRAINING = {"policy": {...}}`` in config.py, or
``RLHF_TRAINING_POLICY_LORA_R``-style environment variables; the most used ones also have short
names (``RLHF_PPO_EPISODES``, ``RLHF_LORA``, ...). ``flask --app webapp settings`` prints every
effective value and its source; the admin dashboard's Settings page shows the same.

The modules, by role: ``fields`` (the definitions), ``specs`` (every setting as one flat spec),
``sources`` (reading, merging and checking the sources; the Flask config), ``secret_key`` (the
generated cookie-signing key) and ``documentation`` (the effective values as shown, the configuration
tables of docs/configuration.md). The names below are the ones the rest of the app and the tests import.
"""
from __future__ import annotations

from webapp.core.settings.documentation import effective, markdown_tables
from webapp.core.settings.fields import ASSETS, ROOT, Settings
from webapp.core.settings.sources import ConfigError, build_config, current_settings, resolve
from webapp.core.settings.specs import ALL_SETTINGS

__all__ = ["ALL_SETTINGS", "ASSETS", "ROOT", "ConfigError", "Settings", "build_config", "current_settings",
           "effective", "markdown_tables", "resolve"]
