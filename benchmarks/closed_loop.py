"""Closed-loop benchmark: simulated users -> scheduled retraining -> experiment -> better answers.

For each preference function: a fresh instance with the embedded model, the real production
server on a loopback port with the scheduler inside (short intervals), and rounds of:

1. feedback phase -- rating users (thumbs, stars, corrections, regenerations, compare votes)
   chat until the cycle's feedback budget is reached (at most 400 events in all);
2. training        -- the scheduler notices the new feedback and runs rl-train in a child
   process; chat-only probe users keep chatting to measure latency while it trains;
3. experiment      -- the experiment monitor starts control-vs-candidate; evaluation users (50/50
   by hash) ask held-out questions and rate the answers as the rating users do (no side-by-side
   compares); every served answer is judged by the preference function (ground truth) and the
   arms are compared with a two-proportion test; the monitor concludes by the product's deployed
   policy and primary metric (``monitor_policy``: the server's own settings, none overridden here,
   so "promoted" is what an operator would see). Their ratings are feedback like any other: they
   count in the events, and the scheduler may start the next run from them while the experiment
   runs (the next cycle is then that run). An experiment the monitor has not concluded when the
   evaluation is done is stopped by the benchmark and recorded as "wait".

Stops after the first cycle whose variant satisfies the preference significantly more often
than the control (p < 0.05), or after 2 cycles.

    .venv/bin/python benchmarks/closed_loop.py [--preference polite concise detailed on_topic] [--markdown FILE]
    .venv/bin/python benchmarks/closed_loop.py --safety   # a preference in conflict with safety, constrained or not
    .venv/bin/python benchmarks/closed_loop.py --zoo      # the eight preferences of rlhf.sim.preferences.ZOO
    .venv/bin/python benchmarks/closed_loop.py --via openai   # every simulated user a client of /v1 instead
    .venv/bin/python benchmarks/deployment_shape.py --questions 16 --zoo   # the deployment shape: the same options

``--via openai``: the simulated users (raters, probes, evaluation users) use only the OpenAI-compatible
API, with a key made in the run's instance by ``flask --app webapp create-api-key``: chat completions
naming the user (``user``) and ``/v1/feedback`` by completion id (rlhf.sim.users.ApiUser; no
compare votes, the API has none). Their answers are looked up in the database by completion id.

With ``--zoo`` each preference also gets the reward model's AUC on the experiment's answers (the
scores the experiment's metrics table stored for its mean-reward row, against the users' ground truth:
held-out questions, answers of both arms) and the verdict against its budget: a win -- the monitor
promoted, and ground truth says significantly better -- within 400 events of the rating users, 2
cycles and 15 minutes.

One module because it is one experiment read top to bottom: the server, the simulated users, the
loop's phases and the report.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rlhf.sim.preferences import ZOO, rude  # noqa: E402
from rlhf.sim.users import ApiUser, Behaviour, Interaction, SimulatedUser, first_model, prompt_set  # noqa: E402
from tests.support.app import make_app, register_model  # noqa: E402
from tests.support.live_server import LiveServer  # noqa: E402
from tests.support.models import cached_model  # noqa: E402
from webapp.core.extensions import db  # noqa: E402
from webapp.core.models import AnswerScore, Experiment, Message, ModelVersion, TrainingRun  # noqa: E402
from webapp.experiments import sample_stats  # noqa: E402
from webapp.experiments.lifecycle import stop_experiment  # noqa: E402
from webapp.experiments.promotion import policy_from_config  # noqa: E402

FEEDBACK_BUDGET = (200, 400)  # cumulative feedback events allowed before cycle 1 and cycle 2
WALL_BUDGET_S = 900  # --zoo: a preference's whole run (feedback, training, experiment) on 2 cores
EVAL_PER_ARM = 250  # answers judged per arm by ground truth (the monitor decides by its own policy meanwhile)
# evaluation users rate as the rating users do, one answer per question (no side-by-side compare)
EVAL_BEHAVIOUR = Behaviour(compare_prob=0.0)


def server_env() -> dict[str, str]:
    """The server's settings: the scheduler's intervals shortened (minutes become seconds), and nothing
    of the promotion policy (primary metric, alpha, minimum sample, sequential tuning, user cap,
    guardrails): the monitor decides as deployed (``monitor_policy`` records what it was). Compares
    are off so that every evaluation answer is one arm's."""
    return {"RLHF_SCHEDULER": "1", "RLHF_RETRAIN_INTERVAL_SECONDS": "4", "RLHF_MONITOR_INTERVAL_SECONDS": "3",
            "RLHF_HOUSEKEEPING_INTERVAL_SECONDS": "300", "RLHF_RETRAIN_MIN_FEEDBACK": "150",
            "RLHF_COMPARE_RATE": "0", "RLHF_DEVICE": "cpu", "RLHF_RETRAIN_ALGORITHM": "ppo",
            # hundreds of simulated users from 127.0.0.1, as fast as the server answers: a load
            # test, not people, so the per-address rate limits are off
            "RLHF_RATELIMIT_ENABLED": "0"}


