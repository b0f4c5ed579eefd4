"""The reward model's per-criterion heads (rlhf.data.criteria): one score head per named criterion on the
reward model's backbone, trained with it by TRL's RewardTrainer, and what PPO, the gate, the
experiment metrics and the output rail read from them.

Why one backbone with several heads (ArmoRM-style) rather than separate models: the criteria are
learned from few labels (flags and chips are rarer than thumbs), and sharing the backbone the
helpfulness pairs train lets each small head read features the larger signal already shaped; one
forward pass scores every criterion, so the output rail and PPO's cost pay for one model, not five.

Files beside the reward model (``reward_dir``, still an ordinary one-output
``AutoModelForSequenceClassification`` that PPO, RLOO and the metrics load as before):

* ``criteria_heads.safetensors``: ``weight`` (heads x hidden), row 0 the helpfulness head;
* ``criteria.json``: the heads' names, the weights that made the saved scalar head, the safety
  head's calibration (``flag_risk``) and each head's held-out accuracy.

The saved scalar head is ``helpfulness + sum(weight_c * head_c)`` over the chip criteria (the
heads are linear and bias-free, so the combination is exact). SAFETY is not in it: PPO treats it
as a constraint (``LagrangianReward``), not a weight.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from rlhf.data.criteria import SAFETY
from rlhf.reward.scoring import load_reward_model, reading_length, reward_texts

HEADS_FILE = "criteria_heads.safetensors"
INFO_FILE = "criteria.json"
HELPFULNESS = "helpfulness"


def set_scalar_head(model: Any, weight: torch.Tensor) -> None:
    """Give ``model`` a one-output, bias-free score head with ``weight`` (1 x hidden)."""
    old = model.score
    weight = weight.reshape(1, -1)
    head = torch.nn.Linear(weight.shape[1], 1, bias=False, device=old.weight.device, dtype=old.weight.dtype)
    head.weight.data.copy_(weight)
    model.score = head
    model.config.num_labels = 1


def fit_calibration(costly: list[float], safe: list[float]) -> dict[str, float] | None:
    """Platt scaling: ``p = sigmoid(a * score + b)`` fitted by logistic regression of the labels
    (costly 1, safe 0) on the safety head's scores; None without both kinds."""
    if not costly or not safe:
        return None
    x = torch.tensor(costly + safe, dtype=torch.float64)
    y = torch.tensor([1.0] * len(costly) + [0.0] * len(safe), dtype=torch.float64)
    params = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([params], max_iter=100, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        logits = params[0] * x + params[1]
        # a weak prior keeps the slope finite when the labels are perfectly separated
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y) + 1e-3 * params[0] ** 2
        loss.backward()
        return loss

    opt.step(closure)
    a, b = (float(v) for v in params.detach())
    return {"a": round(a, 6), "b": round(b, 6), "labels": len(costly) + len(safe), "costly": len(costly)}


def read_info(reward_dir: str | Path) -> dict[str, Any] | None:
    path = Path(reward_dir) / INFO_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def read_heads(reward_dir: str | Path) -> tuple[list[str], torch.Tensor] | None:
    """(names, weight) of ``reward_dir``'s criterion heads; None when it has none."""
    info = read_info(reward_dir)
    if info is None or not (Path(reward_dir) / HEADS_FILE).is_file():
        return None
    from safetensors.torch import load_file

    return list(info["heads"]), load_file(str(Path(reward_dir) / HEADS_FILE))["weight"]


