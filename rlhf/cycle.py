"""One training cycle: feedback records -> datasets -> reward model -> policy -> judge -> evaluation gate.

Pure ML orchestration: plain records and directories in, directories and a metrics dict out.
The caller (webapp's training runner) decides where things are stored and what the database
says about them.
"""
from __future__ import annotations

import resource
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from rlhf.data.datasets import DatasetBundle, build_datasets, question_key
from rlhf.data.records import ConversationRecord
from rlhf.data.stage_sizing import DataSize, NotEnoughData, policy_prompts  # noqa: F401 (NotEnoughData: part of the cycle's API)
from rlhf.gate.evaluation import evaluate_candidate
from rlhf.models.adapters import is_adapter
from rlhf.models.loading import load_causal_lm, resolve_device
from rlhf.policy.algorithms import PolicyJob, algorithm, check_settings, size_stages
from rlhf.progress import STAGES, ProgressFn
from rlhf.reward.training import train_reward_model
from rlhf.settings import CycleSettings
from rlhf.training import distributed
from rlhf.training.curves import TrainingLogs
from rlhf.trust import RaterInfo, trusted_bundle

LogFn = Callable[[str], None]

# Share of the whole cycle each stage takes (for one overall progress number).
STAGE_WEIGHTS = {"data": 0.05, "reward": 0.2, "policy": 0.5, "judge": 0.1, "evaluate": 0.15}


@dataclass
class CycleResult:
    counts: dict[str, Any]
    reward: dict[str, Any]
    policy: dict[str, Any]
    evaluation: dict[str, Any]
    timings: dict[str, float]
    peak_rss_mb: dict[str, float] = field(default_factory=dict)  # process peak so far, at the end of each stage
    # on CUDA: the peak of memory allocated on the GPU during each stage (reset between stages)
    peak_gpu_mb: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.evaluation.get("passed"))


def overall_progress(stage: str, done: int, total: int) -> float:
    """0..1 over the whole cycle from one stage's progress."""
    before = sum(STAGE_WEIGHTS[s] for s in STAGES[: STAGES.index(stage)]) if stage in STAGES else 0.0
    return min(1.0, before + STAGE_WEIGHTS.get(stage, 0.0) * (done / max(1, total)))


def fit_to_data(settings: CycleSettings, bundle: DatasetBundle) -> tuple[CycleSettings, list[str]]:
    """``settings`` with each stage sized to the data (its algorithm's rules: rlhf.policy.algorithms),
    and what changed. Raises NotEnoughData when a stage cannot train on it."""
    reward, policy, notes = size_stages(settings.algorithm, settings.reward, settings.policy, DataSize.of(bundle),
                                        settings.min_pairs, settings.min_prompts, distributed.world_size())
    return check_settings(replace(settings, reward=reward, policy=policy)), notes


def weigh_raters(bundle: DatasetBundle, settings: CycleSettings,
                 raters: Mapping[int, RaterInfo] | None = None) -> DatasetBundle:
    """``bundle`` (as built, not weighed yet) with rater trust applied (rlhf.trust) when
    ``settings.trust.enabled``: quarantined raters' rows removed, a ``weight`` on every other row,
    the summary in ``counts["trust"]``. ``raters``: what the web layer knows about each rater (user
    id -> RaterInfo); None, or a rater missing from it, means "auto" with an unknown age, which is
    not treated as new (rlhf.trust.crowd.is_new)."""
    if not settings.trust.enabled:
        return bundle
    return trusted_bundle(bundle, raters, settings.trust)


@dataclass(frozen=True)
class PreparedData:
    """The data stage's outcome, computed once (:func:`prepare_cycle`) and handed to the other stages
    (:func:`run_prepared`): the datasets weighed by their raters, the settings sized to them, what
    sizing changed, and how long the stage took."""

    bundle: DatasetBundle
    settings: CycleSettings
    notes: tuple[str, ...] = ()
    seconds: float = 0.0


