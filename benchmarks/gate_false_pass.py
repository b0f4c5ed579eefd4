"""Flat candidates through the gate: an A/A benchmark for the evaluation gate (rlhf.gate).

A gate that calls candidates "better" that are not is the gate's false-positive rate; this measures
it. Offline simulated raters with a taste (the eleven preferences of the zoo and the shipped three,
one per dataset in turn) rate answers the embedded model sampled, as ``zoo_ablation.py`` does; their
feedback is split as a training cycle splits it (``rlhf.cycle.prepare_data``), and the gate's judge
is trained on the held-out side (``rlhf.cycle.train_judge``). Then candidates known to be no better
than the parent meet the gate's evidence on that held-out side:

- ``copy``: the parent saved again;
- ``lr0``: a DPO run on the dataset's training pairs with the learning rate at 1e-12 (the settings
  refuse 0; Adam's steps are then below float32's resolution, which each run checks: the largest
  weight change is recorded), first ``--lr0`` datasets only;
- ``dpo_shuffled``: DPO at its shipped settings on the dataset's own feedback with the thumbs,
  stars and corrections shuffled across its answers (the labels carry no taste);
- ``dpo_nobody``: DPO on feedback from a taste nobody has (a hash of question and answer decides,
  a new hash per dataset) on the same questions;
- ``ppo_shuffled`` / ``ppo_nobody``: the product's default algorithm, a full PPO cycle (reward
  model, PPO) on shuffled or nobody's feedback; a few of them (``--ppo-flats``) are trained once per
  question set and each dataset meets one in turn.

Beside them, the **real wins**: a PPO candidate trained on the feedback of raters who have the
dataset's taste (another seed: the dataset's held-out side never trained it), for the tastes the
zoo and the deployment-shape benchmarks won; it counts as a real win when ground truth (the taste
judging the candidate's and the parent's answers to the shape's ground-truth questions) calls it
significantly better.

Each (candidate, dataset) is one run of the gate's evidence: the instruments as
``rlhf.gate.evaluation.evaluate_candidate`` computes them (implicit margins on the held-out pairs,
the judge's paired gain on both models' answers to the held-out prompts, the same sampling seed),
and the verdict of the shipped rule (``rlhf.gate.verdict.evidence_reasons``) beside the rule before
the effect size (``old_rule``: the sign test's p-value and a trusted judge's, Simes, no veto), in the
same run. The KL, degeneration and flag-risk checks are left out: they can only reject more, so the
pass rates here are upper bounds of the gate's. Every run's raw evidence (margins, the judge's
per-prompt gains) is stored, so ``--analyse`` can apply any other rule to the same runs.

Shapes: ``corpus`` (the zoo's: 200 feedback events on the closed loop's 120 rating questions;
ground truth on 200 held-out questions), ``questions16`` (the deployment shape: 200 events on
16 questions; ground truth on 12 answers to each), ``few_events`` (the same 16 questions, 60 events:
a small deployment's first cycle). The 16-question shapes share their PPO candidates (trained on 200
events), so ``few_events`` asks whether the gate sees a real win on the evidence of 60 events.

    .venv/bin/python benchmarks/gate_false_pass.py --shape questions16 --datasets 100 --json FILE
    .venv/bin/python benchmarks/gate_false_pass.py --analyse FILE [FILE ...]

One module because it is one experiment read top to bottom: candidates, datasets, evidence, verdicts.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
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

from benchmarks.zoo_ablation import feedback, sample_answers  # noqa: E402
from rlhf.cycle import evaluation_prompts, fit_to_data, heldout_evidence, prepare_data, train_judge  # noqa: E402
from rlhf.data.records import ConversationRecord  # noqa: E402
from rlhf.data.stage_sizing import NotEnoughData, policy_prompts  # noqa: E402
from rlhf.gate.evaluation import _scores  # noqa: E402
from rlhf.gate.instruments import (  # noqa: E402
    JUDGE_TIE,
    TIE_NATS,
    heldout_summary,
    judge_trust,
    pair_sequences,
    paired_gain,
    sequence_logprobs,
)
from rlhf.gate.verdict import evidence_reasons, simes  # noqa: E402
from rlhf.models import sampling  # noqa: E402
from rlhf.models.loading import context_length, load_causal_lm  # noqa: E402
from rlhf.policy import train_dpo, train_ppo  # noqa: E402
from rlhf.reward.training import train_reward_model  # noqa: E402
from rlhf.settings import CycleSettings, GateThresholds  # noqa: E402
from rlhf.sim.preferences import preference  # noqa: E402
from rlhf.sim.questions import deployment_questions  # noqa: E402
from rlhf.sim.users import prompt_set  # noqa: E402
from tests.support.models import cached_model  # noqa: E402
from webapp.experiments.sample_stats import compare_proportions, wilson  # noqa: E402

TASTES = ("brief", "thorough", "calm", "specific", "on_topic", "echoes", "signs_off", "polite_brief", "polite",
          "concise", "detailed")
# the tastes the zoo rerun and the deployment-shape benchmark won (benchmarks/RESULTS.md): the real wins
REAL_TASTES = ("brief", "thorough", "calm", "signs_off", "polite_brief", "polite", "concise", "detailed")
FLAT_KINDS = ("copy", "lr0", "dpo_shuffled", "dpo_nobody", "ppo_shuffled", "ppo_nobody")
MOVED_KINDS = ("dpo_shuffled", "dpo_nobody", "ppo_shuffled", "ppo_nobody")  # flat candidates that moved


@dataclasses.dataclass(frozen=True)
class Shape:
    family: str  # shapes of one family share questions, answer pool and PPO candidates
    questions: Callable[[], list[str]]
    per_question: int  # answers sampled per rating question (the pool the raters see)
    events: int
    truth: Callable[[], list[str]]
    truth_each: int


SHAPES = {
    "corpus": Shape("corpus", lambda: prompt_set(120, seed=3), 8, 200, lambda: prompt_set(200, seed=99), 1),
    "questions16": Shape("questions16", lambda: deployment_questions(16), 24, 200,
                         lambda: deployment_questions(16), 12),
    "few_events": Shape("questions16", lambda: deployment_questions(16), 24, 60,
                        lambda: deployment_questions(16), 12),
}


def nobody(salt: str) -> Callable[[str, str], float]:
    """A taste nobody has: a hash of (salt, question, answer) decides, half the answers satisfy it."""
    def taste(question: str, answer: str) -> float:
        return float(int(hashlib.sha256(f"{salt}\n{question}\n{answer}".encode()).hexdigest()[:8], 16) % 2)
    taste.__name__ = f"nobody-{salt}"
    return taste


def shuffled(records: list[ConversationRecord], seed: int) -> list[ConversationRecord]:
    """The same conversations with every answer's feedback (thumbs, stars, corrections) moved to a
    random answer: the labels carry no taste."""
    fbs = [m.feedback for c in records for m in c.messages if m.role == "assistant"]
    random.Random(seed).shuffle(fbs)
    it = iter(fbs)
    return [dataclasses.replace(c, comparisons=(), messages=tuple(
        dataclasses.replace(m, feedback=next(it)) if m.role == "assistant" else m for m in c.messages))
        for c in records]


def old_rule(h: dict[str, Any], j: dict[str, Any] | None, t: GateThresholds) -> bool:
    """The gate's evidence rule before the effect size: the sign test's one-sided p-value and a trusted
    judge's, combined by Simes' test, below alpha, and neither shows a decline."""
    if h["pairs"] < t.min_heldout_pairs:
        return False
    trusted = bool(j and j.get("trusted"))
    if h["p_worse"] < t.alpha or (trusted and j["p_worse"] < t.alpha):
        return False
    return simes([h["p_value"]] + ([j["p_value"]] if trusted else [])) < t.alpha


# ---------------------------------------------------------------------------- candidates

def train_candidate(kind: str, records: list[ConversationRecord], parent: Path, out: Path, seed: int) -> dict:
    """A candidate of ``kind`` (dpo / ppo / lr0) trained on ``records`` from ``parent`` into ``out``."""
    algorithm = "ppo" if kind == "ppo" else "dpo"
    settings = dataclasses.replace(CycleSettings(algorithm=algorithm, device="cpu"),
                                   policy=dataclasses.replace(CycleSettings().policy, seed=seed))
    bundle = prepare_data(records, settings)
    settings, _ = fit_to_data(settings, bundle)
    t0 = time.perf_counter()
    if kind == "ppo":
        train_reward_model(parent, bundle.pairs["train"], bundle.pairs["eval"], out / "reward", settings.reward, "cpu",
                           criteria_rows=bundle.criteria, criteria=settings.criteria, rated_rows=bundle.rated["train"])
        metrics = train_ppo(parent, out / "reward", policy_prompts(bundle), out / "policy", settings.policy, "cpu",
                            criteria=settings.criteria)
    else:
        policy = dataclasses.replace(settings.policy, learning_rate=1e-12) if kind == "lr0" else settings.policy
        metrics = train_dpo(parent, bundle.pairs["train"], out / "policy", policy, "cpu")
    return {"algorithm": algorithm, "steps": metrics.get("steps"), "train_s": round(time.perf_counter() - t0, 1),
            "pairs": bundle.counts["pairs"]}


def max_weight_change(a: Path, b: Path) -> float:
    ma, _ = load_causal_lm(a, "cpu")
    mb, _ = load_causal_lm(b, "cpu")
    sb = mb.state_dict()
    return max(float((v - sb[k]).abs().max()) for k, v in ma.state_dict().items() if v.is_floating_point())


class Truth:
    """Ground truth on the shape's ground-truth questions: answers sampled once per model, judged by any taste."""

    def __init__(self, shape: Shape, parent: Path) -> None:
        self.questions, self.each = shape.truth(), shape.truth_each
        self.answers: dict[str, dict[str, list[str]]] = {}
        self.parent = self.of(parent)

    def of(self, model_dir: Path) -> dict[str, list[str]]:
        key = str(model_dir)
        if key not in self.answers:
            self.answers[key] = sample_answers(model_dir, self.questions, self.each, seed=4321)
        return self.answers[key]

    def compare(self, model_dir: Path, taste: str) -> dict[str, Any]:
        judge = preference(taste)
        par = [judge(q, a) >= 0.5 for q, xs in self.parent.items() for a in xs]
        can = [judge(q, a) >= 0.5 for q, xs in self.of(model_dir).items() for a in xs]
        p = compare_proportions((sum(par), len(par)), (sum(can), len(can))).p_value
        return {"parent": round(sum(par) / len(par), 4), "candidate": round(sum(can) / len(can), 4), "n": len(can),
                "p_value": p, "better": bool(p < 0.05 and sum(can) > sum(par)),
                "worse": bool(p < 0.05 and sum(can) < sum(par))}