class CriteriaScorer:
    """Scores answers on each named criterion a reward model was trained on (``names``)."""

    def __init__(self, model: Any, tokenizer: Any, names: list[str], info: dict[str, Any]) -> None:
        self.model, self.tokenizer, self.names, self.info = model, tokenizer, tuple(names), info

    @classmethod
    def load(cls, reward_dir: str | Path, device: Any = "cpu") -> "CriteriaScorer | None":
        """The scorer of ``reward_dir``'s criterion heads; None when it has none."""
        heads = read_heads(reward_dir)
        if heads is None:
            return None

        names, weight = heads
        model, tok = load_reward_model(reward_dir, device)
        head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        head.weight.data.copy_(weight)
        model.score = head.to(device=next(model.parameters()).device, dtype=next(model.parameters()).dtype)
        model.config.num_labels = len(names)
        return cls(model.eval(), tok, names, read_info(reward_dir) or {})

    @property
    def has_safety(self) -> bool:
        return SAFETY in self.names

    @torch.no_grad()
    def score_texts(self, texts: list[str], batch_size: int = 32) -> dict[str, list[float]]:
        """Each criterion's score of each full rendered text (see ``rlhf.reward.scoring.reward_texts``)."""

        rows: list[list[float]] = []
        device = next(self.model.parameters()).device
        side, self.tokenizer.truncation_side = self.tokenizer.truncation_side, "left"
        try:
            for i in range(0, len(texts), batch_size):
                enc = self.tokenizer(texts[i:i + batch_size], return_tensors="pt", padding=True, truncation=True,
                                     max_length=reading_length(self.model), add_special_tokens=False).to(device)
                rows.extend(self.model(**enc).logits.float().tolist())
        finally:
            self.tokenizer.truncation_side = side
        return {name: [r[k] for r in rows] for k, name in enumerate(self.names)}

    def score_answers(self, histories: list[list[dict[str, str]]], answers: list[str]) -> dict[str, list[float]]:
        """Each criterion's score of each answer (given the conversation before it)."""
        return self.score_texts(reward_texts(self.tokenizer, histories, answers))

    def risk_of_costs(self, costs: list[float]) -> list[float]:
        """Safety-head scores as calibrated probabilities of being flagged (or marked rude)."""
        cal = (self.info.get("calibration") or {}).get(SAFETY)
        if cal is None:  # uncalibrated: the logistic of the raw score
            return [1 / (1 + math.exp(-c)) for c in costs]
        return [1 / (1 + math.exp(-max(-60.0, min(60.0, cal["a"] * c + cal["b"])))) for c in costs]

    def flag_risk(self, histories: list[list[dict[str, str]]], answers: list[str]) -> list[float]:
        """For each answer, the probability (0..1) that a user would flag it or mark it rude, from the
        safety head calibrated on the training labels."""
        if not self.has_safety:
            raise ValueError("this reward model has no safety head (too few flags or rude chips when it was trained)")
        return self.risk_of_costs(self.score_answers(histories, answers)[SAFETY])


# ---------------------------------------------------------------------------- PPO's cost constraint

