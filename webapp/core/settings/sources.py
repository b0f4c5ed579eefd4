"""Reading and merging the sources, each overriding the one before: the defaults < ``instance/
config.py`` < ``instance/config.toml`` < environment variables < ``create_app(config)``. Each value
is parsed to its setting's type and checked (:class:`ConfigError` names the setting and its
source); the result is the :class:`Settings` object and the Flask config built from it."""
from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import click
from flask import current_app

from rlhf.policy.algorithms import check_settings
from webapp.core.private_files import private_dir
from webapp.core.settings.fields import INSTALLED_FROM_WHEEL, ROOT, Settings
from webapp.core.settings.secret_key import is_published, secret_key
from webapp.core.settings.specs import ALL_SETTINGS, APP_SETTINGS, BY_FLAT_NAME, BY_NAME, TRAINING_SETTINGS, Spec


class ConfigError(click.ClickException, ValueError):
    """A setting has a value the app cannot use; the message names the setting and its source.

    Being a ClickException, it ends any ``flask`` command with a one-line "Error: ..." and
    exit code 1 instead of a traceback.
    """


# Flask settings the app fixes (still overridable by create_app(config), e.g. in tests).
FLASK_FIXED: dict[str, Any] = {"SESSION_COOKIE_HTTPONLY": True, "SESSION_COOKIE_SAMESITE": "Lax",
                               "WTF_CSRF_TIME_LIMIT": None,  # the token lives as long as the session
                               "JSON_SORT_KEYS": False}


# ---------------------------------------------------------------------------- parsing

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse(spec: Spec, raw: Any) -> Any:
    """``raw`` (a string from the environment, or a value from a file) as the setting's type;
    raises ValueError with the problem."""
    typ, optional = spec.type, False
    if get_origin(typ) in (Union, getattr(__import__("types"), "UnionType", Union)):
        args = [a for a in get_args(typ) if a is not type(None)]
        typ, optional = args[0], len(args) < len(get_args(typ))
    if isinstance(raw, str):
        text = raw.strip()
        if optional and text.lower() in ("", "none", "null"):
            return None
    if raw is None:
        if optional:
            return None
        raise ValueError("must be set")
    if typ is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, int) and raw in (0, 1):
            return bool(raw)
        if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
            return raw.strip().lower() in _TRUE
        raise ValueError("is not a boolean (use 1/0, true/false, yes/no, on/off)")
    if typ is int:
        if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
            raise ValueError("is not a whole number")
        try:
            return int(raw.strip() if isinstance(raw, str) else raw)
        except (TypeError, ValueError):
            raise ValueError("is not a whole number") from None
    if typ is float:
        if isinstance(raw, bool):
            raise ValueError("is not a number")
        try:
            return float(raw.strip() if isinstance(raw, str) else raw)
        except (TypeError, ValueError):
            raise ValueError("is not a number") from None
    if typ is str:
        if not isinstance(raw, str):
            raise ValueError("is not a text value")
        return raw
    raise TypeError(f"setting {spec.name} has an unsupported type {typ!r}")


# ---------------------------------------------------------------------------- the sources

def instance_dir(overrides: dict[str, Any] | None = None) -> Path:
    """The instance folder: create_app(config) > $RLHF_INSTANCE_DIR > <repo>/instance (./instance when
    installed from a wheel: site-packages is no place for it)."""
    default = Path("instance") if INSTALLED_FROM_WHEEL else ROOT / "instance"
    raw = (overrides or {}).get("INSTANCE_DIR") or os.environ.get("RLHF_INSTANCE_DIR") or default
    return Path(raw).expanduser().resolve()


