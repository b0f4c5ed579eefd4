"""Flask extension singletons, bound to the app in ``create_app``."""
from __future__ import annotations

from flask_limiter import Limiter
from flask_limiter.util import get_remote_address
from flask_login import LoginManager
from flask_sqlalchemy import SQLAlchemy
from flask_wtf.csrf import CSRFProtect
from sqlalchemy import BigInteger, Integer
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.orm import registry as make_registry


class Base(DeclarativeBase):
    # Ids (and every other ``Mapped[int]``) are 64-bit on every database, as SQLite's INTEGER
    # is: BIGINT elsewhere (PostgreSQL's INTEGER stops at 2**31-1, and a lookup of a larger id
    # fails inside the driver), INTEGER on SQLite so that the primary key stays the rowid.
    registry = make_registry(type_annotation_map={int: BigInteger().with_variant(Integer(), "sqlite")})


db = SQLAlchemy(model_class=Base)
csrf = CSRFProtect()
login_manager = LoginManager()
# Limits are declared per route from configuration; storage is per process (memory://) unless
# RLHF_RATELIMIT_STORAGE points at a shared store (e.g. redis://) for multi-worker deployments.
limiter = Limiter(key_func=get_remote_address, default_limits=[], headers_enabled=True)
