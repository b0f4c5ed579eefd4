"""Configuration: defaults < instance/config.py < environment variables < create_app(config).

Environment variables are the deployment interface (see README "Configuration"); each maps
to one config key below. Values from the environment are strings and are converted to the
type of the default.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import click
from limits import parse_many

ROOT = Path(__file__).resolve().parents[2]

DEFAULTS: dict[str, Any] = {
    # Database: any SQLAlchemy URL; default is SQLite in the instance folder.
    "SQLALCHEMY_DATABASE_URI": None,
    "SQLITE_BUSY_TIMEOUT_MS": 15000,
    # Models. "embedded" builds the project's own small GPT-2 (no internet needed); anything
    # else is a Hugging Face hub id or a local directory passed to from_pretrained.
    "RLHF_BASE_MODEL": "embedded",
    "RLHF_EMBEDDED_PRESET": "default",  # "micro" builds in seconds (tests)
    "RLHF_DEVICE": "auto",  # auto | cpu | cuda
    # Build the base model on first start when no active version exists.
    "RLHF_AUTO_INIT_MODEL": True,
    # Generation limits.
    "RLHF_MAX_NEW_TOKENS": 80,
    "RLHF_TEMPERATURE": 0.8,
    "RLHF_TOP_P": 0.95,
    "RLHF_MAX_MESSAGE_CHARS": 4000,
    # torch threads for answering in `serve` (0: torch's default, all cores). One worker thread per
    # model runs every answer as one batch; 1 is fastest for small models and on busy machines.
    "RLHF_INFERENCE_THREADS": 1,
    # Scheduler / continuous learning.
    # On by default: `serve` runs the retrain/monitor/housekeeping/watchdog jobs in its one process
    # (with several workers, set it to 0 and run `flask --app webapp scheduler` once, separately).
    "RLHF_SCHEDULER": True,
    "RLHF_RETRAIN_INTERVAL_SECONDS": 3600.0,
    "RLHF_RETRAIN_MIN_FEEDBACK": 50,  # new feedback events since the last successful run
    "RLHF_RETRAIN_ALGORITHM": "ppo",
    # torch threads of training processes (0: torch's default, all cores). 1 by default: on a small
    # machine shared with the web server, torch's threads spin-wait for each other under load.
    "RLHF_TRAIN_THREADS": 1,
    # Watchdog of training runs: a run without progress for RLHF_RUN_STALL_SECONDS, or running
    # longer than RLHF_RUN_MAX_SECONDS (0: a limit worked out from the data size), is stopped.
    "RLHF_RUN_STALL_SECONDS": 600.0,
    "RLHF_RUN_MAX_SECONDS": 0.0,
    "RLHF_WATCHDOG_INTERVAL_SECONDS": 30.0,
    "RLHF_MONITOR_INTERVAL_SECONDS": 60.0,
    "RLHF_HOUSEKEEPING_INTERVAL_SECONDS": 3600.0,
    "RLHF_PRIMARY_METRIC": "thumbs_up_rate",
    "RLHF_PROMOTE_ALPHA": 0.05,
    "RLHF_EXPERIMENT_MAX_HOURS": 72.0,
    "RLHF_EXPERIMENT_SPLIT": 0.5,
    "RLHF_RETAIN_RETIRED_VERSIONS": 3,
    # Training cycle (rl-train and the scheduler).
    "RLHF_PPO_EPISODES": 512,
    "RLHF_POLICY_LR": 3e-5,
    "RLHF_KL_COEF": 0.05,
    "RLHF_LORA": False,
    "RLHF_MIN_PAIRS": 8,
    "RLHF_GATE_MIN_REWARD_GAIN": 0.0,
    "RLHF_GATE_MAX_KL": 25.0,
    # Trainers also write TensorBoard event files to <instance>/runs/run-<id>/tensorboard
    # (needs the tensorboard package: pip install -e '.[tensorboard]').
    "RLHF_TENSORBOARD": False,
    # A/B experiments and admin.
    "RLHF_AB_MIN_SAMPLE": 30,  # per arm, before a metric is judged ("not enough data yet" below)
    "RLHF_COMPARE_RATE": 0.1,  # share of answers shown side by side while an experiment runs
    # Rate limits ("N per second|minute|hour|day", several joined with ";"). Chat (posting a
    # message, regenerate, compare) and feedback (feedback, compare votes) count per user and per
    # client address; the per-address limits are high because many users can share one address.
    "RLHF_LOGIN_RATE_LIMIT": "10 per minute",  # admin login attempts, per address and per username
    "RLHF_CHAT_RATE_LIMIT": "30 per minute",
    "RLHF_CHAT_RATE_LIMIT_PER_ADDRESS": "600 per minute",
    "RLHF_FEEDBACK_RATE_LIMIT": "120 per minute",
    "RLHF_FEEDBACK_RATE_LIMIT_PER_ADDRESS": "2400 per minute",
    "RATELIMIT_ENABLED": True,  # explicit per app: Flask-Limiter's one Limiter otherwise keeps the last app's value
    "RATELIMIT_STORAGE_URI": "memory://",
    # Cookies.
    "SESSION_COOKIE_HTTPONLY": True,
    "SESSION_COOKIE_SAMESITE": "Lax",
    "SESSION_COOKIE_SECURE": False,
    "WTF_CSRF_TIME_LIMIT": None,  # the token lives as long as the session
    "JSON_SORT_KEYS": False,
}

# Environment variable -> config key.
ENV_VARS: dict[str, str] = {
    "DATABASE_URL": "SQLALCHEMY_DATABASE_URI",
    "RLHF_SECRET_KEY": "SECRET_KEY",
    "RLHF_BASE_MODEL": "RLHF_BASE_MODEL",
    "RLHF_EMBEDDED_PRESET": "RLHF_EMBEDDED_PRESET",
    "RLHF_DEVICE": "RLHF_DEVICE",
    "RLHF_AUTO_INIT_MODEL": "RLHF_AUTO_INIT_MODEL",
    "RLHF_MAX_NEW_TOKENS": "RLHF_MAX_NEW_TOKENS",
    "RLHF_TEMPERATURE": "RLHF_TEMPERATURE",
    "RLHF_TOP_P": "RLHF_TOP_P",
    "RLHF_INFERENCE_THREADS": "RLHF_INFERENCE_THREADS",
    "RLHF_SCHEDULER": "RLHF_SCHEDULER",
    "RLHF_RETRAIN_INTERVAL_SECONDS": "RLHF_RETRAIN_INTERVAL_SECONDS",
    "RLHF_RETRAIN_MIN_FEEDBACK": "RLHF_RETRAIN_MIN_FEEDBACK",
    "RLHF_RETRAIN_ALGORITHM": "RLHF_RETRAIN_ALGORITHM",
    "RLHF_TRAIN_THREADS": "RLHF_TRAIN_THREADS",
    "RLHF_MONITOR_INTERVAL_SECONDS": "RLHF_MONITOR_INTERVAL_SECONDS",
    "RLHF_RUN_STALL_SECONDS": "RLHF_RUN_STALL_SECONDS",
    "RLHF_RUN_MAX_SECONDS": "RLHF_RUN_MAX_SECONDS",
    "RLHF_WATCHDOG_INTERVAL_SECONDS": "RLHF_WATCHDOG_INTERVAL_SECONDS",
    "RLHF_HOUSEKEEPING_INTERVAL_SECONDS": "RLHF_HOUSEKEEPING_INTERVAL_SECONDS",
    "RLHF_PRIMARY_METRIC": "RLHF_PRIMARY_METRIC",
    "RLHF_PROMOTE_ALPHA": "RLHF_PROMOTE_ALPHA",
    "RLHF_EXPERIMENT_MAX_HOURS": "RLHF_EXPERIMENT_MAX_HOURS",
    "RLHF_EXPERIMENT_SPLIT": "RLHF_EXPERIMENT_SPLIT",
    "RLHF_RETAIN_RETIRED_VERSIONS": "RLHF_RETAIN_RETIRED_VERSIONS",
    "RLHF_COOKIE_SECURE": "SESSION_COOKIE_SECURE",
    "RLHF_PPO_EPISODES": "RLHF_PPO_EPISODES",
    "RLHF_POLICY_LR": "RLHF_POLICY_LR",
    "RLHF_KL_COEF": "RLHF_KL_COEF",
    "RLHF_LORA": "RLHF_LORA",
    "RLHF_MIN_PAIRS": "RLHF_MIN_PAIRS",
    "RLHF_GATE_MIN_REWARD_GAIN": "RLHF_GATE_MIN_REWARD_GAIN",
    "RLHF_GATE_MAX_KL": "RLHF_GATE_MAX_KL",
    "RLHF_TENSORBOARD": "RLHF_TENSORBOARD",
    "RLHF_AB_MIN_SAMPLE": "RLHF_AB_MIN_SAMPLE",
    "RLHF_COMPARE_RATE": "RLHF_COMPARE_RATE",
    "RLHF_LOGIN_RATE_LIMIT": "RLHF_LOGIN_RATE_LIMIT",
    "RLHF_CHAT_RATE_LIMIT": "RLHF_CHAT_RATE_LIMIT",
    "RLHF_CHAT_RATE_LIMIT_PER_ADDRESS": "RLHF_CHAT_RATE_LIMIT_PER_ADDRESS",
    "RLHF_FEEDBACK_RATE_LIMIT": "RLHF_FEEDBACK_RATE_LIMIT",
    "RLHF_FEEDBACK_RATE_LIMIT_PER_ADDRESS": "RLHF_FEEDBACK_RATE_LIMIT_PER_ADDRESS",
    "RLHF_RATELIMIT_ENABLED": "RATELIMIT_ENABLED",
    "RLHF_RATELIMIT_STORAGE": "RATELIMIT_STORAGE_URI",
}

RATE_LIMIT_KEYS = ("RLHF_LOGIN_RATE_LIMIT", "RLHF_CHAT_RATE_LIMIT", "RLHF_CHAT_RATE_LIMIT_PER_ADDRESS",
                   "RLHF_FEEDBACK_RATE_LIMIT", "RLHF_FEEDBACK_RATE_LIMIT_PER_ADDRESS")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class ConfigError(click.ClickException, ValueError):
    """A setting has a value the app cannot use; the message names the setting.

    Being a ClickException, it ends any ``flask`` command with a one-line "Error: ..." and
    exit code 1 instead of a traceback.
    """


def _convert(name: str, raw: str, default: Any) -> Any:
    if isinstance(default, bool):
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ConfigError(f"{name}={raw!r} is not a boolean (use 1/0, true/false)")
    try:
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a {type(default).__name__}") from None
    return raw


def instance_dir(overrides: dict[str, Any] | None = None) -> Path:
    """The instance folder: create_app(config) > $RLHF_INSTANCE_DIR > <repo>/instance."""
    raw = (overrides or {}).get("INSTANCE_DIR") or os.environ.get("RLHF_INSTANCE_DIR") or ROOT / "instance"
    return Path(raw).expanduser().resolve()


def load_instance_file(path: Path) -> dict[str, Any]:
    """Upper-case names from ``instance/config.py`` (plain Python, like Flask's from_pyfile)."""
    if not path.is_file():
        return {}
    namespace: dict[str, Any] = {"__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102 - operator-owned file
    return {k: v for k, v in namespace.items() if k.isupper()}


def secret_key(folder: Path) -> str:
    """The instance's secret key, generated once (0600) and reused on every start."""
    path = folder / "secret_key"
    if path.is_file():
        key = path.read_text().strip()
        if key:
            return key
    key = secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    return key


def build_config(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Resolve every setting in precedence order. Creates the instance folder if needed."""
    overrides = dict(overrides or {})
    folder = instance_dir(overrides)
    folder.mkdir(parents=True, exist_ok=True)
    cfg: dict[str, Any] = dict(DEFAULTS)
    cfg.update(load_instance_file(folder / "config.py"))
    for env_name, key in ENV_VARS.items():
        if env_name in os.environ:
            cfg[key] = _convert(env_name, os.environ[env_name], DEFAULTS.get(key, ""))
    cfg.update(overrides)
    cfg["INSTANCE_DIR"] = str(folder)
    cfg.setdefault("MODEL_STORE", str(folder / "models"))
    if not cfg.get("SQLALCHEMY_DATABASE_URI"):
        cfg["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{folder / 'rlhf.db'}"
    if not cfg.get("SECRET_KEY"):
        cfg["SECRET_KEY"] = secret_key(folder)
    for key in RATE_LIMIT_KEYS:
        try:
            parse_many(str(cfg[key]))
        except ValueError:
            raise ConfigError(f"{key}={cfg[key]!r} is not a rate limit (e.g. '30 per minute' or "
                              "'30 per minute; 500 per day')") from None
    for key in ("RLHF_RUN_STALL_SECONDS", "RLHF_WATCHDOG_INTERVAL_SECONDS"):
        if not float(cfg[key]) > 0:
            raise ConfigError(f"{key}={cfg[key]!r} must be a number of seconds above 0")
    if float(cfg["RLHF_RUN_MAX_SECONDS"]) < 0:
        raise ConfigError(f"RLHF_RUN_MAX_SECONDS={cfg['RLHF_RUN_MAX_SECONDS']!r} must be >= 0 (0: from the data size)")
    if cfg["RLHF_DEVICE"] not in ("auto", "cpu", "cuda") and not str(cfg["RLHF_DEVICE"]).startswith("cuda:"):
        raise ConfigError(f"RLHF_DEVICE={cfg['RLHF_DEVICE']!r} must be auto, cpu or cuda")
    return cfg
