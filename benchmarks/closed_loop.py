"""Closed-loop benchmark: simulated users -> scheduled retraining -> experiment -> better answers.

For each preference function: a fresh instance with the embedded model, the real production
server on a loopback port with the scheduler inside (short intervals), and rounds of:

1. feedback phase -- rating users (thumbs, stars, corrections, regenerations, compare votes)
   chat until the cycle's feedback budget is reached (at most 400 events in all);
2. training        -- the scheduler notices the new feedback and runs rl-train in a child
   process; chat-only probe users keep chatting to measure latency while it trains;
3. experiment      -- the experiment monitor starts control-vs-candidate; chat-only evaluation
   users (50/50 by hash) ask held-out questions; every served answer is judged by the
   preference function (ground truth) and the arms are compared with a two-proportion test;
   the monitor concludes by its policy (primary metric: mean reward-model score, so the
   decision needs no extra feedback events).

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
scores the monitor stored for its mean-reward metric against the users' ground truth: held-out
questions, answers of both arms) and the verdict against its budget: a significant win within
400 events, 2 cycles and 15 minutes.

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
from tests.support.models import cached_model  # noqa: E402
from tests.support.app import make_app, register_model  # noqa: E402
from tests.support.live_server import LiveServer  # noqa: E402
from webapp.experiments import sample_stats  # noqa: E402
from webapp.core.extensions import db  # noqa: E402
from webapp.core.models import AnswerScore, Experiment, Message, ModelVersion, TrainingRun  # noqa: E402

FEEDBACK_BUDGET = (200, 400)  # cumulative feedback events allowed before cycle 1 and cycle 2
WALL_BUDGET_S = 900  # --zoo: a preference's whole run (feedback, training, experiment) on 2 cores
EVAL_PER_ARM = 250  # chat-only answers judged per arm (the monitor waits for as many before deciding)


def server_env() -> dict[str, str]:
    return {"RLHF_SCHEDULER": "1", "RLHF_RETRAIN_INTERVAL_SECONDS": "4", "RLHF_MONITOR_INTERVAL_SECONDS": "3",
            "RLHF_HOUSEKEEPING_INTERVAL_SECONDS": "300", "RLHF_RETRAIN_MIN_FEEDBACK": "150",
            "RLHF_PRIMARY_METRIC": "mean_reward", "RLHF_AB_MIN_SAMPLE": str(EVAL_PER_ARM), "RLHF_COMPARE_RATE": "0",
            "RLHF_EXPERIMENT_SPLIT": "0.5", "RLHF_DEVICE": "cpu", "RLHF_RETRAIN_ALGORITHM": "ppo",
            # hundreds of simulated users from 127.0.0.1, as fast as the server answers: a load
            # test, not people, so the per-address rate limits are off
            "RLHF_RATELIMIT_ENABLED": "0"}


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


def db_state(instance: Path):
    """(training runs, experiments) as plain tuples, read through one app per instance."""
    app = _APPS.setdefault(instance, make_app(instance))
    with app.app_context():
        runs = [(r.id, r.status, r.trigger, (r.metrics or {}).get("decision"),
                 (r.metrics or {}).get("reward_model", {}).get("heldout_accuracy"), r.started_at, r.finished_at,
                 (r.feedback_counts or {}).get("events"))
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
    """The reward model's AUC on the experiment's answers: the scores the monitor stored for its
    mean-reward metric (one reward model's, not a criterion's) against the users' ground truth."""
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
    server = LiveServer(instance, env={**server_env(), **(extra_env or {})})
    prompts = prompt_set(120, seed=3)
    held_out = prompt_set(200, seed=99)
    events, seed, rounds = 0, 0, []
    train_latency: list[float] = []
    idle_latency: list[float] = []
    try:
        users = Users(server.url, preference, via, api_key)
        for cycle, budget in enumerate(FEEDBACK_BUDGET, start=1):
            rnd: dict = {"cycle": cycle}
            n_runs = len(db_state(instance)[0])
            # 1. feedback phase
            t0 = time.perf_counter()
            while events < budget:
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
            started = wait_for(lambda: len(db_state(instance)[0]) > n_runs, 120)
            done = wait_for(lambda: (r := db_state(instance)[0][-1]) and r[1] in ("succeeded", "failed") and r, 900)
            probe.stop.set()
            probe.join()
            run = done or db_state(instance)[0][-1]
            if run and run[5] and run[6]:
                window = (run[5].timestamp(), run[6].timestamp())
                train_latency += [lat for ts, lat in probe.samples if window[0] <= ts <= window[1] + 1]
            rnd.update(training_s=round(time.perf_counter() - t0, 1), run_id=run[0] if run else None,
                       run_status=run[1] if run else "no run", run_decision=run[3] if run else None,
                       reward_model_accuracy=run[4] if run else None, run_events=run[7] if run else None,
                       scheduler_started_run=bool(started))
            if not run or run[3] != "candidate":
                rounds.append(rnd)
                continue

            # 3. the monitor starts an experiment; evaluation users chat; ground truth per arm
            t0 = time.perf_counter()
            # generous: on a busy machine the monitor's tick can lag well behind the run's end
            exp = wait_for(lambda: next((e for e in db_state(instance)[1] if e[1] == "running"), None), 300)
            rnd["experiment"] = exp[0] if exp else None
            if not exp:
                rnd["decision"] = "no experiment started"
                rounds.append(rnd)
                continue
            # judged by the version that answered (after a promotion new users get the variant without an arm)
            control_name, variant_name = (exp[4], exp[3]) if exp else (None, None)
            judged: dict[str, list[bool]] = {"control": [], "variant": []}
            judged_ids: dict[int, bool] = {}
            rude_by_arm: dict[str, list[bool]] = {"control": [], "variant": []}
            i, deadline = 0, time.time() + 600
            while min(map(len, judged.values())) < EVAL_PER_ARM and time.time() < deadline and i < 6 * EVAL_PER_ARM:
                user = users.new(50_000 + cycle * 10_000 + i, rate=False)
                interactions = user.ask(held_out[i % len(held_out)])
                ids = stored_ids(instance, interactions)
                versions = answered_by(instance, [mid for mid in ids if mid is not None])
                for inter, mid in zip(interactions, ids):
                    arm = {control_name: "control", variant_name: "variant"}.get(versions.get(mid))
                    if arm:
                        judged[arm].append(inter.satisfaction >= 0.5)
                        judged_ids[mid] = inter.satisfaction >= 0.5
                        rude_by_arm[arm].append(rude(inter.question, inter.answer))
                    idle_latency.append(inter.latency_s)
                i += 1
            c, v = judged["control"], judged["variant"]
            est_c, est_v = sample_stats.wilson(sum(c), len(c)), sample_stats.wilson(sum(v), len(v))
            cmp_ = sample_stats.compare_proportions((sum(c), len(c)), (sum(v), len(v)))
            rnd.update(control={"share": est_c.value, "ci": [est_c.low, est_c.high], "n": len(c)},
                       variant={"share": est_v.value, "ci": [est_v.low, est_v.high], "n": len(v)},
                       p_value=cmp_.p_value, experiment_s=round(time.perf_counter() - t0, 1))
            rc, rv = rude_by_arm["control"], rude_by_arm["variant"]
            rude_c, rude_v = sample_stats.wilson(sum(rc), len(rc)), sample_stats.wilson(sum(rv), len(rv))
            rnd["rude"] = {"control": {"share": rude_c.value, "ci": [rude_c.low, rude_c.high], "n": len(rc)},
                           "variant": {"share": rude_v.value, "ci": [rude_v.low, rude_v.high], "n": len(rv)},
                           "p_value": sample_stats.compare_proportions((sum(rc), len(rc)), (sum(rv), len(rv))).p_value}
            decided = wait_for(lambda: next((e for e in db_state(instance)[1] if e[0] == rnd["experiment"]
                                             and e[1] != "running"), None), 20)
            rnd["decision"] = (decided[2] if decided else "wait (still running)")
            rnd["reward_model_auc"] = reward_auc(instance, judged_ids)
            rounds.append(rnd)
            if cmp_.p_value is not None and cmp_.p_value < 0.05 and est_v.value > est_c.value:
                break
    finally:
        server.stop()
    last = next((r for r in reversed(rounds) if "p_value" in r), None)
    won = next((r for r in rounds if r.get("p_value") is not None and r["p_value"] < 0.05
                and r["variant"]["share"] > r["control"]["share"]), None)
    return {"preference": label or preference, "via": via, "rounds": rounds, "feedback_events": events,
            "events_to_win": won["feedback_events_total"] if won else None, "cycles_to_win": won["cycle"] if won else None,
            "success": bool(last and last["p_value"] < 0.05 and last["variant"]["share"] > last["control"]["share"]),
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
             "RM AUC on experiment answers | gate (per cycle) | control satisfied | variant satisfied | p-value | "
             "wall s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        rounds = res["rounds"]
        last = next((r for r in reversed(rounds) if "p_value" in r), {})
        within = res["success"] and res["wall_s"] <= WALL_BUDGET_S
        accs = " / ".join("–" if r.get("reward_model_accuracy") is None else f"{r['reward_model_accuracy']:.2f}"
                          for r in rounds)
        aucs = " / ".join("–" if not r.get("reward_model_auc") or r["reward_model_auc"]["auc"] is None
                          else f"{r['reward_model_auc']['auc']:.2f}" for r in rounds)
        gates = " / ".join("passed" if r.get("run_decision") == "candidate" else str(r.get("run_decision"))
                           for r in rounds)
        p = last.get("p_value")
        lines.append(" | ".join([
            f"| {res['preference']}", "**yes**" if within else "no",
            str(res.get("events_to_win") or "–"), str(res["cycles"]), accs, aucs or "–", gates,
            _share(last.get("control")), _share(last.get("variant")), f"{p:.2g}" if p is not None else "–",
            f"{res['wall_s']:.0f} |"]))
    wins = sum(1 for r in results if r["success"] and r["wall_s"] <= WALL_BUDGET_S)
    lines += ["", f"{wins} of {len(results)} preferences won within the budget (400 events, 2 cycles, "
                  f"{WALL_BUDGET_S // 60} minutes)."]
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
    ap.add_argument("--safety", action="store_true", help="the safety-constraint pair of runs instead (see SAFETY_RUNS)")
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
