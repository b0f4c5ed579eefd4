"""Which model answers a user, and the app's pool of loaded models."""
from __future__ import annotations

from dataclasses import dataclass

from flask import current_app
from werkzeug.exceptions import ServiceUnavailable

from rlhf.generation import GenerationSettings, LoadedModel, ModelPool
from rlhf.loading import ModelLoadError

from .bootstrap import active_version
from .models import ModelVersion, User


@dataclass(frozen=True)
class Route:
    """The version that serves a user's next answer, and the experiment arm it came from.
    Plain values only, so a route stays valid after the request's database session ends."""

    version_id: int
    version_name: str
    version_path: str
    experiment_id: int | None = None
    arm: str | None = None

    @classmethod
    def of(cls, version: ModelVersion, experiment_id: int | None = None, arm: str | None = None) -> "Route":
        return cls(version.id, version.name, version.path, experiment_id, arm)


def model_pool() -> ModelPool:
    app = current_app._get_current_object()
    pool = app.extensions.get("model_pool")
    if pool is None:
        pool = app.extensions["model_pool"] = ModelPool(app.config["RLHF_DEVICE"])
    return pool


def route_for(user: User) -> Route:
    """Everyone gets the active version unless an experiment routes them elsewhere."""
    from .experiments import experiment_route  # A/B routing lives with the experiments

    route = experiment_route(user)
    if route is not None:
        return route
    version = active_version()
    if version is None:
        raise ServiceUnavailable("No model is ready yet: the base model is still being built. "
                                 "Try again in a minute.")
    return Route.of(version)


def load(route: Route) -> LoadedModel:
    try:
        return model_pool().get(route.version_path, route.version_name)
    except ModelLoadError as exc:
        current_app.logger.error("model version %s cannot be loaded: %s", route.version_name, exc)
        raise ServiceUnavailable(f"Model version {route.version_name} cannot be loaded right now.") from exc


def generation_settings() -> GenerationSettings:
    cfg = current_app.config
    return GenerationSettings(max_new_tokens=int(cfg["RLHF_MAX_NEW_TOKENS"]),
                              temperature=float(cfg["RLHF_TEMPERATURE"]), top_p=float(cfg["RLHF_TOP_P"]))