def pooled_candidates(shape: Shape, work: Path, parent: Path, pool: dict[str, list[str]], ppo_flats: int,
                      real: tuple[str, ...]) -> list[dict[str, Any]]:
    """The PPO candidates of the shape's family, trained once and kept in ``work`` (resumable): ``ppo_flats``
    of each flat kind, and a real win for each taste of ``real``."""
    wanted = [(f"ppo_{k}", k, i) for i in range(ppo_flats) for k in ("shuffled", "nobody")]
    wanted += [("real", taste, REAL_TASTES.index(taste)) for taste in real]
    out = []
    for kind, what, i in wanted:
        name = f"{kind}-{what}-{i}" if kind == "real" else f"{kind}-{i}"
        home = work / shape.family / name
        meta = home / "meta.json"
        if not meta.is_file():
            seed = 900_000 + 1000 * i + (7 if kind == "ppo_shuffled" else 0)
            taste = TASTES[i % len(TASTES)] if kind != "real" else what
            records = feedback(nobody(f"ppo-{i}") if kind == "ppo_nobody" else taste, pool, 200, seed)
            if kind == "ppo_shuffled":
                records = shuffled(records, seed)
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir(parents=True)
            info = train_candidate("ppo", records, parent, home, seed)
            meta.write_text(json.dumps({"kind": kind, "taste": taste if kind != "ppo_nobody" else None,
                                        "train_seed": seed, **info}))
            print(f"trained {shape.family}/{name}: {info}", flush=True)
        out.append({"name": name, "dir": home / "policy", **json.loads(meta.read_text())})
    return out


