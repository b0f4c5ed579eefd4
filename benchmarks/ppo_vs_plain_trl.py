"""Our PPO stage (rlhf.policy.ppo.train_ppo) vs a plain TRL PPO script, side by side.

Same policy, reward model, prompts and PPO settings; after a short warm-up of each, runs
alternate, and so does which of the two goes first; medians of wall time (the ratio) and CPU time
(less sensitive to other processes on shared cores).
The plain script is what a TRL user would write from the PPOTrainer docs: tokenize prompts,
build PPOConfig, PPOTrainer(...).train(), save the policy.

    .venv/bin/python benchmarks/ppo_vs_plain_trl.py [--repeats 5] [--episodes 256] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer  # noqa: E402

from benchmarks.stage_timing import preference_pairs, stage_result, time_side_by_side  # noqa: E402
from rlhf.data import corpus  # noqa: E402
from rlhf.policy import train_ppo  # noqa: E402
from rlhf.reward.training import train_reward_model  # noqa: E402
from rlhf.settings import PolicySettings, RewardSettings  # noqa: E402
from tests.support.models import cached_model  # noqa: E402

TARGET_RATIO = 1.05


def plain_trl_ppo(policy_dir: Path, reward_dir: Path, prompts: list[list[dict]], out_dir: Path,
                  s: PolicySettings) -> None:
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    torch.manual_seed(s.seed)
    tok = AutoTokenizer.from_pretrained(policy_dir, padding_side="left")
    policy = AutoModelForCausalLM.from_pretrained(policy_dir)
    ref = AutoModelForCausalLM.from_pretrained(policy_dir)
    reward = AutoModelForSequenceClassification.from_pretrained(reward_dir, num_labels=1)
    value = AutoModelForSequenceClassification.from_pretrained(reward_dir, num_labels=1)
    ds = Dataset.from_dict({"input_ids": [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True)
                                          ["input_ids"] for p in prompts]})
    with tempfile.TemporaryDirectory() as scratch:
        cfg = PPOConfig(output_dir=scratch, learning_rate=s.learning_rate, per_device_train_batch_size=s.batch_size,
                        num_mini_batches=s.mini_batches, total_episodes=s.episodes, num_ppo_epochs=s.ppo_epochs,
                        response_length=s.response_length, stop_token="eos", missing_eos_penalty=s.missing_eos_penalty,
                        kl_coef=s.kl_coef, temperature=s.temperature, num_sample_generations=0,
                        local_rollout_forward_batch_size=s.batch_size, report_to=[], save_strategy="no",
                        use_cpu=True, seed=s.seed, logging_steps=1, disable_tqdm=True)
        trainer = PPOTrainer(args=cfg, processing_class=tok, model=policy, ref_model=ref, reward_model=reward,
                             train_dataset=ds, value_model=value)
        trainer.train()
        trainer.save_model(str(out_dir))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    args = ap.parse_args()
    policy_dir = cached_model("default")
    work = Path(tempfile.mkdtemp(prefix="bench-ppo-"))

    pairs = preference_pairs(120, 0)
    train_reward_model(policy_dir, pairs, [], work / "reward", RewardSettings(), device="cpu")
    prompts = [[{"role": "user", "content": q}] for q in corpus.sample_prompts(128)]
    settings = PolicySettings(episodes=args.episodes)

    def ours(i: int) -> None:
        train_ppo(policy_dir, work / "reward", prompts, work / f"ours-{i}", settings, device="cpu")

    def plain(i: int) -> None:
        plain_trl_ppo(policy_dir, work / "reward", prompts, work / f"plain-{i}", settings)

    # warm-up: both once, one PPO batch, so that first-use costs (imports, lazy initialisation) land on neither
    short = PolicySettings(episodes=settings.batch_size, max_steps=1)
    train_ppo(policy_dir, work / "reward", prompts, work / "warm-ours", short, device="cpu")
    plain_trl_ppo(policy_dir, work / "reward", prompts, work / "warm-plain", short)
    result = {"stage": "ppo", "episodes": args.episodes, "repeats": args.repeats,
              **stage_result(time_side_by_side(ours, plain, args.repeats), TARGET_RATIO)}
    print(f"PPO stage, {args.episodes} episodes, median of {args.repeats}: ours {result['ours_s']:.1f} s, "
          f"plain TRL {result['plain_trl_s']:.1f} s, ratio {result['ratio']:.3f} "
          f"(CPU time ratio {result['cpu_ratio']:.3f}; target <= {TARGET_RATIO})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))

if __name__ == "__main__":
    main()