def prepare_cycle(conversations: list[ConversationRecord], settings: CycleSettings,
                  raters: Mapping[int, RaterInfo] | None = None) -> PreparedData:
    """The data stage: the records' datasets, weighed by their raters (``weigh_raters``), and
    ``settings`` sized to them (``fit_to_data``). Raises NotEnoughData (before any training) if a
    stage could not use them."""
    t0 = time.perf_counter()
    check_settings(settings)
    bundle = weigh_raters(build_datasets(conversations, settings.data), settings, raters)
    sized, notes = fit_to_data(settings, bundle)
    return PreparedData(bundle, sized, tuple(notes), time.perf_counter() - t0)


def prepare_data(conversations: list[ConversationRecord], settings: CycleSettings,
                 raters: Mapping[int, RaterInfo] | None = None) -> DatasetBundle:
    """The datasets of :func:`prepare_cycle` alone (raises NotEnoughData like it)."""
    return prepare_cycle(conversations, settings, raters).bundle


def heldout_evidence(bundle: DatasetBundle) -> list[dict]:
    """The held-out user judgments the gate compares candidate and parent on: the held-out
    preference pairs and the held-out rated pairs (a liked answer over a disliked one to another
    held-out question), never the mismatched ones (they test relevance, which no user stated)."""
    return bundle.pairs["eval"] + [r for r in bundle.rated["eval"] if r["source"] == "rated"]


def heldout_questions(bundle: DatasetBundle) -> int:
    """How many distinct questions the held-out evidence judges answers to (a rated pair counts the
    questions of both its sides)."""
    firsts = {question_key(r["prompt"][0]["content"]) for r in bundle.pairs["eval"] if r["prompt"]}
    for r in bundle.rated["eval"]:
        firsts |= {question_key(r[k][0]["content"]) for k in ("chosen_prompt", "rejected_prompt") if r.get(k)}
    return len(firsts)


def judge_skipped(bundle: DatasetBundle, settings: CycleSettings) -> str | None:
    """Why the cycle trains no judge (too few held-out pairs, or questions), or None to train one."""
    pairs, questions = len(heldout_evidence(bundle)), heldout_questions(bundle)
    if pairs < settings.gate.min_heldout_pairs:
        return f"{pairs} held-out pairs, the gate needs at least {settings.gate.min_heldout_pairs}"
    if questions < settings.evaluation.judge_min_questions:
        return (f"the held-out pairs ask {questions} questions, a judge needs at least "
                f"{settings.evaluation.judge_min_questions} (evaluation.judge_min_questions)")
    return None


