"""Zoo ablations: where a preference's signal is lost, stage by stage, without a server.

For each preference of the zoo (rlhf.sim.preferences.ZOO) and each *variant* (a change to the cycle's
settings), offline simulated users (rlhf.sim.users.simulate_records) rate answers the
embedded model really sampled for the closed loop's training questions, until ``--events``
feedback events; one training cycle runs on that feedback (rlhf.cycle.run_cycle, the gate
included). Then, on 200 held-out questions no rating user asked:

- **reward model**: its AUC against the ground truth on the parent's answers (does it generalize
  from few pairs?), and the satisfied share of the best of 4 parent answers by its score (what a
  policy that followed it perfectly, within the parent's own answers, would reach);
- **policy**: the satisfied share of the candidate's answers against the parent's (two-proportion
  test), and the gate's verdict.

A reward model with a high AUC and a policy that does not move locates the loss in the policy stage.

``--questions N``: the deployment shape instead (rlhf.sim.questions.deployment_questions): the
rating users ask only N fixed questions, and the parent and the candidate are judged on 12 answers
to each of the same N questions (what that deployment's users will ask next).

    .venv/bin/python benchmarks/zoo_ablation.py [--preference brief on_topic] [--variant ppo online_dpo]
        [--events 200] [--questions 16] [--json FILE]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

from benchmarks.closed_loop import auc  # noqa: E402
from rlhf.cycle import run_cycle  # noqa: E402
from rlhf.data.records import ConversationRecord  # noqa: E402
from rlhf.models import sampling  # noqa: E402
from rlhf.models.loading import load_causal_lm  # noqa: E402
from rlhf.reward.scoring import load_reward_model, reward_texts, score_texts  # noqa: E402
from rlhf.settings import CycleSettings, EvalSettings  # noqa: E402
from rlhf.sim.preferences import ZOO, preference  # noqa: E402
from rlhf.sim.questions import deployment_questions  # noqa: E402
from rlhf.sim.users import Behaviour, prompt_set, simulate_records  # noqa: E402
from tests.support.models import cached_model  # noqa: E402
from webapp.experiments.sample_stats import compare_proportions, wilson  # noqa: E402


def _set(settings: CycleSettings, **changes: Any) -> CycleSettings:
    """``settings`` with dotted fields changed: ``_set(s, **{"policy.kl_coef": 0.1})``."""
    for key, value in changes.items():
        *path, name = key.split(".")
        parents = [settings]
        for part in path:
            parents.append(getattr(parents[-1], part))
        new = dataclasses.replace(parents[-1], **{name: value})
        for parent, part in zip(reversed(parents[:-1]), reversed(path)):
            new = dataclasses.replace(parent, **{part: new})
        settings = new
    return settings


VARIANTS: dict[str, dict[str, Any]] = {
    "ppo": {},
    "ppo_same_prompt_only": {"data.max_rated_pairs_per_answer": 0, "data.mismatched_pairs_per_answer": 0},
    "ppo_no_mismatched": {"data.mismatched_pairs_per_answer": 0},
    "ppo_mismatched3": {"data.mismatched_pairs_per_answer": 3},
    "ppo_rm_e10": {"reward.epochs": 10.0},
    "ppo_mismatched3_rm_e10": {"data.mismatched_pairs_per_answer": 3, "reward.epochs": 10.0},
    "ppo_kl0.01": {"policy.kl_coef": 0.01},
    "ppo_2x_episodes": {"policy.episodes": 1024},
    "rloo": {"algorithm": "rloo"},
    "dpo": {"algorithm": "dpo"},
    "iterative_dpo": {"algorithm": "iterative_dpo"},
    "kto_lr1e-4": {"algorithm": "kto", "policy.epochs": 4.0, "policy.learning_rate": 1e-4},
    "dpo_lr1e-4": {"algorithm": "dpo", "policy.epochs": 4.0, "policy.learning_rate": 1e-4},
    "iterative_dpo_e8": {"algorithm": "iterative_dpo", "policy.epochs": 8.0},
    "iterative_dpo_lr1e-4": {"algorithm": "iterative_dpo", "policy.epochs": 4.0, "policy.learning_rate": 1e-4},
}


def add_variant(name: str, changes: dict[str, Any]) -> None:
    VARIANTS[name] = changes


def sample_answers(model_dir: Path, questions: list[str], per_question: int, seed: int) -> dict[str, list[str]]:
    """``per_question`` answers of the model to each question, sampled as the gate samples."""
    model, tok = load_causal_lm(model_dir)
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in questions for _ in range(per_question)]
    torch.manual_seed(seed)
    answers = sampling.sample_answers(model, tok, texts, EvalSettings())[0]
    return {q: answers[i * per_question:(i + 1) * per_question] for i, q in enumerate(questions)}


def events_of(conv: ConversationRecord) -> int:
    """Feedback events in a conversation (a rating, a flag, a vote: one each)."""
    return sum(1 for m in conv.messages if m.feedback is not None) + len(conv.comparisons)


def feedback(pref: str, pool: dict[str, list[str]], budget: int, seed: int) -> list[ConversationRecord]:
    """Offline users' conversations, in arrival order, up to ``budget`` feedback events; each answer
    is one the model sampled for that question (a regenerate draws another)."""
    def answer(rng: random.Random, question: str) -> str:
        return rng.choice(pool[question])

    records, _ = simulate_records([(300, 3, pref, Behaviour())], seed=seed, questions=list(pool), answers=answer)
    out, events = [], 0
    for conv in records:
        if events >= budget:
            break
        out.append(conv)
        events += events_of(conv)
    return out


def reward_scores(reward_dir: str | Path, items: list[tuple[str, str]]) -> list[float]:
    """The reward model's score of each (question, answer), rendered as it was trained and as the
    gate scores answers (rlhf.reward.scoring.reward_texts)."""
    model, tok = load_reward_model(reward_dir)
    texts = reward_texts(tok, [[{"role": "user", "content": q}] for q, _ in items], [a for _, a in items])
    with torch.no_grad():
        return score_texts(model, tok, texts)


def reward_diagnostics(reward_dir: Path, judge: Callable[[str, str], float],
                       parent4: dict[str, list[str]]) -> dict[str, Any]:
    items = [(q, a) for q, answers in parent4.items() for a in answers]
    scores = reward_scores(reward_dir, items)
    labels = [judge(q, a) >= 0.5 for q, a in items]
    best, k = [], 0
    for q, answers in parent4.items():
        chunk = scores[k:k + len(answers)]
        best.append(judge(q, answers[max(range(len(answers)), key=chunk.__getitem__)]) >= 0.5)
        k += len(answers)
    value = auc(scores, labels)
    return {"auc": None if value is None else round(value, 3),
            "best_of_4_share": round(sum(best) / len(best), 3),
            "parent_share_of_4": round(sum(labels) / len(labels), 3)}


def share(values: list[bool]) -> dict[str, Any]:
    est = wilson(sum(values), len(values))
    return {"share": round(est.value, 4), "ci": [round(est.low, 4), round(est.high, 4)], "n": len(values)}


def run(pref: str, variant: str, model_dir: Path, pool: dict[str, list[str]], held_out: list[str],
        parent1: dict[str, list[str]], parent4: dict[str, list[str]], events: int, seed: int) -> dict[str, Any]:
    judge = preference(pref)
    records = feedback(pref, pool, events, seed)
    settings = _set(CycleSettings(), **VARIANTS[variant])
    work = Path(tempfile.mkdtemp(prefix=f"zoo-{pref}-{variant}-"))
    t0 = time.perf_counter()
    try:
        result = run_cycle(records, model_dir, work / "reward", work / "policy", settings)
        took = time.perf_counter() - t0
        cand = sample_answers(work / "policy", held_out, len(next(iter(parent1.values()))), seed=4321)
        diag = reward_diagnostics(work / "reward", judge, parent4)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    par = [judge(q, a) >= 0.5 for q in held_out for a in parent1[q]]
    can = [judge(q, a) >= 0.5 for q in held_out for a in cand[q]]
    cmp_ = compare_proportions((sum(par), len(par)), (sum(can), len(can)))
    ev = result.evaluation
    return {"preference": pref, "variant": variant, "events": sum(map(events_of, records)),
            "pairs": result.counts["pairs"], "rm_heldout_accuracy": result.reward.get("heldout_accuracy"),
            "rm": diag, "parent": share(par), "candidate": share(can), "p_value": cmp_.p_value,
            "win": bool(cmp_.p_value < 0.05 and sum(can) > sum(par)),
            "gate": ev.get("verdict"), "gate_passed": ev.get("passed"), "gate_reasons": ev.get("reasons"),
            "kl": ev.get("kl_from_parent"),
            "policy": {k: v for k, v in result.policy.items() if k not in ("constraint",)},
            "cycle_s": round(took, 1), "examples": [cand[q][0] for q in held_out[:3]],
            "gate_evidence": {k: ev.get(k) for k in ("heldout", "judge", "evidence_p")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preference", nargs="+", default=list(ZOO))
    ap.add_argument("--variant", nargs="+", default=["ppo"])
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--questions", type=int, help="the deployment shape: users ask only this many fixed questions")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.questions is not None and not 1 <= args.questions <= 48:
        ap.error(f"--questions must be between 1 and 48, got {args.questions}")
    unknown = [v for v in args.variant if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    torch.set_num_threads(2)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    model_dir = cached_model("default")
    if args.questions:  # few questions, asked again and again; judged on the same ones
        train_q = held_out = deployment_questions(args.questions)
        per_question, judged_each = 24, 12
    else:
        train_q, held_out = prompt_set(120, seed=3), prompt_set(200, seed=99)
        per_question, judged_each = 8, 1
    pool = sample_answers(model_dir, train_q, per_question, seed=1)
    parent4 = sample_answers(model_dir, held_out, 4, seed=2)
    parent1 = sample_answers(model_dir, held_out, judged_each, seed=4321)
    rows = []
    for pref in args.preference:
        for variant in args.variant:
            row = run(pref, variant, model_dir, pool, held_out, parent1, parent4, args.events, args.seed)
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("preference", "variant", "events", "rm_heldout_accuracy", "rm",
                                                  "parent", "candidate", "p_value", "win", "gate", "kl", "cycle_s")}),
                  flush=True)
    out = {"rows": rows, "events": args.events, "seed": args.seed, "questions": args.questions,
           "wall_s": round(time.perf_counter() - t0, 1),
           "load_average": {"start": [round(x, 2) for x in load0], "end": [round(x, 2) for x in os.getloadavg()]}}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    for r in rows:
        print(f"{r['preference']:13s} {r['variant']:16s} RM auc {r['rm']['auc']} bo4 {r['rm']['best_of_4_share']} "
              f"parent {r['parent']['share']:.2f} cand {r['candidate']['share']:.2f} p={r['p_value']:.2g} "
              f"gate {r['gate']} kl {r['kl']}")


if __name__ == "__main__":
    main()
