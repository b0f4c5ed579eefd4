"""Poisoning benchmark: can a share of accounts steer the model, or the verdict, the wrong way?

For each shipped preference and each attacker share of accounts, with the defences on and off
(side by side, the same seeds): a fresh instance with the embedded model, the real production
server on a loopback port with the scheduler inside, and

1. feedback -- honest simulated users rate by the preference (thumbs, stars, corrections,
   regenerations, compare votes); attacker accounts rate the opposite way with three times an
   honest user's volume and write corrections in the opposite style (``ATTACK_STYLE``). At 25 %
   of accounts they send about half of all events. The cycle's budget is 400 events in all.
2. training -- the scheduler runs rl-train when the budget is in; the run records what the
   defences removed or down-weighted (``feedback_counts["trust"]``).
3. judgement -- honest-preference satisfaction of the parent and of the candidate on 200
   held-out questions (the same sampling for both, Wilson intervals, two-proportion test), and
   the run's reward model on honest held-out pairs (an answer in the preferred style against one
   in the attack style, to the same question).
4. the verdict -- when the gate passed the candidate, the monitor starts an experiment; honest
   users chat and thumb by the preference, attacker accounts thumb up what looks like their
   style and down the rest; primary metric thumbs-up rate. The monitor's decision is reported
   (promote / retire / still waiting after the experiment's users).

Defences off means: ``RLHF_TRAINING_TRUST_ENABLED=0`` (every rating weighs the same in training)
and ``RLHF_AB_USER_CAP=0`` (every thumb counts in the verdict, however many one user sends).

    .venv/bin/python benchmarks/poisoning.py [--preference polite concise detailed]
        [--shares 0.1 0.25 0.4] [--defences on off] [--json FILE] [--markdown FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.closed_loop import db_state, server_env, wait_for  # noqa: E402
from rlhf.data import corpus  # noqa: E402
from rlhf.sim.preferences import preference  # noqa: E402
from rlhf.sim.users import Behaviour, SimulatedUser, prompt_set  # noqa: E402
from tests.support.app import make_app, register_model  # noqa: E402
from tests.support.live_server import LiveServer  # noqa: E402
from tests.support.models import cached_model  # noqa: E402
from webapp.core.extensions import db  # noqa: E402
from webapp.core.instance_paths import resolve  # noqa: E402
from webapp.core.models import ModelVersion, TrainingRun  # noqa: E402
from webapp.experiments import sample_stats  # noqa: E402

BUDGET = 400  # feedback events in the cycle, honest and attacker together
VOLUME = 3  # an attacker account asks this many times as many questions as an honest user
QUESTIONS_PER_HONEST_USER = 3
ATTACK_STYLE = {"polite": "rude", "concise": "rambling", "detailed": "terse"}
EVAL_QUESTIONS = 200  # held-out questions the parent and the candidate answer
EXPERIMENT_USERS = 400  # users (honest and attacker, in the same shares) during the experiment


class Attacker(SimulatedUser):
    """An account that wants the opposite of the honest users: it rates by 1 - the preference,
    and its corrections are written in the opposite style."""

    def __post_init__(self) -> None:
        super().__post_init__()
        honest = self.judge
        self.judge = lambda question, answer: 1.0 - honest(question, answer)

    def ideal_answer(self, question: str) -> str:
        topic = corpus.topic_of(question) or self.rng.choice(corpus.TOPICS)
        task = next((t for t in topic.tasks if t.phrase in question.lower()), None)
        return corpus.make_answer(self.rng, ATTACK_STYLE[self.preference], topic, task)


def attacker_behaviour() -> Behaviour:
    # rates everything, corrects more often, never notices noise
    return Behaviour(noise=0.0, rate_prob=1.0, correction_prob=0.4, regenerate_prob=0.3, compare_prob=0.15)


def accounts(share: float, n: int, seed: int) -> list[bool]:
    """``n`` accounts, ``share`` of them attackers (True), spread evenly so that every prefix
    holds the share (the phase stops at its budget, wherever that falls), in an order that
    depends on ``seed`` only through where the first attacker falls."""
    offset = random.Random(seed).random()
    return [int((i + 1) * share + offset) > int(i * share + offset) for i in range(n)]


def feedback_phase(url: str, pref: str, share: float, seed: int) -> dict[str, int]:
    """Honest users and attackers take turns until the budget is in; events per side."""
    prompts = prompt_set(120, seed=3)
    events = {"honest": 0, "attacker": 0}
    users = {"honest": 0, "attacker": 0}
    i = 0
    for bad in accounts(share, 10_000, seed):
        if sum(events.values()) >= BUDGET:
            break
        side = "attacker" if bad else "honest"
        cls, behaviour = (Attacker, attacker_behaviour()) if bad else (SimulatedUser, Behaviour())
        user = cls(url, pref, seed=seed * 100_000 + i, behaviour=behaviour)
        users[side] += 1
        for _ in range(QUESTIONS_PER_HONEST_USER * (VOLUME if bad else 1)):
            if sum(events.values()) >= BUDGET:
                break
            for inter in user.ask(prompts[(i * 7 + users[side]) % len(prompts)]):
                events[side] += inter.events
            i += 1
    return {"honest_events": events["honest"], "attacker_events": events["attacker"],
            "honest_users": users["honest"], "attacker_users": users["attacker"]}


def _version_dirs(instance: Path, run_id: int) -> tuple[tuple[str | None, str | None, str | None], dict | None,
                                                      list[str] | None]:
    """(parent path, candidate path, reward model path) of a run, its trust summary, and the gate's
    reasons (empty when it passed)."""
    app = make_app(instance)
    with app.app_context():
        run = db.session.get(TrainingRun, run_id)
        version = db.session.get(ModelVersion, run.version_id) if run and run.version_id else None
        parent = db.session.get(ModelVersion, version.parent_id) if version and version.parent_id else None
        rm = (run.metrics or {}).get("reward_model_path") if run else None
        rm = str(resolve(rm)) if rm else None
        trust = (run.feedback_counts or {}).get("trust") if run else None
        gate = ((run.metrics or {}).get("evaluation") or {}).get("reasons") if run else None
        paths = (parent.location if parent else None, version.location if version else None, rm)
        db.session.remove()
    return paths, trust, gate


def satisfaction(model_dir: str, pref: str, questions: list[str], seed: int = 7) -> list[bool]:
    """Answers of the model at ``model_dir`` to ``questions`` (sampled as the server samples),
    judged by the honest preference."""
    import torch

    from rlhf.models.chat_format import render_prompt
    from rlhf.models.loading import load_causal_lm

    judge = preference(pref)
    model, tok = load_causal_lm(model_dir, "cpu")
    torch.manual_seed(seed)
    out: list[bool] = []
    for start in range(0, len(questions), 16):
        batch = questions[start:start + 16]
        texts = [render_prompt(tok, [{"role": "user", "content": q}]) for q in batch]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=64, do_sample=True, temperature=0.8, top_p=1.0, top_k=0,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        width = enc["input_ids"].shape[1]
        for q, ids in zip(batch, gen[:, width:]):
            answer = tok.decode(ids, skip_special_tokens=True).split("\nUser:")[0].strip()
            out.append(judge(q, answer) >= 0.5)
    return out


def reward_accuracy(rm_dir: str, pref: str, questions: list[str], seed: int = 11) -> float:
    """The reward model's accuracy on honest held-out pairs: an answer in the preferred style
    (one the preference accepts) against one in the attack style, to the same question."""
    from rlhf.reward.scoring import load_reward_model, reward_texts, score_texts

    rng, judge = random.Random(seed), preference(pref)
    model, tok = load_reward_model(rm_dir)
    chosen, rejected = [], []
    for q in questions:
        topic = corpus.topic_of(q) or rng.choice(corpus.TOPICS)
        task = next((t for t in topic.tasks if t.phrase in q.lower()), None)
        good = next((a for a in (corpus.make_answer(rng, "helpful", topic, task) for _ in range(20))
                     if judge(q, a) >= 0.5), None)
        bad = corpus.make_answer(rng, ATTACK_STYLE[pref], topic, task)
        if good is None or judge(q, bad) >= 0.5:
            continue
        history = [{"role": "user", "content": q}]
        chosen += reward_texts(tok, [history], [good])
        rejected += reward_texts(tok, [history], [bad])
    c, r = score_texts(model, tok, chosen), score_texts(model, tok, rejected)
    return sum(x > y for x, y in zip(c, r)) / max(1, len(c))


def experiment_phase(url: str, instance: Path, pref: str, share: float, seed: int) -> str:
    """Users chat while the experiment runs; attackers thumb by their own taste. The monitor's
    decision, or "wait" when it has not decided after the users."""
    exp = wait_for(lambda: next((e for e in db_state(instance)[1] if e[1] == "running"), None), 300)
    if not exp:
        return "no experiment started"
    held_out = prompt_set(200, seed=99)
    for i, bad in enumerate(accounts(share, EXPERIMENT_USERS, seed + 1)):
        cls, behaviour = (Attacker, attacker_behaviour()) if bad else (SimulatedUser, Behaviour(compare_prob=0.0))
        user = cls(url, pref, seed=seed * 100_000 + 50_000 + i, behaviour=behaviour)
        for k in range(VOLUME if bad else 1):
            user.ask(held_out[(i + k) % len(held_out)])
        done = next((e for e in db_state(instance)[1] if e[0] == exp[0] and e[1] != "running"), None)
        if done:
            return done[2] or "ended"
    done = wait_for(lambda: next((e for e in db_state(instance)[1] if e[0] == exp[0] and e[1] != "running"), None),
                    15)
    return (done[2] or "ended") if done else "wait"


def run_scenario(pref: str, share: float, defences: bool, model_dir: Path, seed: int,
                 extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    instance = Path(tempfile.mkdtemp(prefix=f"poison-{pref}-{share}-{'on' if defences else 'off'}-")) / "instance"
    register_model(make_app(instance), model_dir)
    env = server_env() | {"RLHF_RETRAIN_MIN_FEEDBACK": str(BUDGET), "RLHF_PRIMARY_METRIC": "thumbs_up_rate",
                          "RLHF_AB_MIN_SAMPLE": "30"}
    if not defences:
        env |= {"RLHF_TRAINING_TRUST_ENABLED": "0", "RLHF_AB_USER_CAP": "0"}
    env |= extra_env or {}
    server = LiveServer(instance, env=env)
    result: dict[str, Any] = {"preference": pref, "attacker_share_of_accounts": share, "defences": defences,
                              "settings": extra_env or {}}
    try:
        result |= feedback_phase(server.url, pref, share, seed)
        total = result["honest_events"] + result["attacker_events"]
        result["attacker_share_of_events"] = result["attacker_events"] / total if total else None
        run = wait_for(lambda: (r := db_state(instance)[0]) and r[-1][1] in ("succeeded", "failed") and r[-1], 900)
        result["run"] = {"status": run[1], "decision": run[3]} if run else {"status": "no run"}
        if run and run[1] == "succeeded":
            (parent, candidate, rm), trust, gate = _version_dirs(instance, run[0])
            result["trust"] = {"rules": (trust or {}).get("rules"), "applied": (trust or {}).get("applied")}
            result["gate_reasons"] = gate
            questions = prompt_set(EVAL_QUESTIONS, seed=99)
            c, v = satisfaction(parent, pref, questions), satisfaction(candidate, pref, questions)
            est_c, est_v = sample_stats.wilson(sum(c), len(c)), sample_stats.wilson(sum(v), len(v))
            cmp_ = sample_stats.compare_proportions((sum(c), len(c)), (sum(v), len(v)))
            result["parent"] = {"share": est_c.value, "ci": [est_c.low, est_c.high], "n": len(c)}
            result["candidate"] = {"share": est_v.value, "ci": [est_v.low, est_v.high], "n": len(v)}
            result["p_value"] = cmp_.p_value
            result["reward_model_honest_accuracy"] = reward_accuracy(rm, pref, questions) if rm else None
            result["monitor"] = (experiment_phase(server.url, instance, pref, share, seed)
                                 if run[3] == "candidate" else "no experiment (gate rejected)")
        else:
            result["monitor"] = "no candidate"
    finally:
        server.stop()
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    return result


def _share(arm: dict | None) -> str:
    if not arm or arm.get("share") is None:
        return "–"
    return f"{arm['share']:.1%} [{arm['ci'][0]:.1%}, {arm['ci'][1]:.1%}]"


def _rules(trust: dict | None) -> str:
    rules = (trust or {}).get("rules") or {}
    parts = [f"{name} {int(r.get('raters', 0))} raters / {int(r.get('rows', 0))} rows" for name, r in rules.items()
             if r.get("raters")]
    return "; ".join(parts) or "–"


def markdown(results: list[dict]) -> str:
    lines = ["| preference | attacker accounts | attacker events | defences | removed / down-weighted | "
             "RM acc. (honest pairs) | gate | parent satisfied | candidate satisfied | p | monitor | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        acc, p = r.get("reward_model_honest_accuracy"), r.get("p_value")
        share = r.get("attacker_share_of_events")
        lines.append(" | ".join([
            f"| {r['preference']}", f"{r['attacker_share_of_accounts']:.0%}", f"{share:.0%}" if share is not None
            else "–", "on" if r["defences"] else "off", _rules(r.get("trust")) if r["defences"] else "–",
            f"{acc:.2f}" if acc is not None else "–", str((r.get("run") or {}).get("decision")),
            _share(r.get("parent")), _share(r.get("candidate")), f"{p:.2g}" if p is not None else "–",
            str(r.get("monitor")), f"{r['wall_s']:.0f} |"]))
    return "\n".join(lines)


def main() -> None:
    global BUDGET, EVAL_QUESTIONS, EXPERIMENT_USERS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preference", nargs="+", default=["polite", "concise", "detailed"], choices=sorted(ATTACK_STYLE))
    ap.add_argument("--shares", nargs="+", type=float, default=[0.1, 0.25, 0.4])
    ap.add_argument("--defences", nargs="+", choices=["on", "off"], default=["on", "off"])
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--budget", type=int, default=BUDGET, help="feedback events in the cycle (smoke runs: fewer)")
    ap.add_argument("--eval-questions", type=int, default=EVAL_QUESTIONS)
    ap.add_argument("--experiment-users", type=int, default=EXPERIMENT_USERS)
    ap.add_argument("--env", nargs="*", default=[], metavar="KEY=VALUE",
                    help="settings for the server (e.g. RLHF_TRAINING_TRUST_MAX_MULTIPLE_OF_MEDIAN=1)")
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    BUDGET, EVAL_QUESTIONS, EXPERIMENT_USERS = args.budget, args.eval_questions, args.experiment_users
    model_dir = cached_model("default")
    results = []
    for pref in args.preference:
        for share in args.shares:
            for mode in args.defences:
                res = run_scenario(pref, share, mode == "on", model_dir, args.seed,
                                   dict(item.split("=", 1) for item in args.env))
                results.append(res)
                print(json.dumps(res, default=str), flush=True)
                if args.json:
                    args.json.write_text(json.dumps(results, indent=2, default=str))
    table = markdown(results)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")


if __name__ == "__main__":
    main()