class CostConstraint:
    """Safety as a constraint in TRL's PPO (Safe-RLHF's Lagrangian, by dual ascent as in PPO-Lagrangian):
    each rollout's reward is ``reward - lambda * (cost - limit)``, and after every PPO batch
    ``lambda = max(0, lambda + lr * (mean cost - limit))``. The cost is the safety head's calibrated
    probability that users would flag the answer (``criteria.json``), read at the answer's last token
    from the reward model's backbone like the reward. The limit is the parent's expected cost: the
    mean over answers the parent samples on the training prompts before any update
    (``measure_parent``), plus a tolerance.

    Why a probability rather than the head's logit: the constraint is then "the expected flag rate
    does not rise", and the trade the policy may make is the right one. In logits a polite answer
    (far below zero) made an answer without pleasantries look as costly as a rude one made it look
    safe, so the cheapest way to hold the mean cost was back to pleasantries, and a preference that
    asked for directness could not be learned without rudeness (benchmarks/safety_constraint.py).
    Subtracting the limit changes no preference between answers; it keeps the rewards' scale.

    It replaces the reward model's score head in place (TRL's ``get_reward`` reads ``model.score`` on
    the backbone's last hidden states) and reads the attention mask from a hook on the backbone to
    find each sequence's last token, as ``get_reward`` does."""

    def __init__(self, reward_model: Any, cost_weight: torch.Tensor, lambda_init: float, lr: float,
                 tolerance: float, calibration: dict[str, float] | None = None) -> None:
        self.lam, self.lr, self.tolerance = float(lambda_init), float(lr), float(tolerance)
        self.a, self.b = ((calibration or {}).get("a", 1.0), (calibration or {}).get("b", 0.0))
        self.reward_model = reward_model
        self.limit: float | None = None
        self.parent: dict[str, float] = {}
        self.trajectory: list[dict[str, float]] = []
        self._costs: list[torch.Tensor] = []
        self._rewards: list[torch.Tensor] = []
        self._mask: torch.Tensor | None = None
        scalar = reward_model.score.weight.detach()
        both = torch.nn.Linear(scalar.shape[1], 2, bias=False, device=scalar.device, dtype=scalar.dtype)
        both.weight.data.copy_(torch.cat([scalar.reshape(1, -1), cost_weight.reshape(1, -1).to(scalar)], 0))
        reward_model.score = _ConstrainedScore(both, self)
        backbone = getattr(reward_model, reward_model.base_model_prefix)
        backbone.register_forward_pre_hook(self._remember_mask, with_kwargs=True)

    def _remember_mask(self, module: Any, args: tuple, kwargs: dict) -> None:
        self._mask = kwargs.get("attention_mask")

    def cost(self, logits: torch.Tensor) -> torch.Tensor:
        """The safety head's logits as calibrated probabilities of a flag."""
        return torch.sigmoid(self.a * logits + self.b)

    def record(self, reward: torch.Tensor, cost: torch.Tensor) -> None:
        """The rollouts' rewards and costs at each sequence's last attended token; without a
        measured limit, the first batch (the parent's answers) sets it."""
        if self._mask is None or reward.dim() != 2:
            return
        mask = self._mask.bool()
        last = mask.shape[1] - 1 - mask.flip(1).float().argmax(1)
        rows = torch.arange(reward.shape[0], device=reward.device)
        self._rewards.append(reward[rows, last].detach().float().cpu())
        self._costs.append(cost[rows, last].detach().float().cpu())
        if self.limit is None:
            self.limit = float(self._costs[-1].mean()) + self.tolerance

    @torch.no_grad()
    def measure_parent(self, policy: Any, queries: list[list[int]], pad_token_id: int, stop_token_id: int | None,
                       response_length: int, temperature: float, samples: int = 64, batch_size: int = 16) -> None:
        """The limit: the parent's expected cost on ``samples`` answers it samples to the training
        prompts (token ids, cycled), as PPO samples them (TRL's generation and truncation)."""
        from transformers import GenerationConfig
        from trl.experimental.ppo.ppo_trainer import batch_generation, truncate_response
        from trl.experimental.utils import get_reward

        if not queries:
            return
        config = GenerationConfig(max_new_tokens=response_length, temperature=temperature + 1e-7, top_k=0,
                                  top_p=1.0, do_sample=True)
        device = next(policy.parameters()).device
        picked = [queries[i % len(queries)] for i in range(samples)]
        self._costs.clear()
        self._rewards.clear()
        self.limit = 0.0  # not None: measuring does not set it from the first batch
        for i in range(0, len(picked), batch_size):
            chunk = picked[i:i + batch_size]
            width = max(map(len, chunk))
            query = torch.tensor([[pad_token_id] * (width - len(q)) + q for q in chunk], device=device)
            query_response, _ = batch_generation(policy, query, batch_size, pad_token_id, config)
            response = query_response[:, width:]
            if stop_token_id is not None:
                response = truncate_response(stop_token_id, pad_token_id, response)
            get_reward(self.reward_model, torch.cat((query, response), 1), pad_token_id, width)
        costs, rewards = torch.cat(self._costs), torch.cat(self._rewards)
        self._costs.clear()
        self._rewards.clear()
        self.parent = {"cost": round(float(costs.mean()), 4), "reward": round(float(rewards.mean()), 4),
                       "samples": len(costs)}
        self.limit = float(costs.mean()) + self.tolerance

    def step(self) -> dict[str, float]:
        """After a PPO batch: its mean cost and reward, the multiplier it was scored with, the update."""
        if not self._costs:
            return {}
        cost = float(torch.cat(self._costs).mean())
        reward = float(torch.cat(self._rewards).mean())
        self._costs.clear()
        self._rewards.clear()
        used = self.lam
        self.lam = max(0.0, self.lam + self.lr * (cost - self.limit))
        point = {"safety/cost": round(cost, 4), "safety/cost_limit": round(self.limit, 4),
                 "safety/lambda": round(used, 4), "safety/reward": round(reward, 4)}
        self.trajectory.append(point)
        return point

    def summary(self) -> dict[str, Any]:
        t = self.trajectory
        if not t:
            return {}
        late = t[len(t) // 2:]  # the second half: where the policy settled
        return {"limit": t[0]["safety/cost_limit"], "parent": self.parent, "cost_first": t[0]["safety/cost"],
                "cost_last": t[-1]["safety/cost"],
                "cost_second_half": round(sum(p["safety/cost"] for p in late) / len(late), 4),
                "lambda_first": t[0]["safety/lambda"], "lambda_last": round(self.lam, 4),
                "lambda_max": round(max([p["safety/lambda"] for p in t] + [self.lam]), 4),
                "reward_first": t[0]["safety/reward"], "reward_last": t[-1]["safety/reward"],
                "batches": len(t), "trajectory": t}


class _ConstrainedScore(torch.nn.Module):
    def __init__(self, both: torch.nn.Linear, owner: CostConstraint) -> None:
        super().__init__()
        self.both = both
        self.owner = owner

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        both = self.both(hidden)
        reward, cost = both[..., 0], self.owner.cost(both[..., 1])
        self.owner.record(reward, cost)
        return (reward - self.owner.lam * (cost - (self.owner.limit or 0.0))).unsqueeze(-1)


def safety_calibration(reward_dir: str | Path) -> dict[str, float] | None:
    """The safety head's Platt calibration (``criteria.json``), None without one."""
    return ((read_info(reward_dir) or {}).get("calibration") or {}).get(SAFETY)


def cost_weight(reward_dir: str | Path) -> torch.Tensor | None:
    """The safety head's weight (1 x hidden) of ``reward_dir``'s criteria, None without one."""
    heads = read_heads(reward_dir)
    if heads is None or SAFETY not in heads[0]:
        return None
    names, weight = heads
    return weight[names.index(SAFETY)].reshape(1, -1)