# ---------------------------------------------------------------------------- the gate's evidence

class Dataset:
    """One dataset's held-out evidence and judge, with the parent's side computed once."""

    def __init__(self, records: list[ConversationRecord], parent: Path, scratch: Path) -> None:
        self.settings = CycleSettings(device="cpu")
        self.bundle = prepare_data(records, self.settings)
        self.settings, _ = fit_to_data(self.settings, self.bundle)
        self.held = heldout_evidence(self.bundle)
        self.enough = len(self.held) >= self.settings.gate.min_heldout_pairs
        self.parent_dir = parent
        if not self.enough:
            return
        self.judge_dir = scratch / "judge"
        self.judge_info = train_judge(parent, self.bundle, self.judge_dir, self.settings)
        model, self.tok = load_causal_lm(parent, "cpu")
        self.context = context_length(model)
        self.seqs = pair_sequences(self.tok, self.held[: self.settings.evaluation.max_pairs], self.context)
        self.parent_lp = sequence_logprobs(model, self.seqs, self.tok.pad_token_id)
        prompts, judged, _ = evaluation_prompts([r["prompt"] for r in self.bundle.prompts["eval"]],
                                                policy_prompts(self.bundle), self.settings)
        ev = self.settings.evaluation
        self.histories = [p for p in prompts[:judged] for _ in range(ev.samples_per_prompt)]
        self.texts = [self.tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
                      for p in self.histories]
        self.parent_scores = self._judge_scores(model)

    def _judge_scores(self, model: Any) -> list[float]:
        torch.manual_seed(self.settings.evaluation.seed)  # the same sampling noise for both, as the gate
        answers = sampling.sample_answers(model, self.tok, self.texts, self.settings.evaluation)[0]
        return _scores(self.judge_dir, torch.device("cpu"), self.histories, {"m": answers})["m"]

    def evidence(self, candidate: Path) -> dict[str, Any]:
        t = self.settings.gate
        if not self.enough:
            return {"pairs": len(self.held), "old": False, "new": False, "verdict": "not enough evidence"}
        model, _ = load_causal_lm(candidate, "cpu")
        lp = sequence_logprobs(model, self.seqs, self.tok.pad_token_id)
        margins = [(lp[2 * i] - self.parent_lp[2 * i]) - (lp[2 * i + 1] - self.parent_lp[2 * i + 1])
                   for i in range(len(self.seqs) // 2)]
        scores = self._judge_scores(model)
        spp = self.settings.evaluation.samples_per_prompt
        info = self.judge_info
        judge = {**info, **judge_trust(info.get("accuracy"), info.get("accuracy_pairs"), t.alpha),
                 **paired_gain(self.parent_scores, scores, spp, t.min_reward_gain)}
        diffs = [sum(scores[i:i + spp]) / spp - sum(self.parent_scores[i:i + spp]) / spp
                 for i in range(0, len(scores), spp)]
        h = heldout_summary(margins, t.min_margin, t.alpha)
        return {"pairs": len(margins), "heldout": h, "judge": judge, "margins": [round(m, 4) for m in margins],
                "judge_diffs": [round(d, 5) for d in diffs], "old": old_rule(h, judge, t),
                "new": not evidence_reasons(h, judge, t), "reasons": evidence_reasons(h, judge, t)}


def run_shape(name: str, seeds: range, work: Path, opts: argparse.Namespace, emit: Callable) -> None:
    """The datasets ``seeds`` of shape ``name``: each meets the flat candidates (``opts.kinds``) and, with
    ``real`` among them, the real win of its taste (then only the tastes of ``REAL_TASTES`` are drawn)."""
    shape = SHAPES[name]
    parent = cached_model("default")
    questions = shape.questions()
    pool = sample_answers(parent, questions, shape.per_question, seed=1)
    copy = work / shape.family / "copy"
    if not (copy / "config.json").is_file():
        model, tok = load_causal_lm(parent, "cpu")
        model.save_pretrained(copy)
        tok.save_pretrained(copy)
    real = tuple(opts.real_tastes) if "real" in opts.kinds else ()
    pooled = pooled_candidates(shape, work, parent, pool, opts.ppo_flats if "ppo" in opts.kinds else 0, real)
    flats = [c for c in pooled if c["kind"] != "real"]
    truth = Truth(shape, parent)
    tastes = real or TASTES
    for seed in seeds:
        taste = tastes[seed % len(tastes)]
        t0 = time.perf_counter()
        load0 = os.getloadavg()
        records = feedback(taste, pool, shape.events, seed)
        scratch = Path(tempfile.mkdtemp(prefix="gate-aa-"))
        try:
            try:
                data = Dataset(records, parent, scratch)
            except NotEnoughData as exc:
                emit({"shape": name, "seed": seed, "taste": taste, "kind": "refused", "reason": str(exc)})
                continue
            cands: list[dict[str, Any]] = []
            if "copy" in opts.kinds:
                cands.append({"kind": "copy", "name": "copy", "dir": copy})
            if "lr0" in opts.kinds and seed - seeds.start < opts.lr0:
                cands.append({"kind": "lr0", "records": records})
            for i in range(opts.flats_per_kind):
                if "dpo_shuffled" in opts.kinds:
                    cands.append({"kind": "dpo_shuffled", "records": shuffled(records, 10 * seed + i + 1), "i": i})
                if "dpo_nobody" in opts.kinds:
                    cands.append({"kind": "dpo_nobody", "i": i, "records": feedback(
                        nobody(f"dpo-{seed}-{i}"), pool, shape.events, 50_000 + 10 * seed + i)})
            for k in range(min(opts.ppo_per_dataset, len(flats))):
                cands.append(flats[(seed * opts.ppo_per_dataset + k) % len(flats)])
            cands += [c for c in pooled if c["kind"] == "real" and c["taste"] == taste]
            for cand in cands:
                row: dict[str, Any] = {"shape": name, "seed": seed, "taste": taste, "kind": cand["kind"],
                                       "candidate": cand.get("name") or f"{cand['kind']}-{seed}-{cand.get('i', 0)}"}
                trained = "records" in cand
                if trained:
                    out = scratch / f"{cand['kind']}-{cand.get('i', 0)}"
                    try:
                        row["training"] = train_candidate("lr0" if cand["kind"] == "lr0" else "dpo", cand["records"],
                                                          parent, out, seed)
                    except NotEnoughData as exc:
                        emit({**row, "refused": str(exc)})
                        continue
                    cand = {**cand, "dir": out / "policy"}
                    if row["kind"] == "lr0":
                        row["max_weight_change"] = max_weight_change(parent, cand["dir"])
                row.update(data.evidence(cand["dir"]))
                if not trained or (seed - seeds.start) % opts.truth_every == 0:
                    row["truth"] = truth.compare(cand["dir"], taste)
                    if trained:
                        truth.answers.pop(str(cand["dir"]), None)
                emit(row)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        print(f"{name} seed {seed} ({taste}): {round(time.perf_counter() - t0)} s, load {load0[0]:.2f} -> "
              f"{os.getloadavg()[0]:.2f}", flush=True)


# ---------------------------------------------------------------------------- the tables

def _signed_rank_p(values: list[float]) -> float:
    """One-sided (greater) Wilcoxon signed-rank p-value, zeros within JUDGE_TIE left out, as the gate."""
    from scipy.stats import wilcoxon

    values = [v for v in values if abs(v) > JUDGE_TIE]
    return float(wilcoxon(values, alternative="greater").pvalue) if values else 1.0


def _standardized_gain_p(diffs: list[float], min_d: float) -> float:
    """One-sided p-value for "the judge's standardized gain (mean / sd of its per-prompt gains, Cohen's
    d_z) is above ``min_d``": the noncentral t test, free of the judge's own scale."""
    from scipy.stats import nct

    n = len(diffs)
    if n < 3:
        return 1.0
    mean = sum(diffs) / n
    sd = (sum((d - mean) ** 2 for d in diffs) / (n - 1)) ** 0.5
    if sd <= JUDGE_TIE:
        return 0.0 if mean > JUDGE_TIE else 1.0
    return float(nct.sf(mean / (sd / n ** 0.5), n - 1, min_d * n ** 0.5))


def rule_passes(row: dict[str, Any], stat: str, min_margin: float, flat_p: float, judge_min: float = 0.0,
                both: bool = False, alpha: float = 0.05, judge_stat: str = "gain") -> bool:
    """Whether ``row``'s evidence passes a candidate rule: the pairs' effect by ``stat`` (``t``: the mean
    margin's t bound, the shipped statistic; ``signrank``: Wilcoxon on margin - min_margin; ``deadzone``:
    the sign test with |margin| <= min_margin a tie; ``sign``: the old sign test); a trusted judge's gain
    above ``judge_min`` (signed-rank test of its per-prompt gains, as the gate); a trusted judge whose
    p-value for any gain is ``flat_p`` or more vetoes; Simes at ``alpha`` (``both``: with a trusted judge,
    each instrument below ``alpha`` on its own); no decline on either. ``judge_stat`` ``dz``: the judge's
    standardized gain above ``judge_min`` instead of its raw gain (a scale-free effect)."""
    from scipy.stats import binomtest, wilcoxon

    if "margins" not in row:
        return False
    m, h, j = row["margins"], row["heldout"], row["judge"]
    trusted = bool(j.get("trusted"))
    if h["p_worse"] < alpha or (trusted and j["p_worse"] < alpha):
        return False
    if trusted and _signed_rank_p(row["judge_diffs"]) >= flat_p:
        return False
    if stat == "t":
        p = heldout_summary(m, min_margin, alpha)["effect_p"]
    elif stat == "signrank":
        shifted = [x - min_margin for x in m if abs(x - min_margin) > TIE_NATS]
        p = float(wilcoxon(shifted, alternative="greater").pvalue) if shifted else 1.0
    elif stat == "deadzone":
        wins, losses = sum(x > max(min_margin, TIE_NATS) for x in m), sum(x < -max(min_margin, TIE_NATS) for x in m)
        p = binomtest(wins, wins + losses, 0.5, alternative="greater").pvalue if wins + losses else 1.0
    else:
        p = h["p_value"]
    judge_p = None if not trusted else _standardized_gain_p(row["judge_diffs"], judge_min) if judge_stat == "dz" \
        else _signed_rank_p([d - judge_min for d in row["judge_diffs"]])
    if both and trusted:
        return p < alpha and judge_p < alpha
    return simes([p] + ([judge_p] if trusted else [])) < alpha


def shipped_passes(row: dict[str, Any], t: GateThresholds = GateThresholds()) -> bool:
    """The shipped rule's verdict on ``row``'s stored evidence, through the gate's own functions (a run
    recorded under other thresholds is judged again by the current ones)."""
    if "margins" not in row:
        return False
    h = heldout_summary(row["margins"], t.min_margin, t.alpha)
    j = row["judge"]
    judge = {**j, **paired_gain([0.0] * len(row["judge_diffs"]), row["judge_diffs"], 1, t.min_reward_gain)}
    return not evidence_reasons(h, judge, t)


def _rate(k: int, n: int) -> str:
    if not n:
        return "–"
    est = wilson(k, n)
    return f"{k}/{n} = {est.value:.1%} [{est.low:.1%}, {est.high:.1%}]"


def analyse(rows: list[dict[str, Any]], grid: bool = True) -> tuple[str, dict[str, Any]]:
    """The tables: per shape and kind, the old and the shipped rule's pass rates (Wilson 95 %), the real
    wins' pass rates, and (``grid``) candidate rules on the same runs."""
    judged = [r for r in rows if "margins" in r or r.get("verdict") == "not enough evidence"]
    shapes = [s for s in SHAPES if any(r["shape"] == s for r in judged)]
    lines = ["| shape | candidates | runs (gate judged on evidence) | not enough evidence | "
             "ground truth better / worse | passed, old rule (sign test) | passed, shipped rule (effect size) |",
             "|---|---|---|---|---|---|---|"]
    summary: dict[str, Any] = {}
    for shape in shapes:
        mine = [r for r in judged if r["shape"] == shape]
        groups = [(k, [r for r in mine if r["kind"] == k]) for k in FLAT_KINDS]
        groups += [("all moved flats", [r for r in mine if r["kind"] in MOVED_KINDS]),
                   ("all flats", [r for r in mine if r["kind"] in FLAT_KINDS]),
                   ("real, ground truth better", [r for r in mine if r["kind"] == "real" and r["truth"]["better"]]),
                   ("real, not better", [r for r in mine if r["kind"] == "real" and not r["truth"]["better"]])]
        for label, rs in groups:
            if not rs:
                continue
            ev = [r for r in rs if "margins" in r]
            old, new = sum(r["old"] for r in ev), sum(shipped_passes(r) for r in ev)
            truth = [r["truth"] for r in ev if r.get("truth")]
            better, worse = sum(t["better"] for t in truth), sum(t["worse"] for t in truth)
            lines.append(f"| {shape} | {label} ({len({r['candidate'] for r in ev})} distinct) | {len(ev)} | "
                         f"{len(rs) - len(ev)} | {better} / {worse} of {len(truth)} | {_rate(old, len(ev))} | "
                         f"{_rate(new, len(ev))} |")
            summary.setdefault(shape, {})[label] = {"runs": len(ev), "old": old, "new": new,
                                                    "not_enough_evidence": len(rs) - len(ev),
                                                    "truth_better": better, "truth_worse": worse}
    loads = [r["load"] for r in rows if r.get("load")]
    if loads:
        lines += ["", f"Load average (1 min) at the runs: "
                      f"{min(x[0] for x in loads):.2f}-{max(x[0] for x in loads):.2f} "
                      f"(median {sorted(x[0] for x in loads)[len(loads) // 2]:.2f}) on 2 cores."]
    if grid:
        lines += ["", "Candidate rules on the same runs: moved flat candidates passed (all of them; in brackets those "
                      "ground truth does not call better, where it was measured) / real wins (ground truth better) "
                      "passed, per shape.", "",
                  "| pairs' statistic | min margin (nats) | judge's min gain (d: standardized) | "
                  "trusted judge vetoes at p >= | with a trusted judge | " + " | ".join(shapes) + " |",
                  "|---|---|---|---|---|" + "---|" * len(shapes)]
        rules = [("sign", 0.0, 0.0, 1.0, False, "gain")]
        rules += [("t", d, jm, fp, False, "gain") for d in (0.0, 0.25, 0.5, 0.75, 1.0) for jm in (0.0, 0.2)
                  for fp in (1.0, 0.5, 0.05)]
        rules += [("t", d, jm, 0.5, False, "dz") for d in (0.5, 0.75) for jm in (0.2, 0.3, 0.5, 0.8)]
        rules += [(st, d, jm, 0.05, True, "gain") for st in ("sign", "t") for d in ((0.0,) if st == "sign" else
                                                                                  (0.0, 0.25, 0.5, 0.75, 1.0))
                  for jm in (0.0, 0.2)]
        rules += [(st, d, 0.0, 0.05, False, "gain") for st in ("signrank", "deadzone") for d in (0.25, 0.5, 1.0)]
        for stat, delta, judge_min, flat_p, both, judge_stat in rules:
            cells = []
            for shape in shapes:
                ev = [r for r in judged if r["shape"] == shape and "margins" in r]
                flats = [r for r in ev if r["kind"] in MOVED_KINDS]
                flat_gt = [r for r in flats if not (r.get("truth") or {}).get("better")]
                wins = [r for r in ev if r["kind"] == "real" and r["truth"]["better"]]
                f, g, w = (sum(rule_passes(r, stat, delta, flat_p, judge_min, both, judge_stat=judge_stat)
                               for r in rs) for rs in (flats, flat_gt, wins))
                cells.append(f"{f}/{len(flats)} ({g}/{len(flat_gt)}) / {w}/{len(wins)}")
            shown = f"{'d ' if judge_stat == 'dz' else ''}{judge_min:g}"
            lines.append(f"| {stat} | {delta:g} | {shown} | {'never' if flat_p >= 1 else flat_p} | "
                         f"{'both must show it' if both else 'either may carry (Simes)'} | " + " | ".join(cells) + " |")
    return "\n".join(lines), summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--datasets", type=int, default=100, help="datasets (raters' feedback) per shape")
    ap.add_argument("--start", type=int, default=0, help="first dataset seed (to resume or extend a run)")
    ap.add_argument("--ppo-flats", type=int, default=2, help="PPO flat candidates of each kind per question set")
    ap.add_argument("--lr0", type=int, default=10, help="datasets (the first ones) that also meet an lr-0 run")
    ap.add_argument("--kinds", nargs="+", default=["copy", "lr0", "dpo_shuffled", "dpo_nobody", "ppo"],
                    choices=["copy", "lr0", "dpo_shuffled", "dpo_nobody", "ppo", "real"],
                    help="candidates each dataset meets (ppo: the pooled PPO flats; real: the real wins, and then "
                         "only the tastes they were trained on are drawn)")
    ap.add_argument("--real-tastes", nargs="+", choices=REAL_TASTES, default=list(REAL_TASTES),
                    help="with --kinds real: the tastes whose real wins are trained and met")
    ap.add_argument("--flats-per-kind", type=int, default=2, help="DPO flat candidates of each kind per dataset")
    ap.add_argument("--ppo-per-dataset", type=int, default=2, help="pooled PPO flats each dataset meets, in turn")
    ap.add_argument("--truth-every", type=int, default=4,
                    help="ground truth of the per-dataset DPO candidates on every n-th dataset (it costs a sampling)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--work", type=Path, default=ROOT / ".cache" / "gate-false-pass",
                    help="where the PPO candidates are kept between runs")
    ap.add_argument("--json", type=Path, help="append each run's raw evidence to this file (JSON lines)")
    ap.add_argument("--analyse", type=Path, nargs="+", help="only print the tables of these JSON-lines files")
    ap.add_argument("--summary", type=Path, help="with --analyse: also write the tables' numbers as JSON")
    args = ap.parse_args()
    if args.analyse:
        rows = [json.loads(line) for f in args.analyse for line in f.read_text().splitlines() if line.strip()]
        table, summary = analyse([r for r in rows if "shape" in r])
        print(table)
        if args.summary:
            args.summary.write_text(json.dumps(summary, indent=1))
        return
    torch.set_num_threads(args.threads)

    def emit(row: dict[str, Any]) -> None:
        row = {**row, "load": [round(x, 2) for x in os.getloadavg()], "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps(row, default=str) + "\n")
        print(json.dumps({k: row.get(k) for k in ("shape", "seed", "taste", "kind", "pairs", "old", "new", "truth")},
                         default=str), flush=True)

    if args.json:
        with args.json.open("a") as f:
            f.write(json.dumps({"command": " ".join(sys.argv), "load": [round(x, 2) for x in os.getloadavg()],
                                "at": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
    for shape in args.shape:
        run_shape(shape, range(args.start, args.start + args.datasets), args.work, args, emit)


if __name__ == "__main__":
    main()