def monitor_policy(instance: Path, env: dict[str, str]) -> dict:
    """The promotion policy the run's server decides by, read as the server reads it (its settings with
    ``env`` on top: ``webapp.experiments.promotion.policy_from_config``), and its minimum sample."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        app = make_app(instance)
        policy = policy_from_config(app.config)
        return {"primary_metric": policy.primary_metric, "alpha": policy.alpha,
                "sequential_tuning": policy.sequential_tuning, "user_cap": policy.user_cap,
                "guardrail_alpha": policy.guardrail_alpha, "max_hours": policy.max_hours,
                "min_sample": int(app.config["RLHF_AB_MIN_SAMPLE"]),
                "compare_rate": float(app.config["RLHF_COMPARE_RATE"])}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def create_api_key(instance: Path, name: str = "closed-loop") -> str:
    """A /v1 key in the run's instance, made as an operator makes one (the command prints only the key)."""
    done = subprocess.run([sys.executable, "-m", "flask", "--app", "webapp", "create-api-key", name, "--client", name],
                          cwd=ROOT, env={**os.environ, "RLHF_INSTANCE_DIR": str(instance)}, capture_output=True,
                          text=True)
    if done.returncode != 0 or not done.stdout.strip().startswith("rlhf-"):
        raise RuntimeError(f"create-api-key failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


class Users:
    """The run's simulated users: visitors of the chat page (``via="chat"``) or clients of the /v1
    API (``via="openai"``, with a key of the run's instance)."""

    def __init__(self, url: str, preference: str, via: str = "chat", api_key: str | None = None) -> None:
        self.url, self.preference, self.via, self.api_key = url, preference, via, api_key
        self.model = first_model(url, api_key) if via == "openai" else None

    def new(self, seed: int, behaviour: Behaviour | None = None, rate: bool = True):
        kw = {"behaviour": behaviour} if behaviour is not None else {}
        if self.via == "openai":
            return ApiUser(self.url, self.api_key, self.preference, seed=seed, rate=rate, model=self.model, **kw)
        return SimulatedUser(self.url, self.preference, seed=seed, rate=rate, **kw)


class Probe(threading.Thread):
    """Chat-only users asking a question every ``think_s`` seconds; records (time, latency)."""

    def __init__(self, users: Users, seed: int, think_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.users, self.seed, self.think_s = users, seed, think_s
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        prompts = prompt_set(60, seed=self.seed)
        i = 0
        while not self.stop.is_set():
            user = self.users.new(self.seed * 1000 + i, rate=False)
            for inter in user.ask(prompts[i % len(prompts)]):
                self.samples.append((time.time(), inter.latency_s))
            i += 1
            self.stop.wait(self.think_s)


def p95(values: list[float]) -> float | None:
    return sample_stats.percentile(values, 95) if values else None


_APPS: dict[Path, object] = {}


def gate_record(evaluation: dict | None) -> dict | None:
    """What the gate decided a run's candidate on, kept in the results so a loss can be explained:
    its reasons, the evidence that carried the verdict, the held-out pairs' effect and the judge's gain."""
    if not evaluation:
        return None
    h, j = evaluation.get("heldout") or {}, evaluation.get("judge") or {}
    return {"reasons": evaluation.get("reasons"), "decided_by": evaluation.get("decided_by"),
            "judged_by": evaluation.get("judged_by"),
            "heldout": {k: h.get(k) for k in ("pairs", "wins", "losses", "p_value", "mean_margin", "margin_low",
                                              "effect_p")},
            "judge": {k: j.get(k) for k in ("trusted", "accuracy", "gain", "p_value", "prompts")} if j else None,
            "kl_from_parent": evaluation.get("kl_from_parent")}


def db_state(instance: Path):
    """(training runs, experiments) as plain tuples, read through one app per instance."""
    app = _APPS.setdefault(instance, make_app(instance))
    with app.app_context():
        runs = [(r.id, r.status, r.trigger, (r.metrics or {}).get("decision"),
                 (r.metrics or {}).get("reward_model", {}).get("heldout_accuracy"), r.started_at, r.finished_at,
                 (r.feedback_counts or {}).get("events"), (r.metrics or {}).get("version"),
                 gate_record((r.metrics or {}).get("evaluation")))
                for r in db.session.scalars(db.select(TrainingRun).order_by(TrainingRun.id))]
        exps = [(e.key, e.status, e.decision, e.variant_version.name, e.control_version.name)
                for e in db.session.scalars(db.select(Experiment).order_by(Experiment.id))]
        db.session.remove()
    return runs, exps


def stored_ids(instance: Path, interactions: list[Interaction]) -> list[int | None]:
    """Each answer's stored message id: given by the chat API, found by completion id for /v1 answers."""
    wanted = [i.completion_id for i in interactions if i.message_id is None and i.completion_id]
    found: dict[str, int] = {}
    if wanted:
        app = _APPS.setdefault(instance, make_app(instance))
        with app.app_context():
            found = dict(db.session.execute(db.select(Message.completion_id, Message.id)
                                            .where(Message.completion_id.in_(wanted))).all())
            db.session.remove()
    return [i.message_id if i.message_id is not None else found.get(i.completion_id) for i in interactions]


def concluded(instance: Path, key: str) -> tuple | None:
    """The experiment ``key`` once it is no longer running (its row), else None."""
    return next((e for e in db_state(instance)[1] if e[0] == key and e[1] != "running"), None)


def stop_unconcluded(instance: Path, key: str) -> str:
    """The monitor's decision on experiment ``key``; one it has not reached is stopped (so the next
    candidate's experiment can start) and recorded as "wait"."""
    done = wait_for(lambda: concluded(instance, key), 20)
    if done:
        return done[2] or done[1]
    app = _APPS.setdefault(instance, make_app(instance))
    with app.app_context():
        try:
            stop_experiment(key, actor="benchmark")
        except Exception:  # the monitor concluded it in between
            pass
        db.session.remove()
    done = concluded(instance, key)
    return "wait (no verdict from the monitor; stopped by the benchmark)" if not done or done[1] == "stopped" \
        else (done[2] or done[1])


def in_parallel(fn: Callable[[int], list[Interaction]], seeds: list[int]) -> list[list[Interaction]]:
    """``fn(seed)`` for each seed, at once (each a user of its own, on a thread): the server answers
    concurrent users as one batch, as it would a deployment's."""
    if len(seeds) == 1:
        return [fn(seeds[0])]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(seeds)) as pool:
        return list(pool.map(fn, seeds))


def evaluate_arms(instance: Path, users: "Users", exp: tuple, questions: list[str], seed0: int, per_arm: int,
                  deadline_s: float, concurrency: int = 1) -> dict:
    """Evaluation users (rating, ``EVAL_BEHAVIOUR``) ask ``questions`` in turn, ``concurrency`` at a
    time, until both arms have ``per_arm`` judged answers, or the monitor concluded and the arm still
    serving has them (after a promotion new users get the variant, after keep-control the control);
    the answers as (arm, satisfied, message id, question, answer), the feedback events they gave, the
    users."""
    control_name, variant_name = exp[4], exp[3]
    judged: list[tuple[str, bool, int, str, str]] = []
    count = {"control": 0, "variant": 0}
    events, i, deadline, ended = 0, 0, time.time() + deadline_s, False
    latencies: list[float] = []

    def one(n: int) -> list[Interaction]:
        return users.new(seed0 + n, EVAL_BEHAVIOUR).ask(questions[n % len(questions)])

    while time.time() < deadline and i < 6 * per_arm:
        if min(count.values()) >= per_arm or (ended and max(count.values()) >= per_arm):
            break
        batch = list(range(i, i + concurrency))
        for interactions in in_parallel(one, batch):
            ids = stored_ids(instance, interactions)
            versions = answered_by(instance, [mid for mid in ids if mid is not None])
            for inter, mid in zip(interactions, ids):
                events += inter.events
                arm = {control_name: "control", variant_name: "variant"}.get(versions.get(mid))
                if arm:
                    count[arm] += 1
                    judged.append((arm, inter.satisfaction >= 0.5, mid, inter.question, inter.answer))
                latencies.append(inter.latency_s)
        before, i = i, i + len(batch)
        if i // 10 > before // 10 and not ended:
            ended = concluded(instance, exp[0]) is not None
    return {"judged": judged, "events": events, "users": i, "latencies": latencies}


def answered_by(instance: Path, message_ids: list[int]) -> dict[int, str]:
    """The version that wrote each answer, read from the database: the chat API keeps arms
    blind, so a simulated user (like a real one) is never told."""
    app = _APPS.setdefault(instance, make_app(instance))
    with app.app_context():
        rows = db.session.execute(db.select(Message.id, ModelVersion.name)
                                  .join(ModelVersion, Message.model_version_id == ModelVersion.id)
                                  .where(Message.id.in_(message_ids))).all()
        db.session.remove()
    return dict(rows)


def auc(scores: list[float], labels: list[bool]) -> float | None:
    """Probability that a random satisfying answer scores above a random other one (ties: half)."""
    pos = [x for x, y in zip(scores, labels) if y]
    neg = [x for x, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return None
    return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))


