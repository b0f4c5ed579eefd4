"""Every setting as one flat :class:`Spec`: its dotted name, Flask key, environment variables,
type, default and checks. The app's own fields come from :class:`Settings`; the training ones are
walked from ``rlhf.settings.CycleSettings`` (``training.policy.lora_r`` ...). The lookups by name
here are what the sources are read with."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, get_type_hints

from rlhf.settings import CycleSettings, problem_with
from webapp.core.settings.fields import Settings


@dataclass(frozen=True)
class Spec:
    """One setting: its dotted ``name`` (``max_new_tokens``, ``training.policy.lora_r``), Flask
    config ``key`` (app settings), environment variables (the first is its own name), type, default,
    meaning and checks."""

    name: str
    key: str | None
    envs: tuple[str, ...]
    type: Any
    default: Any
    meta: dict[str, Any]

    @property
    def env(self) -> str:
        return self.envs[0]

    @property
    def group(self) -> str:
        return self.meta.get("group") or "Training: " + (self.name.split(".")[1] if self.name.count(".") == 2
                                                         else "cycle")

    def problem(self, value: Any) -> str | None:
        check = self.meta.get("check")
        return (check(value) if check and value is not None else None) or problem_with(value, self.meta)


# Short names for the training settings operators change most (docs/configuration.md's first table).
TRAINING_ALIASES = {"RLHF_RETRAIN_ALGORITHM": "training.algorithm", "RLHF_PPO_EPISODES": "training.policy.episodes",
                    "RLHF_POLICY_LR": "training.policy.learning_rate", "RLHF_KL_COEF": "training.policy.kl_coef",
                    "RLHF_LORA": "training.policy.lora", "RLHF_MIN_PAIRS": "training.min_pairs",
                    "RLHF_GATE_MIN_REWARD_GAIN": "training.gate.min_reward_gain",
                    "RLHF_GATE_MAX_KL": "training.gate.max_kl",
                    "RLHF_SAFETY_CONSTRAINT": "training.criteria.constraint"}
_NOT_SETTABLE = {"training.device"}  # follows the app's device


def _specs() -> tuple[list[Spec], list[Spec]]:
    app: list[Spec] = []
    hints = get_type_hints(Settings)
    for f in dataclasses.fields(Settings):
        if f.name == "training":
            continue
        key = f.metadata.get("key") or f"RLHF_{f.name.upper()}"
        env = f.metadata.get("env") or f"RLHF_{f.name.upper()}"
        app.append(Spec(f.name, key, (env,), hints[f.name], f.default, dict(f.metadata)))
    aliases = {v: k for k, v in TRAINING_ALIASES.items()}
    training: list[Spec] = []

    def walk(cls: type, prefix: str) -> None:
        types = get_type_hints(cls)
        for f in dataclasses.fields(cls):
            name = f"{prefix}.{f.name}"
            if dataclasses.is_dataclass(types[f.name]):
                walk(types[f.name], name)
            elif name not in _NOT_SETTABLE:
                own = "RLHF_" + name.upper().replace(".", "_")
                envs = (aliases[name], own) if name in aliases else (own,)
                training.append(Spec(name, None, envs, types[f.name], f.default, dict(f.metadata)))

    walk(CycleSettings, "training")
    return app, training


APP_SETTINGS, TRAINING_SETTINGS = _specs()
ALL_SETTINGS = APP_SETTINGS + TRAINING_SETTINGS
BY_NAME = {s.name: s for s in ALL_SETTINGS}
BY_FLAT_NAME = {**{s.key: s for s in APP_SETTINGS}, **{e: s for s in ALL_SETTINGS for e in s.envs}}
