"""What the output rail costs a streamed answer: the same workload with the rail on and off.

Two real servers (``flask --app webapp serve``) on copies of the same model and settings, one with
``RLHF_RAIL_ENABLED=1`` (the default: the five personal-data presets plus ``--phrases`` blocked
phrases and ``--patterns`` patterns an admin might add, none of which the answers contain, so
every answer is checked in full and shown) and one with ``RLHF_RAIL_ENABLED=0``. One user asks
each server in turn (alternating which goes first), the same prompts. Reports the median time to
first token (first ``token`` event), total time (through the ``done`` event) and the streaming
rate, and the ratios rail on / off.

A third server (``--cost-head``, on by default) serves a version whose reward model has a safety head
(rlhf.reward.criteria_heads; trained here first on simulated feedback with flags, about 15 s): the rail then
also scores the text so far with the head at each sentence end before releasing it. Its threshold is
set above any probability, so the head is computed on every sentence and never blocks (a refusal
would shorten the answer and flatter the ratio).

    .venv/bin/python benchmarks/rail_cost.py [--model DIR] [--runs 30] [--no-cost-head] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import requests  # noqa: E402

from benchmarks.stream_vs_generate import streamed_http  # noqa: E402
from rlhf.data.corpus import sample_prompts  # noqa: E402
from tests.support.app import make_app, register_model  # noqa: E402
from tests.support.live_server import LiveServer  # noqa: E402
from tests.support.models import cached_model  # noqa: E402


def safety_reward_model(model_dir: Path) -> Path:
    """A reward model with criterion heads (a safety head among them) on ``model_dir``'s backbone."""
    from rlhf.data.datasets import build_datasets
    from rlhf.reward.training import train_reward_model
    from rlhf.settings import RewardSettings
    from rlhf.sim.users import Behaviour, simulate_records

    bundle = build_datasets(simulate_records([(30, 10, "direct", Behaviour(chip_prob=0.5, flag_prob=0.3))])[0])
    out = Path(tempfile.mkdtemp(prefix="bench-rail-reward-"))
    metrics = train_reward_model(model_dir, bundle.pairs["train"], bundle.pairs["eval"], out, RewardSettings(), "cpu",
                                 criteria_rows=bundle.criteria)
    assert "safety" in metrics["criteria"]["heads"], metrics["criteria"]
    return out