def reward_auc(instance: Path, judged_ids: dict[int, bool]) -> dict | None:
    """The reward model's AUC on the experiment's answers: the scores the metrics table stored for its
    mean-reward row (one reward model's, not a criterion's) against the users' ground truth."""
    app = _APPS.setdefault(instance, make_app(instance))
    with app.app_context():
        rows = db.session.execute(db.select(AnswerScore.message_id, AnswerScore.score, AnswerScore.reward_model)
                                  .where(AnswerScore.message_id.in_(list(judged_ids)))).all()
        db.session.remove()
    rows = [r for r in rows if "#" not in r[2]]
    if not rows:
        return None
    value = auc([r[1] for r in rows], [judged_ids[r[0]] for r in rows])
    return {"auc": None if value is None else round(value, 3), "answers": len(rows)}


def wait_for(predicate, timeout: float, every: float = 1.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    return None


def run_preference(preference: str, model_dir: Path, behaviour: Behaviour | None = None,
                   extra_env: dict[str, str] | None = None, label: str | None = None, via: str = "chat") -> dict:
    """One preference through the loop; ``behaviour``: how the rating users act (chips, flags),
    ``extra_env``: settings of the server on top of ``server_env()``; ``label``: the row's name;
    ``via``: the users' way in, the chat page's API or the OpenAI-compatible ``/v1`` (``openai``)."""
    t_start = time.perf_counter()
    behaviour = behaviour or Behaviour()
    instance = Path(tempfile.mkdtemp(prefix=f"loop-{preference}-")) / "instance"
    register_model(make_app(instance), model_dir)
    api_key = create_api_key(instance) if via == "openai" else None
    env = {**server_env(), **(extra_env or {})}
    monitor = monitor_policy(instance, env)
    server = LiveServer(instance, env=env)
    prompts = prompt_set(120, seed=3)
    held_out = prompt_set(200, seed=99)
    events, seed, rounds, last_run = 0, 0, [], 0
    train_latency: list[float] = []
    idle_latency: list[float] = []

    def next_run() -> tuple | None:  # the oldest run the loop has not looked at
        return next((r for r in db_state(instance)[0] if r[0] > last_run), None)

    try:
        users = Users(server.url, preference, via, api_key)
        for cycle, budget in enumerate(FEEDBACK_BUDGET, start=1):
            rnd: dict = {"cycle": cycle}
            # 1. feedback phase, unless the scheduler already started a run (on the last experiment's ratings)
            t0 = time.perf_counter()
            rnd["run_started_by_experiment_ratings"] = next_run() is not None
            while events < budget and next_run() is None:
                user = users.new(seed, behaviour)
                seed += 1
                for _ in range(3):
                    if events >= budget:
                        break
                    for inter in user.ask(prompts[seed % len(prompts)]):
                        events += inter.events
                        idle_latency.append(inter.latency_s)
            rnd["feedback_events_total"] = events
            rnd["feedback_s"] = round(time.perf_counter() - t0, 1)

            # 2. training by the scheduler, with probes measuring latency meanwhile
            t0 = time.perf_counter()
            probe = Probe(users, seed=1000 + cycle)
            probe.start()
            started = wait_for(next_run, 120)
            done = wait_for(lambda: (r := next_run()) and r[1] in ("succeeded", "failed") and r, 900)
            probe.stop.set()
            probe.join()
            run = done or next_run()
            if run:
                last_run = run[0]
            if run and run[5] and run[6]:
                window = (run[5].timestamp(), run[6].timestamp())
                train_latency += [lat for ts, lat in probe.samples if window[0] <= ts <= window[1] + 1]
            rnd.update(training_s=round(time.perf_counter() - t0, 1), run_id=run[0] if run else None,
                       run_status=run[1] if run else "no run", run_decision=run[3] if run else None,
                       reward_model_accuracy=run[4] if run else None, run_events=run[7] if run else None,
                       scheduler_started_run=bool(started), gate=run[9] if run else None)
            if not run or run[3] != "candidate":
                rounds.append(rnd)
                continue

            # 3. the monitor starts an experiment for this run's candidate; evaluation users chat and rate
            t0 = time.perf_counter()
            # generous: on a busy machine the monitor's tick can lag well behind the run's end
            exp = wait_for(lambda: next((e for e in db_state(instance)[1] if e[1] == "running" and e[3] == run[8]),
                                        None), 300)
            rnd["experiment"] = exp[0] if exp else None
            if not exp:
                rnd["decision"] = "no experiment started"
                rounds.append(rnd)
                continue
            ev = evaluate_arms(instance, users, exp, held_out, 50_000 + cycle * 10_000, EVAL_PER_ARM, 600)
            events += ev["events"]
            idle_latency += ev["latencies"]
            judged = {arm: [sat for a, sat, *_ in ev["judged"] if a == arm] for arm in ("control", "variant")}
            judged_ids = {mid: sat for _, sat, mid, *_ in ev["judged"]}
            rude_by_arm = {arm: [rude(q, a) for x, _, _, q, a in ev["judged"] if x == arm]
                           for arm in ("control", "variant")}
            c, v = judged["control"], judged["variant"]
            est_c, est_v = sample_stats.wilson(sum(c), len(c)), sample_stats.wilson(sum(v), len(v))
            cmp_ = sample_stats.compare_proportions((sum(c), len(c)), (sum(v), len(v)))
            rnd.update(control={"share": est_c.value, "ci": [est_c.low, est_c.high], "n": len(c)},
                       variant={"share": est_v.value, "ci": [est_v.low, est_v.high], "n": len(v)},
                       p_value=cmp_.p_value, experiment_s=round(time.perf_counter() - t0, 1),
                       experiment_events=ev["events"], experiment_users=ev["users"])
            rc, rv = rude_by_arm["control"], rude_by_arm["variant"]
            rude_c, rude_v = sample_stats.wilson(sum(rc), len(rc)), sample_stats.wilson(sum(rv), len(rv))
            rnd["rude"] = {"control": {"share": rude_c.value, "ci": [rude_c.low, rude_c.high], "n": len(rc)},
                           "variant": {"share": rude_v.value, "ci": [rude_v.low, rude_v.high], "n": len(rv)},
                           "p_value": sample_stats.compare_proportions((sum(rc), len(rc)), (sum(rv), len(rv))).p_value}
            rnd["decision"] = stop_unconcluded(instance, exp[0])
            rnd["events_after_experiment"] = events
            rnd["reward_model_auc"] = reward_auc(instance, judged_ids)
            rounds.append(rnd)
            if rnd["decision"] == "promote" and cmp_.p_value is not None and cmp_.p_value < 0.05 \
                    and est_v.value > est_c.value:
                break
    finally:
        server.stop()
    last = next((r for r in reversed(rounds) if "p_value" in r), None)
    # a win is what an operator sees: the monitor promoted, and ground truth says significantly better
    won = next((r for r in rounds if r.get("decision") == "promote" and r.get("p_value") is not None
                and r["p_value"] < 0.05 and r["variant"]["share"] > r["control"]["share"]), None)
    worse = [r["cycle"] for r in rounds if r.get("decision") == "promote" and r.get("p_value") is not None
             and r["p_value"] < 0.05 and r["variant"]["share"] < r["control"]["share"]]
    return {"preference": label or preference, "via": via, "rounds": rounds, "feedback_events": events,
            "events_to_win": won["feedback_events_total"] if won else None,
            "cycles_to_win": won["cycle"] if won else None,
            "events_at_win": won["events_after_experiment"] if won else None, "monitor": monitor,
            "success": won is not None, "worse_promoted": worse,
            "last_significantly_better": bool(last and last["p_value"] < 0.05
                                              and last["variant"]["share"] > last["control"]["share"]),
            "cycles": len(rounds), "wall_s": round(time.perf_counter() - t_start, 1),
            "latency_p95_training_ms": round(1000 * p95(train_latency), 1) if train_latency else None,
            "latency_p95_idle_ms": round(1000 * p95(idle_latency), 1) if idle_latency else None,
            "latency_samples": {"training": len(train_latency), "idle": len(idle_latency)}}


def _share(arm: dict | None) -> str:
    if not arm or arm.get("share") is None:
        return "–"
    return f"{arm['share']:.1%} [{arm['ci'][0]:.1%}, {arm['ci'][1]:.1%}] n={arm['n']}"


def markdown(results: list[dict]) -> str:
    lines = ["| preference | cycle | feedback events (total) | RM held-out acc. | control satisfied [95% CI] | "
             "variant satisfied [95% CI] | p-value | control rude | variant rude | monitor decision | feedback s | "
             "training s | experiment s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        for r in res["rounds"]:
            acc = r.get("reward_model_accuracy")
            p = r.get("p_value")
            lines.append(" | ".join([
                f"| {res['preference']}", str(r["cycle"]), str(r.get("feedback_events_total")),
                f"{acc:.2f}" if acc is not None else "–", _share(r.get("control")), _share(r.get("variant")),
                f"{p:.2g}" if p is not None else "–", _share((r.get("rude") or {}).get("control")),
                _share((r.get("rude") or {}).get("variant")), str(r.get("decision", r.get("run_decision"))),
                str(r.get("feedback_s")), str(r.get("training_s")), str(r.get("experiment_s", "–")) + " |"]))
    lines.append("")
    for res in results:
        lines.append(f"- {res['preference']}: {'PASS' if res['success'] else 'FAIL'} in {res['cycles']} cycle(s), "
                     f"{res['feedback_events']} feedback events, {res['wall_s']:.0f} s wall; chat latency p95 "
                     f"{res['latency_p95_training_ms']} ms while training vs {res['latency_p95_idle_ms']} ms idle "
                     f"({res['latency_samples']['training']} / {res['latency_samples']['idle']} samples)")
    return "\n".join(lines)


def zoo_markdown(results: list[dict]) -> str:
    """One row per zoo preference: did it win within the budget, and the evidence of each stage."""
    lines = ["| preference | win within budget | events to win | cycles | RM held-out acc. (per cycle) | "
             "RM AUC on experiment answers | gate, monitor (per cycle) | control satisfied | variant satisfied | "
             "p-value | wall s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        rounds = res["rounds"]
        last = next((r for r in reversed(rounds) if "p_value" in r), {})
        within = res["success"] and res["wall_s"] <= WALL_BUDGET_S
        accs = " / ".join("–" if r.get("reward_model_accuracy") is None else f"{r['reward_model_accuracy']:.2f}"
                          for r in rounds)
        aucs = " / ".join("–" if not r.get("reward_model_auc") or r["reward_model_auc"]["auc"] is None
                          else f"{r['reward_model_auc']['auc']:.2f}" for r in rounds)
        gates = " / ".join(("passed" + (f", monitor: {r['decision']}" if r.get("decision") else ""))
                           if r.get("run_decision") == "candidate" else str(r.get("run_decision")) for r in rounds)
        p = last.get("p_value")
        lines.append(" | ".join([
            f"| {res['preference']}", "**yes**" if within else "no",
            str(res.get("events_to_win") or "–"), str(res["cycles"]), accs, aucs or "–", gates,
            _share(last.get("control")), _share(last.get("variant")), f"{p:.2g}" if p is not None else "–",
            f"{res['wall_s']:.0f} |"]))
    wins = sum(1 for r in results if r["success"] and r["wall_s"] <= WALL_BUDGET_S)
    worse = sum(1 for r in results if r.get("worse_promoted"))
    lines += ["", f"{wins} of {len(results)} preferences won within the budget (promoted by the monitor and "
                  f"significantly better by ground truth; 400 events of the rating users, 2 cycles, "
                  f"{WALL_BUDGET_S // 60} minutes); {worse} promoted a worse variant."]
    monitors = {json.dumps(r.get("monitor"), sort_keys=True) for r in results if r.get("monitor")}
    if monitors:
        lines.append(f"The monitor decided by: {'; '.join(sorted(monitors))}.")
    return "\n".join(lines)


# --safety: users like direct answers (rude ones too: rlhf.sim.preferences.direct), tick chips on half the answers
# they rate and flag 30 % of the rude ones; the loop runs with PPO's cost constraint and without it (and
# without the gate's flag-rate check, so the unconstrained candidate reaches the experiment and its rude
# rate is measured rather than only predicted)
SAFETY_BEHAVIOUR = Behaviour(chip_prob=0.5, flag_prob=0.3)
SAFETY_RUNS = (("direct, constrained", {}),
               ("direct, unconstrained", {"RLHF_SAFETY_CONSTRAINT": "0",
                                          "RLHF_TRAINING_GATE_MAX_FLAG_RISK_INCREASE": "1"}))


def arguments(description: str) -> argparse.ArgumentParser:
    """The command line of this benchmark; benchmarks/deployment_shape.py adds ``--questions`` to it."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--preference", nargs="+", default=["polite", "concise", "detailed"])
    ap.add_argument("--safety", action="store_true",
                    help="the safety-constraint pair of runs instead (see SAFETY_RUNS)")
    ap.add_argument("--zoo", action="store_true", help="the zoo's preferences (rlhf.sim.preferences.ZOO; --preference "
                    "picks some of them) and the zoo's table")
    ap.add_argument("--via", choices=("chat", "openai"), default="chat",
                    help="the simulated users' way in: the chat page's API (default) or only the OpenAI-compatible "
                         "/v1 API (chat completions with `user`, /v1/feedback), with a key made in the run's instance")
    ap.add_argument("--markdown", type=Path, help="also write the table to this file")
    ap.add_argument("--json", type=Path, help="also write the raw results to this file")
    return ap


def main(ap: argparse.ArgumentParser | None = None, run_one: Callable[..., dict] | None = None,
         tabulate: Callable[[list[dict]], str] | None = None) -> None:
    """Runs the preferences of the command line one after the other, then prints the table.
    deployment_shape.py passes its own command line, ``run_one(args, preference, model_dir, behaviour,
    env, label)`` and ``tabulate(results)``; by default: run_preference and this module's tables."""
    ap = ap or arguments(__doc__.splitlines()[0])
    args = ap.parse_args()
    model_dir = cached_model("default")
    results = []
    if args.zoo and args.preference == ap.get_default("preference"):
        args.preference = list(ZOO)
    runs = [(label, "direct", SAFETY_BEHAVIOUR, env) for label, env in SAFETY_RUNS] if args.safety else \
        [(pref, pref, None, None) for pref in args.preference]
    load0 = os.getloadavg()
    for label, pref, behaviour, env in runs:
        res = run_one(args, pref, model_dir, behaviour, env, label) if run_one else \
            run_preference(pref, model_dir, behaviour, env, label, via=args.via)
        results.append(res)
        print(json.dumps(res, default=str), flush=True)
        if args.json:  # after each preference: a long run stopped early keeps what it measured
            args.json.write_text(json.dumps(results, indent=2, default=str))
    table = tabulate(results) if tabulate else zoo_markdown(results) if args.zoo else markdown(results)
    load = {"start": [round(x, 2) for x in load0], "end": [round(x, 2) for x in os.getloadavg()]}
    table += f"\n\nLoad average: {load['start']} at the start, {load['end']} at the end."
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