def evaluation_prompts(heldout: list, train: list, settings: CycleSettings,
                       judge: bool = True) -> tuple[list, int, list[str]]:
    """The prompts the gate samples, how many of the first ones the judge's gain is measured on, and
    notes. The judge scores only answers to held-out questions, the ones it learned from: a judge
    of three questions scoring the answers to thirteen others extrapolates (on a deployment of 16
    questions it passed a candidate that ground truth called worse, and called worse one that ground
    truth put 14 points ahead). With fewer than ``evaluation.min_judged_prompts`` held-out prompts
    each is asked again until there are that many, so the signed-rank test has the units to reach
    a verdict about those questions (not when no ``judge`` was trained); with fewer than
    ``min_prompts``, the training prompts join for the KL and degeneration checks, which look at
    every answer."""
    notes: list[str] = []
    heldout = heldout[: settings.evaluation.max_prompts]
    prompts = list(heldout)
    if judge and heldout and len(heldout) < settings.evaluation.min_judged_prompts:
        times = -(-settings.evaluation.min_judged_prompts // len(heldout))
        prompts = [p for p in heldout for _ in range(times)]
        notes.append(f"{len(heldout)} held-out prompts, each asked {times} times for the judge")
    judged = len(prompts)
    if len(heldout) < settings.min_prompts:  # too few held-out prompts: say so, use training ones
        notes.append(f"only {len(heldout)} held-out prompts; adding training prompts for the KL and "
                     "degeneration checks")
        prompts = prompts + train
    return prompts, judged, notes


def train_judge(parent_dir: str | Path, bundle: DatasetBundle, out_dir: str | Path, settings: CycleSettings,
                progress: ProgressFn | None = None) -> dict[str, Any]:
    """The gate's judge: a reward model trained on the held-out pairs alone. Neither the policy nor
    the run's reward model saw them, so the policy was never optimized against it. Its accuracy is
    measured on training pairs it never saw (at most ``evaluation.max_pairs``)."""
    held_out = bundle.pairs["eval"]
    n = len(held_out) + len(bundle.rated["eval"])
    steps = settings.evaluation.judge_min_steps
    reward = replace(settings.reward, batch_size=max(1, min(settings.reward.batch_size, n)),
                     min_steps=settings.reward.min_steps if steps < 0 else steps)
    metrics = train_reward_model(parent_dir, held_out, bundle.pairs["train"][: settings.evaluation.max_pairs],
                                 out_dir, reward, settings.device, progress, stage="judge",
                                 rated_rows=bundle.rated["eval"])
    return {"trained_on_pairs": metrics["train_pairs"] + metrics["rated_pairs"], "steps": metrics["steps"],
            "questions": heldout_questions(bundle),
            "accuracy": None if metrics["heldout_accuracy"] is None else round(metrics["heldout_accuracy"], 4),
            "accuracy_pairs": metrics["eval_pairs"]}


def describe_trust(trust: dict[str, Any]) -> str:
    """Rater trust (``counts["trust"]``) in one log line."""
    rules = trust["rules"]
    parts = [f"{rules[name]['raters']} {words} ({rules[name]['share_removed']:.0%} of the signal)"
             for name, words in (("quarantined", "quarantined"), ("capped", "capped"),
                                 ("down_weighted", "down-weighted"), ("new", "new")) if rules[name]["raters"]]
    reliability = "" if trust["applied"].get("reliability") else "; reliability not applied"
    return (f"rater trust: {len(trust['raters'])} raters, {trust['weight_kept']:.0%} of the signal kept"
            + (": " + ", ".join(parts) if parts else "") + reliability)


def describe_criteria(criteria: dict[str, Any]) -> str:
    """The reward model's criterion heads in one log line."""
    trained = [f"{name} (held-out accuracy {criteria['heldout_accuracy'].get(name)})" for name in criteria["heads"][1:]]
    left = [f"{name}: {why}" for name, why in criteria.get("left_out", {}).items()]
    return ("criteria: " + (", ".join(trained) if trained else "no criterion head")
            + ("; left out: " + "; ".join(left) if left else ""))


def describe(evaluation: dict[str, Any]) -> str:
    """The gate's outcome in one log line."""
    h, judge = evaluation["heldout"], evaluation.get("judge")
    share = "–" if h["share"] is None else f"{h['share']:.0%}"
    judged = "–" if judge is None else \
        f"{judge['gain']} (p = {judge['p_value']:.3g}{'' if judge['trusted'] else ', not counted'})"
    risk = evaluation.get("flag_risk")
    flagged = "" if not risk else f"; predicted flag rate {risk['parent']:.1%} -> {risk['candidate']:.1%}"
    return (f"evaluate: {evaluation['verdict']}; held-out preferences {h['wins']} of {h['pairs']} pairs "
            f"(share {share}, p = {h['p_value']:.3g}); judge gain {judged}; optimized-against reward gain "
            f"{evaluation['reward_gain']} (reported only); KL {evaluation['kl_from_parent']}{flagged}"
            + ("" if evaluation["passed"] else ": " + "; ".join(evaluation["reasons"])))


def run_cycle(conversations: list[ConversationRecord], parent_dir: str | Path, reward_dir: str | Path,
              policy_dir: str | Path, settings: CycleSettings = CycleSettings(),
              progress: ProgressFn | None = None, log: LogFn | None = None, logs: TrainingLogs | None = None,
              raters: Mapping[int, RaterInfo] | None = None) -> CycleResult:
    """Run every stage on the records: :func:`prepare_cycle`, then :func:`run_prepared` (see there).
    Raises NotEnoughData before any training when the data cannot support it. ``raters``: what is
    known about each rater (rlhf.trust)."""
    return run_prepared(prepare_cycle(conversations, settings, raters), parent_dir, reward_dir, policy_dir,
                        progress, log, logs)


def run_prepared(prepared: PreparedData, parent_dir: str | Path, reward_dir: str | Path, policy_dir: str | Path,
                 progress: ProgressFn | None = None, log: LogFn | None = None,
                 logs: TrainingLogs | None = None) -> CycleResult:
    """Run every stage after the data stage, on its outcome as it is. Writes the reward model to
    ``reward_dir`` and the new policy to ``policy_dir`` (both must not exist yet or be empty).
    ``logs``: where every trainer's per-step logs go as they are logged (training curves,
    TensorBoard; rlhf.training.curves)."""
    settings, bundle = prepared.settings, prepared.bundle
    say = log or (lambda line: None)
    if is_adapter(parent_dir):
        # A LoRA version as parent: every stage gets it as a plain model (merged into a temporary
        # directory), and a LoRA policy is saved merged (an adapter can only name a stored base).
        Path(policy_dir).parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".parent-", dir=Path(policy_dir).parent) as merged:
            model, tokenizer = load_causal_lm(parent_dir, "cpu", setting="parent version")
            model.save_pretrained(merged)
            tokenizer.save_pretrained(merged)
            del model
            say(f"parent {Path(parent_dir).name} is a LoRA adapter version: trained on its merged weights"
                + ("; the new LoRA policy is saved merged" if settings.policy.lora else ""))
            merging = replace(settings, policy=replace(settings.policy, lora_merge=True))
            return run_prepared(replace(prepared, settings=merging), merged, reward_dir, policy_dir, progress, log,
                                logs)
    report = progress or (lambda *a: None)
    timings: dict[str, float] = {}
    peaks: dict[str, float] = {}
    gpu_peaks: dict[str, float] = {}
    on_gpu = torch.cuda.is_available() and resolve_device(settings.device).type == "cuda"

    def peak() -> float:
        if on_gpu:  # the stage just ended: its GPU peak, then start the next stage's from zero
            gpu_peaks[STAGES[len(gpu_peaks)]] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
            torch.cuda.reset_peak_memory_stats()
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)

    report("data", 0, 1)
    for note in prepared.notes:
        say(f"sized to the data: {note}")
    timings["data"] = prepared.seconds  # the stage ran before (prepare_cycle): its own time
    peaks["data"] = peak()
    report("data", 1, 1)
    say(f"data: {bundle.counts['pairs']['train']} train / {bundle.counts['pairs']['eval']} held-out pairs, "
        f"{bundle.counts['prompts']['train']} train / {bundle.counts['prompts']['eval']} held-out prompts")
    if "trust" in bundle.counts:
        say(describe_trust(bundle.counts["trust"]))

    t0 = time.perf_counter()
    reward_metrics = train_reward_model(parent_dir, bundle.pairs["train"], bundle.pairs["eval"], reward_dir,
                                        settings.reward, settings.device, report, logs,
                                        criteria_rows=bundle.criteria, criteria=settings.criteria,
                                        rated_rows=bundle.rated["train"])
    timings["reward"] = time.perf_counter() - t0
    peaks["reward"] = peak()
    say(f"reward model: held-out accuracy {reward_metrics['heldout_accuracy']}, "
        f"train accuracy {reward_metrics['train_accuracy']} ({reward_metrics['train_pairs']} pairs and "
        f"{reward_metrics['rated_pairs']} rated pairs across questions)")
    say(describe_criteria(reward_metrics["criteria"]))

    t0 = time.perf_counter()
    train_prompts = policy_prompts(bundle)
    algo = settings.algorithm
    policy_metrics = algorithm(algo).train(PolicyJob(parent_dir, reward_dir, policy_dir, bundle, train_prompts,
                                                     settings, report, logs))
    timings["policy"] = time.perf_counter() - t0
    peaks["policy"] = peak()
    say(f"policy ({algo}): " + str({k: v for k, v in policy_metrics.items() if k != "constraint"}))
    if policy_metrics.get("constraint"):
        c = policy_metrics["constraint"]
        say(f"safety constraint: cost {c['cost_first']} -> {c['cost_last']} (limit {c['limit']}), "
            f"lambda {c['lambda_first']} -> {c['lambda_last']} (max {c['lambda_max']}) over {c['batches']} batches")

    t0 = time.perf_counter()
    held_out = heldout_evidence(bundle)
    Path(policy_dir).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".judge-", dir=Path(policy_dir).parent) as scratch:
        judge_dir, judge_info = None, None
        report("judge", 0, 1)
        skipped = judge_skipped(bundle, settings)
        if skipped is None:
            judge_dir = Path(scratch) / "judge"
            judge_info = train_judge(parent_dir, bundle, judge_dir, settings, report)
            say(f"judge: reward model trained on {judge_info['trained_on_pairs']} held-out pairs "
                f"({judge_info['questions']} questions), accuracy "
                f"{judge_info['accuracy']} on {judge_info['accuracy_pairs']} training pairs it never saw")
        else:
            say(f"judge: not trained: {skipped}")
        report("judge", 1, 1)
        timings["judge"] = time.perf_counter() - t0
        peaks["judge"] = peak()
        if not distributed.is_main():  # the gate is the main process's alone; this process's part is done
            return CycleResult(counts=bundle.counts, reward=reward_metrics, policy=policy_metrics, evaluation={},
                               timings={k: round(v, 2) for k, v in timings.items()}, peak_rss_mb=peaks)

        t0 = time.perf_counter()
        eval_prompts, judged, notes = evaluation_prompts([r["prompt"] for r in bundle.prompts["eval"]],
                                                         train_prompts, settings, judge=judge_dir is not None)
        for note in notes:
            say(f"evaluate: {note}")
        evaluation = evaluate_candidate(policy_dir, parent_dir, reward_dir, eval_prompts, settings.gate,
                                        settings.evaluation, settings.device, report, heldout_pairs=held_out,
                                        judge_dir=judge_dir, judge_info=judge_info, judged_prompts=judged,
                                        max_length=settings.policy.max_length)
    timings["evaluate"] = time.perf_counter() - t0
    peaks["evaluate"] = peak()
    say(describe(evaluation))
    return CycleResult(counts=bundle.counts, reward=reward_metrics, policy=policy_metrics, evaluation=evaluation,
                       timings={k: round(v, 2) for k, v in timings.items()}, peak_rss_mb=peaks,
                       peak_gpu_mb=gpu_peaks)


@dataclass(frozen=True)
class CycleJob:
    """What the main process sends the others when it trains with several (rlhf.training.distributed): the
    data stage's outcome (the data it read, weighed and sized, and the sized settings) and where the
    stages write (a filesystem every process sees). Every process trains on exactly these, never on its
    own read of the database: feedback arriving in between would give the processes different data,
    and DDP different-length loops."""

    parent_dir: str
    reward_dir: str
    policy_dir: str
    prepared: PreparedData


def follow_main() -> CycleResult | None:
    """A process other than the main one: wait for the main process's job and run the distributed
    stages of the cycle with it (reward model, policy, judge; no progress, logs or files of its
    own). None when the main process had nothing to train (the run was refused)."""
    job: CycleJob | None = distributed.broadcast(None)
    if job is None:
        return None
    return run_prepared(job.prepared, job.parent_dir, job.reward_dir, job.policy_dir)