def server(model_dir: Path, rail: bool, phrases: int, patterns: int, reward_dir: Path | None = None) -> LiveServer:
    name = "cost" if reward_dir else "on" if rail else "off"
    instance = Path(tempfile.mkdtemp(prefix=f"bench-rail-{name}-")) / "instance"
    app = make_app(instance)
    register_model(app, model_dir)
    from webapp.core.extensions import db
    from webapp.core.models import ModelVersion, RailRule

    with app.app_context():
        if rail:
            db.session.add_all([RailRule(kind="phrase", value=f"forbidden phrase number {i}") for i in range(phrases)])
            db.session.add_all([RailRule(kind="pattern", value=rf"secret[- ]?code[- ]?{i}\d{{4}}")
                                for i in range(patterns)])
        if reward_dir:  # the served version's reward model: the rail loads its safety head
            version = db.session.scalars(db.select(ModelVersion)).one()
            version.metrics = {"reward_model_path": str(reward_dir)}
        db.session.commit()
    return LiveServer(instance, env={"RLHF_DEVICE": "cpu", "RLHF_RATELIMIT_ENABLED": "0",
                                     "RLHF_INFERENCE_THREADS": "1", "RLHF_RAIL_ENABLED": "1" if rail else "0",
                                     **({"RLHF_RAIL_COST_THRESHOLD": "1.0"} if reward_dir else {})})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="model directory (default: build/reuse the embedded model)")
    ap.add_argument("--runs", type=int, default=30, help="answers per side")
    ap.add_argument("--phrases", type=int, default=20)
    ap.add_argument("--patterns", type=int, default=5)
    ap.add_argument("--no-cost-head", dest="cost_head", action="store_false",
                    help="leave out the third server (rail with a cost head)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    model_dir = args.model or cached_model("default")
    sides = {"rail_on": server(model_dir, True, args.phrases, args.patterns),
             "rail_off": server(model_dir, False, 0, 0)}
    if args.cost_head:
        sides["rail_cost_head"] = server(model_dir, True, args.phrases, args.patterns, safety_reward_model(model_dir))
    rows: dict[str, list] = {name: [] for name in sides}
    try:
        clients = {}
        for name, srv in sides.items():
            s = requests.Session()
            csrf = s.get(srv.url + "/api/session").json()["csrf_token"]
            conv = s.post(srv.url + "/api/conversations", json={}, headers={"X-CSRFToken": csrf}).json()["id"]
            clients[name] = (s, srv.url, csrf, conv)
        prompts = sample_prompts(10)
        for p in prompts[:3]:  # warm-up (model load, allocator, caches)
            for name in sides:
                streamed_http(*clients[name], p)
        order = list(sides)
        for i in range(args.runs):
            p = prompts[i % len(prompts)]
            for name in (order if i % 2 == 0 else order[::-1]):  # alternate the order of the sides
                rows[name].append(streamed_http(*clients[name], p))
    finally:
        for srv in sides.values():
            srv.stop()

    def summary(r):
        return {"ttft_ms": statistics.median(x[0] for x in r), "total_ms": statistics.median(x[1] * 1000 for x in r),
                "tokens_per_s": statistics.median((x[2] - 1) / x[3] for x in r if x[2] > 1 and x[3] > 0),
                "ms_per_token": statistics.median(x[1] * 1000 / x[2] for x in r if x[2] > 0),
                "tokens": statistics.median(x[2] for x in r)}

    on, off = summary(rows["rail_on"]), summary(rows["rail_off"])
    head = summary(rows["rail_cost_head"]) if "rail_cost_head" in rows else None
    result = {"runs": args.runs, "model": str(model_dir), "rules": {"presets": 5, "phrases": args.phrases,
                                                                      "patterns": args.patterns},
              "rail_on": on, "rail_off": off,
              "ttft_ratio": on["ttft_ms"] / off["ttft_ms"], "total_ratio": on["total_ms"] / off["total_ms"],
              # answers are sampled, so their lengths differ between the sides: time per token evens that out
              "per_token_ratio": on["ms_per_token"] / off["ms_per_token"],
              "ttft_overhead_ms": on["ttft_ms"] - off["ttft_ms"], "total_overhead_ms": on["total_ms"] - off["total_ms"],
              "load_average": os.getloadavg()}
    if head is not None:
        result["rail_cost_head"] = head
        result["cost_head_per_token_ratio"] = head["ms_per_token"] / off["ms_per_token"]
        result["cost_head_ttft_ratio"] = head["ttft_ms"] / off["ttft_ms"]
    # the rail is on by default, so it must cost little: at most 10 % of an answer's time (per token)
    result["target_per_token_ratio"] = "<= 1.10"
    result["met"] = result["per_token_ratio"] <= 1.10
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{'':10}{'TTFT ms':>10}{'total ms':>10}{'tokens/s':>10}{'tokens':>8}")
    for name, r in (("rail on", on), ("rail off", off)) + ((("cost head", head),) if head else ()):
        print(f"{name:10}{r['ttft_ms']:>10.1f}{r['total_ms']:>10.1f}{r['tokens_per_s']:>10.1f}{r['tokens']:>8.0f}")
    print(f"ratios on/off: TTFT {result['ttft_ratio']:.2f}, total {result['total_ratio']:.2f}, "
          f"per token {result['per_token_ratio']:.2f}; "
          f"load average {result['load_average']}")


if __name__ == "__main__":
    main()
