"""Our reward-model stage (rlhf.reward.training.train_reward_model) vs a plain TRL RewardTrainer script.

Same backbone (the embedded policy), same preference pairs (with margins), same settings (epochs as
our stage computes them, batch size, learning rate, schedule, warm-up, max length, reward centring,
seed); after a short warm-up of each, runs alternate, and so does which of the two goes first;
medians of wall time (the ratio) and of CPU time (less sensitive to other processes on shared
cores). The plain script is what a TRL user would write from the RewardTrainer docs: tokenizer +
AutoModelForSequenceClassification (num_labels=1), a Dataset of conversational pairs, RewardConfig,
RewardTrainer(...).train(), save. Our stage also scores the held-out pairs afterwards (the held-out
pairwise accuracy the cycle reports); that is part of its time.

    .venv/bin/python benchmarks/reward_vs_plain_trl.py [--repeats 5] [--pairs 120] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForSequenceClassification, AutoTokenizer  # noqa: E402

from benchmarks.stage_timing import preference_pairs, stage_result, time_side_by_side  # noqa: E402
from rlhf.models.loading import context_length  # noqa: E402
from rlhf.reward.training import train_reward_model  # noqa: E402
from rlhf.settings import RewardSettings  # noqa: E402
from tests.support.models import cached_model  # noqa: E402

TARGET_RATIO = 1.05


def plain_trl_reward(policy_dir: Path, pairs: list[dict], out_dir: Path, s: RewardSettings) -> None:
    from trl import RewardConfig, RewardTrainer

    tok = AutoTokenizer.from_pretrained(policy_dir)
    model = AutoModelForSequenceClassification.from_pretrained(policy_dir, num_labels=1)
    model.config.pad_token_id = tok.pad_token_id
    ds = Dataset.from_list(pairs)
    steps_per_epoch = math.ceil(len(pairs) / s.batch_size)  # our stage's epoch rule, so both train as long
    epochs = max(s.epochs, math.ceil(s.min_steps / max(1, steps_per_epoch)))
    with tempfile.TemporaryDirectory() as scratch:
        cfg = RewardConfig(output_dir=scratch, num_train_epochs=epochs, per_device_train_batch_size=s.batch_size,
                           learning_rate=s.learning_rate, max_length=min(s.max_length, context_length(model)),
                           center_rewards_coefficient=s.center_rewards_coefficient, lr_scheduler_type="linear",
                           warmup_steps=max(1, steps_per_epoch // 4), weight_decay=0.0, logging_steps=steps_per_epoch,
                           save_strategy="no", report_to=[], disable_tqdm=True, seed=s.seed, data_seed=s.seed,
                           use_cpu=True, dataloader_num_workers=0, bf16=False, fp16=False)
        trainer = RewardTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok)
        trainer.train()
        trainer.save_model(str(out_dir))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=120)
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    args = ap.parse_args()
    policy_dir = cached_model("default")
    work = Path(tempfile.mkdtemp(prefix="bench-reward-"))
    train, held_out = preference_pairs(args.pairs, 0), preference_pairs(max(8, args.pairs // 4), 1)
    settings = RewardSettings()

    accuracy, metrics = [], {}

    def ours(i: int) -> None:
        nonlocal metrics
        metrics = train_reward_model(policy_dir, train, held_out, work / f"ours-{i}", settings, device="cpu")
        accuracy.append(metrics["heldout_accuracy"])

    def plain(i: int) -> None:
        plain_trl_reward(policy_dir, train, work / f"plain-{i}", settings)

    # warm-up: both once, briefly, so that first-use costs (imports, lazy initialisation) land on neither
    short = RewardSettings(max_steps=2, min_steps=1)
    train_reward_model(policy_dir, train[:32], held_out[:8], work / "warm-ours", short, device="cpu")
    plain_trl_reward(policy_dir, train[:32], work / "warm-plain", short)
    times = time_side_by_side(ours, plain, args.repeats, before_each=lambda: torch.manual_seed(0))
    result = {"stage": "reward", "pairs": args.pairs, "held_out_pairs": len(held_out), "repeats": args.repeats,
              "steps": metrics["steps"], **stage_result(times, TARGET_RATIO),
              "heldout_accuracy": statistics.median(accuracy)}
    print(f"reward stage, {args.pairs} pairs ({metrics['steps']} steps), median of {args.repeats}: ours "
          f"{result['ours_s']:.1f} s, plain TRL {result['plain_trl_s']:.1f} s, ratio {result['ratio']:.3f} "
          f"(CPU time ratio {result['cpu_ratio']:.3f}; target <= {TARGET_RATIO}); "
          f"held-out accuracy {result['heldout_accuracy']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