def _flatten(table: dict[str, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in table.items():
        name = f"{prefix}.{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, name))
        else:
            out[name] = v
    return out


def _entries(values: dict[str, Any], source: str, passthrough: dict[str, Any]) -> list[tuple[Spec, str, Any, str]]:
    """(spec, name as written, raw value, source) for each setting in a mapping of upper-case names
    (plus a nested ``TRAINING`` table); other upper-case Flask keys go to ``passthrough``."""
    out = []
    for name, raw in values.items():
        if name in ("TRAINING", "training"):
            if not isinstance(raw, dict):
                raise ConfigError(f"{name} ({source}) must be a table of training settings")
            for dotted, value in _flatten(raw, "training").items():
                spec = BY_NAME.get(dotted)
                if spec is None or spec.key is not None:
                    raise ConfigError(f"{dotted} ({source}) is not a setting (see `flask --app webapp settings`)")
                out.append((spec, dotted, value, source))
        elif name in BY_FLAT_NAME:
            out.append((BY_FLAT_NAME[name], name, raw, source))
        elif name.startswith("RLHF_"):
            raise ConfigError(f"{name} ({source}) is not a setting (see `flask --app webapp settings`)")
        elif name.isupper():
            passthrough[name] = raw  # a Flask or extension setting the app does not define itself
    return out


def load_instance_py(path: Path) -> dict[str, Any]:
    """Upper-case names from ``instance/config.py`` (plain Python, like Flask's from_pyfile)."""
    if not path.is_file():
        return {}
    namespace: dict[str, Any] = {"__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102 - operator-owned file
    return {k: v for k, v in namespace.items() if k.isupper()}


def load_instance_toml(path: Path) -> dict[str, Any]:
    """``instance/config.toml``: upper-case names at the top, training settings in ``[training]``
    tables (``[training.policy]`` ...); a lower-case top-level key is the setting's own name."""
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    out: dict[str, Any] = {}
    for k, v in data.items():
        if k == "training":
            out["TRAINING"] = v
        elif k in BY_NAME and BY_NAME[k].key:
            out[BY_NAME[k].key] = v
        elif isinstance(v, dict):
            raise ConfigError(f"[{k}] ({path}) is not a settings table (only [training] and its parts are)")
        else:
            out[k if k.isupper() else "RLHF_" + k.upper()] = v
    return out



@dataclass(frozen=True)
class Resolved:
    settings: Settings
    sources: dict[str, str]  # setting name -> where its value came from
    passthrough: dict[str, Any]  # other Flask keys from the files and create_app(config)


def _with_dotted(obj: Any, dotted: list[str], value: Any) -> Any:
    if len(dotted) == 1:
        return dataclasses.replace(obj, **{dotted[0]: value})
    return dataclasses.replace(obj, **{dotted[0]: _with_dotted(getattr(obj, dotted[0]), dotted[1:], value)})


def resolve(overrides: dict[str, Any] | None = None) -> Resolved:
    """Every setting from its sources, parsed and checked (ConfigError on the first bad one)."""
    overrides = dict(overrides or {})
    folder = private_dir(instance_dir(overrides))  # 0700 when new (webapp/core/private_files.py)
    passthrough: dict[str, Any] = {}
    entries = _entries(load_instance_py(folder / "config.py"), str(folder / "config.py"), passthrough)
    entries += _entries(load_instance_toml(folder / "config.toml"), str(folder / "config.toml"), passthrough)
    for spec in ALL_SETTINGS:
        for env in spec.envs:  # the setting's own name (last) wins over its short alias
            if env in os.environ:
                entries.append((spec, env, os.environ[env], "environment"))
    entries += _entries({k: v for k, v in overrides.items() if k != "INSTANCE_DIR"}, "create_app(config)", passthrough)

    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    written_as: dict[str, str] = {}
    for spec, written, raw, source in entries:
        try:
            value = _parse(spec, raw)
        except ValueError as exc:
            raise ConfigError(f"{written}={raw!r} ({source}) {exc}") from None
        problem = spec.problem(value)
        if problem:
            raise ConfigError(f"{written}={raw!r} ({source}) {problem}")
        values[spec.name], sources[spec.name], written_as[spec.name] = value, source, written

    app_values = {s.name: values[s.name] for s in APP_SETTINGS if s.name in values}
    settings = Settings(**app_values)
    training = dataclasses.replace(settings.training, device=settings.device)
    for spec in TRAINING_SETTINGS:
        if spec.name in values:
            training = _with_dotted(training, spec.name.split(".")[1:], values[spec.name])
    try:
        check_settings(training)
    except ValueError as exc:
        where = sorted({sources[n] for n in sources if n.startswith("training.")}) or ["defaults"]
        raise ConfigError(f"training settings ({', '.join(where)}): {exc}") from None
    if settings.secret_key is None:
        settings = dataclasses.replace(settings, secret_key=secret_key(folder))
        sources["secret_key"] = str(folder / "secret_key")
        if is_published(settings.secret_key):
            raise ConfigError(f"the secret key in {folder / 'secret_key'} was published (it is in this project's "
                              "git history) and would let anyone sign cookies: delete the file and start again "
                              "for a new key (everyone signs in again)")
    elif is_published(settings.secret_key):
        raise ConfigError(f"{written_as['secret_key']} ({sources['secret_key']}) is a secret key that was published "
                          "(it is in this project's git history) and would let anyone sign cookies: set a key of "
                          "your own (python3 -c 'import secrets; print(secrets.token_hex(32))')")
    if settings.database_url is None:
        settings = dataclasses.replace(settings, database_url=f"sqlite:///{folder / 'rlhf.db'}")
    settings = dataclasses.replace(settings, training=training)
    passthrough.update({k: v for k, v in overrides.items() if k not in BY_FLAT_NAME and k != "TRAINING"})
    passthrough["INSTANCE_DIR"] = str(folder)
    return Resolved(settings, sources, passthrough)


def flask_config(settings: Settings) -> dict[str, Any]:
    """The flat keys Flask, its extensions and the app's modules read from ``app.config``."""
    cfg = {spec.key: getattr(settings, spec.name) for spec in APP_SETTINGS}
    cfg["RLHF_SETTINGS"] = settings
    return cfg


def build_config(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Flask config: fixed Flask settings, every setting's flat key, ``RLHF_SETTINGS`` (the
    :class:`Settings` object), ``RLHF_SETTING_SOURCES`` and the pass-through keys."""
    resolved = resolve(overrides)
    cfg: dict[str, Any] = {**FLASK_FIXED, **flask_config(resolved.settings),
                           "RLHF_SETTING_SOURCES": resolved.sources}
    cfg.update(resolved.passthrough)
    cfg.setdefault("MODEL_STORE", str(Path(cfg["INSTANCE_DIR"]) / "models"))
    cfg.setdefault("MAX_CONTENT_LENGTH", int(resolved.settings.max_request_mb * 1024 * 1024))
    return cfg


def current_settings() -> Settings:
    """The running app's settings."""
    return current_app.config["RLHF_SETTINGS"]
