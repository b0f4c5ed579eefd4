"""The settings as people see them: every effective value with its source, secrets and the
credentials inside any URL masked (the admin's Settings page, ``flask --app webapp settings``), and
the configuration tables of docs/configuration.md (``flask --app webapp settings --markdown``;
tests/webapp/core/test_config.py keeps that page equal to them)."""
from __future__ import annotations

from typing import Any

from webapp.core.display import mask_url
from webapp.core.settings.fields import Settings
from webapp.core.settings.specs import ALL_SETTINGS, APP_SETTINGS, TRAINING_SETTINGS, Spec


def _mask(spec: Spec, value: Any) -> Any:
    if value is None:
        return value
    if not spec.meta.get("secret"):  # an ordinary URL may still carry a user and password, or a token
        return mask_url(value) if isinstance(value, str) and "://" in value else value
    if spec.name in ("secret_key", "inference_api_key", "openwebui_api_key"):
        return "********"
    from sqlalchemy.engine import make_url  # URLs: only their password is secret

    try:
        return make_url(str(value)).render_as_string(hide_password=True)
    except Exception:
        return "********"


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def effective(settings: Settings, sources: dict[str, str]) -> list[dict[str, Any]]:
    """Every setting with its effective value (secrets masked) and where it came from, grouped."""
    rows = []
    for spec in ALL_SETTINGS:
        obj: Any = settings
        for part in spec.name.split("."):
            obj = getattr(obj, part)
        rows.append({"name": spec.name, "env": spec.env, "aliases": list(spec.envs[1:]), "group": spec.group,
                     "value": _shown(_mask(spec, obj)),
                     "default": spec.meta.get("shown_default") or _shown(spec.default),
                     "source": sources.get(spec.name, "default"), "doc": spec.meta.get("doc", "")})
    return rows


def markdown_tables() -> str:
    """The configuration tables of docs/configuration.md, generated from the definitions (a test keeps them equal)."""
    def table(specs: list[Spec]) -> list[str]:
        lines = ["| Variable | Default | Meaning |", "|---|---|---|"]
        for spec in specs:
            names = " or ".join(f"`{e}`" for e in spec.envs)
            default = spec.meta.get("shown_default") or f"`{_shown(spec.default)}`"
            doc = spec.meta.get("doc", "")
            if spec.meta.get("choices"):
                doc += " (" + ", ".join(f"`{c}`" for c in spec.meta["choices"]) + ")"
            lines.append(f"| {names} | {default} | {doc} |")
        return lines

    out = ["| Variable | Default | Meaning |", "|---|---|---|",
           "| `RLHF_INSTANCE_DIR` | `./instance` | runtime folder: database, secret key, model store, config files |"]
    out += table(APP_SETTINGS)[2:]
    out += ["", "Training settings (`[training]` tables in config.toml; the environment variable is the dotted "
            "name in capitals, `training.policy.lora_r` -> `RLHF_TRAINING_POLICY_LORA_R`):", ""]
    out += table(TRAINING_SETTINGS)
    return "\n".join(out) + "\n"
