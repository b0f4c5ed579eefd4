"""One full `rl-train` cycle on the embedded model with a few hundred stored feedback events.

A fresh instance gets the embedded base model; simulated users ask corpus questions, the
*real model* answers (two sibling answers each), and the users rate them with a preference
function (thumbs, stars, some corrections and compare votes). Then `flask --app webapp
rl-train --json` runs as its own process; the script prints its summary, wall time and peak
memory per stage.

    .venv/bin/python benchmarks/train_cycle.py [--conversations 150] [--preference polite] [--lora]
        [--device cpu|cuda] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from rlhf.generation import GenerationSettings, ModelPool, generate_chat  # noqa: E402
from tests.support.app import make_app, register_model  # noqa: E402
from tests.support.feedback_factory import seed_feedback  # noqa: E402
from tests.support.models import cached_model  # noqa: E402


def model_answers(model_dir: Path):
    loaded = ModelPool("cpu").get(model_dir)
    settings = GenerationSettings()

    def answer(question: str, rng: random.Random) -> str:
        torch.manual_seed(rng.randrange(2**31))
        return generate_chat(loaded, [{"role": "user", "content": question}], settings).text

    return answer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", type=int, default=150)
    ap.add_argument("--preference", default="polite")
    ap.add_argument("--algorithm", default="ppo")
    ap.add_argument("--lora", action="store_true", help="train a LoRA adapter version")
    ap.add_argument("--device", default="cpu", help="RLHF_DEVICE of the rl-train process (cpu, cuda)")
    ap.add_argument("--instance", type=Path, help="instance folder (default: a new temporary one)")
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    args = ap.parse_args()

    model_dir = cached_model("default")
    instance = args.instance or Path(tempfile.mkdtemp(prefix="bench-train-")) / "instance"
    app = make_app(instance)
    register_model(app, model_dir)
    t0 = time.perf_counter()
    events = seed_feedback(app, args.conversations, args.preference, answer_fn=model_answers(model_dir))
    seed_s = time.perf_counter() - t0

    env = {**os.environ, "RLHF_INSTANCE_DIR": str(instance), "RLHF_DEVICE": args.device}
    cmd = [sys.executable, "-m", "flask", "--app", "webapp", "rl-train",
           "--algorithm", args.algorithm, "--json", "--min-feedback", "1"] + (["--lora"] if args.lora else [])
    t1 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t1
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the rl-train child (Linux: KB)
    if proc.returncode not in (0, 3):
        print(proc.stderr[-3000:], file=sys.stderr)
        sys.exit(proc.returncode)
    out = json.loads(proc.stdout)
    ev = out["evaluation"]
    print(f"feedback events: {events} ({args.conversations} conversations, preference {args.preference}, "
          f"seeded in {seed_s:.0f} s)")
    print(f"data counts: pairs {out['data_counts']['pairs']} by source {out['data_counts']['pairs_by_source']}, "
          f"prompts {out['data_counts']['prompts']}")
    print(f"reward model: held-out accuracy {out['reward_model']['heldout_accuracy']:.3f} "
          f"({out['reward_model']['eval_pairs']} held-out pairs), train {out['reward_model']['train_accuracy']:.3f}")
    heldout, judge = ev["heldout"], ev["judge"]
    print(f"evaluation gate: {ev['verdict']}; held-out pairs {heldout['wins']} of {heldout['pairs']} for the candidate "
          f"(sign test p {heldout['p_value']}), judge gain {judge['gain'] if judge else '–'}, combined p "
          f"{ev['evidence_p']}, KL {ev['kl_from_parent']}; optimized-against reward "
          f"{ev['before']['mean_reward']} -> {ev['after']['mean_reward']} "
          f"(gain {ev['optimized_against']['reward_gain']}, reported only)")
    print(f"version: {out['version']['name']} ({out['version']['status']}), decision {out['decision']}")
    gpu = out.get("peak_gpu_mb") or {}
    print("stage        wall s   peak RSS MB (process, so far)" + ("   peak GPU MB (stage)" if gpu else ""))
    for stage, secs in out["timings_s"].items():
        print(f"{stage:10} {secs:8.1f}   {out['peak_rss_mb'][stage]:8.0f}"
              + (f"   {gpu.get(stage, 0):8.0f}" if gpu else ""))
    print(f"whole rl-train process: {float(wall):.1f} s wall, peak RSS {int(peak_kb) / 1024:.0f} MB")
    if args.json:
        timings = out["timings_s"]
        args.json.write_text(json.dumps({
            "conversations": args.conversations, "preference": args.preference, "algorithm": args.algorithm,
            "lora": args.lora, "device": args.device,
            "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
            "feedback_events": events, "seed_s": round(seed_s, 1), "data_counts": out["data_counts"],
            "reward_model": out["reward_model"], "evaluation": ev, "decision": out["decision"],
            "timings_s": timings, "peak_rss_mb": out["peak_rss_mb"],
            "peak_gpu_mb": out.get("peak_gpu_mb"), "process_wall_s": float(wall),
            "process_peak_rss_mb": round(int(peak_kb) / 1024, 1),
            # what the cycle spends outside the two TRL training stages (process start, data,
            # evaluation gate, registering the version)
            "outside_trl_training_s": round(float(wall) - timings.get("reward", 0) - timings.get("policy", 0), 1)},
            indent=2, default=str))


if __name__ == "__main__":
    main()
