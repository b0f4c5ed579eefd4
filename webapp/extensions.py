"""Flask extension singletons, bound to the app in ``create_app``."""
from __future__ import annotations

from flask_limiter import Limiter
from flask_limiter.util import get_remote_address
from flask_login import LoginManager
from flask_sqlalchemy import SQLAlchemy
from flask_wtf.csrf import CSRFProtect
from sqlalchemy.orm import DeclarativeBase


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)
csrf = CSRFProtect()
login_manager = LoginManager()
# Limits are declared per route from configuration; storage is per process (memory://) unless
# RLHF_RATELIMIT_STORAGE points at a shared store (e.g. redis://) for multi-worker deployments.
limiter = Limiter(key_func=get_remote_address, default_limits=[], headers_enabled=True)
