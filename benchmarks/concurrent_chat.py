"""Many users chatting at once on the real production server (``flask --app webapp serve``).

For 1, 4 and 16 concurrent users (each with its own cookie session and conversation, rate
limits off), every user sends ``--messages`` questions back to back, each a streamed answer
read to its ``done`` event. Per level: total tokens/s (the answers' ``token_count`` summed over
all users / wall time from the first question to the last answer), latency per answer
(question sent -> ``done``; p50/p95), time to first token (p50/p95) and errors (non-2xx,
``error`` events, broken streams). Levels run one after the other in each repeat, so the
16-user / 1-user throughput ratio is measured in the same conditions; the summary is the
median over ``--repeats``.

    .venv/bin/python benchmarks/concurrent_chat.py [--model DIR] [--users 1 4 16] [--messages 6]
        [--repeats 3] [--threads N] [--inference-threads N] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import requests  # noqa: E402

from rlhf.data.corpus import sample_prompts  # noqa: E402
from tests.support.app import make_app, register_model  # noqa: E402
from tests.support.live_server import LiveServer  # noqa: E402
from tests.support.models import cached_model  # noqa: E402


class User:
    def __init__(self, url: str) -> None:
        self.url = url
        self.s = requests.Session()
        self.csrf = self.s.get(url + "/api/session", timeout=60).json()["csrf_token"]
        self.conv = self.s.post(url + "/api/conversations", json={}, headers={"X-CSRFToken": self.csrf},
                                timeout=60).json()["id"]

    def ask(self, prompt: str) -> dict:
        """One streamed answer: {'ok', 'tokens', 'latency_ms', 'ttft_ms', 'error'}."""
        start = time.perf_counter()
        first = None
        done = None
        try:
            # parent_id None: every question starts a new thread, so all answers have the same kind of prompt
            with self.s.post(f"{self.url}/api/conversations/{self.conv}/messages",
                             json={"content": prompt, "parent_id": None}, headers={"X-CSRFToken": self.csrf},
                             stream=True, timeout=120) as resp:
                if resp.status_code != 200:
                    return {"ok": False, "error": f"HTTP {resp.status_code}: {resp.text[:200]}"}
                event = None
                for line in resp.iter_lines(decode_unicode=True):
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: "):
                        if event == "token" and first is None:
                            first = time.perf_counter()
                        elif event == "done":
                            done = json.loads(line[6:])
                        elif event == "error":
                            return {"ok": False, "error": line[6:]}
        except requests.RequestException as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        end = time.perf_counter()
        if done is None:
            return {"ok": False, "error": "stream ended without a done event"}
        return {"ok": True, "tokens": done["token_count"], "latency_ms": (end - start) * 1000,
                "ttft_ms": (first - start) * 1000 if first is not None else None}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def run_level(users: list[User], messages: int, prompts: list[str]) -> dict:
    results: list[list[dict]] = [[] for _ in users]
    barrier = threading.Barrier(len(users) + 1)

    def chat(i: int) -> None:
        barrier.wait()
        for j in range(messages):
            results[i].append(users[i].ask(prompts[(i * messages + j) % len(prompts)]))

    threads = [threading.Thread(target=chat, args=(i,)) for i in range(len(users))]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    rows = [r for user in results for r in user]
    ok = [r for r in rows if r["ok"]]
    latencies = [r["latency_ms"] for r in ok]
    ttfts = [r["ttft_ms"] for r in ok if r["ttft_ms"] is not None]
    return {"users": len(users), "answers": len(ok), "errors": len(rows) - len(ok),
            "error_samples": [r["error"] for r in rows if not r["ok"]][:3],
            "tokens": sum(r["tokens"] for r in ok), "wall_s": round(wall, 2),
            "tokens_per_s": sum(r["tokens"] for r in ok) / wall,
            "latency_p50_ms": percentile(latencies, 0.5), "latency_p95_ms": percentile(latencies, 0.95),
            "ttft_p50_ms": percentile(ttfts, 0.5), "ttft_p95_ms": percentile(ttfts, 0.95)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="model directory (default: build/reuse the embedded model)")
    ap.add_argument("--users", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--messages", type=int, default=6, help="questions per user per level")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, help="server request threads (default: serve's default)")
    ap.add_argument("--inference-threads", type=int,
                    help="server's torch threads, RLHF_INFERENCE_THREADS (default: its default)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    model_dir = args.model or cached_model("default")
    instance = Path(tempfile.mkdtemp(prefix="bench-concurrent-")) / "instance"
    register_model(make_app(instance), model_dir)
    env = {"RLHF_DEVICE": "cpu", "RLHF_RATELIMIT_ENABLED": "0"}
    if args.inference_threads is not None:
        env["RLHF_INFERENCE_THREADS"] = str(args.inference_threads)
    server = LiveServer(instance, env=env, args=["--threads", str(args.threads)] if args.threads else None)
    prompts = sample_prompts(50)
    runs: list[dict] = []
    try:
        pool = [User(server.url) for _ in range(max(args.users))]
        run_level(pool[:2], 2, prompts)  # warm-up: model load, first requests
        for repeat in range(args.repeats):
            for n in args.users:
                level = run_level(pool[:n], args.messages, prompts)
                level["repeat"] = repeat
                runs.append(level)
                if not args.json:
                    print(f"repeat {repeat} users {n:>2}: {level['tokens_per_s']:7.1f} tok/s, latency p50 "
                          f"{level['latency_p50_ms']:.0f} ms p95 {level['latency_p95_ms']:.0f} ms, "
                          f"errors {level['errors']}", file=sys.stderr)
    finally:
        server.stop()

    summary = {}
    for n in args.users:
        mine = [r for r in runs if r["users"] == n]
        summary[str(n)] = {key: statistics.median(r[key] for r in mine if r[key] is not None)
                           for key in ("tokens_per_s", "latency_p50_ms", "latency_p95_ms", "ttft_p50_ms",
                                       "ttft_p95_ms")}
        summary[str(n)]["errors"] = sum(r["errors"] for r in mine)
        summary[str(n)]["answers"] = sum(r["answers"] for r in mine)
    base = min(args.users)
    ratios = {}
    for n in args.users:
        per_repeat = [next(r for r in runs if r["users"] == n and r["repeat"] == k)["tokens_per_s"]
                      / next(r for r in runs if r["users"] == base and r["repeat"] == k)["tokens_per_s"]
                      for k in range(args.repeats)]
        ratios[str(n)] = statistics.median(per_repeat)
    # the target: 16 users together get at least 1.5x one user's throughput, without errors
    targets = {str(n): ">= 1.5x" for n in args.users if n >= 16}
    met = {n: ratios[n] >= 1.5 and summary[n]["errors"] == 0 for n in targets}
    result = {"model": str(model_dir), "messages_per_user": args.messages, "repeats": args.repeats,
              "targets": targets, "met_by_level": met,
              "server_threads": args.threads or "serve default",
              "inference_threads": args.inference_threads if args.inference_threads is not None else "default",
              "summary": summary,
              f"throughput_vs_{base}_user": ratios, "runs": runs}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{'users':>5}{'tokens/s':>10}{'x 1 user':>10}{'latency p50':>13}{'p95 ms':>8}{'TTFT p50':>10}"
          f"{'p95 ms':>8}{'errors':>8}")
    for n in args.users:
        r = summary[str(n)]
        print(f"{n:>5}{r['tokens_per_s']:>10.1f}{ratios[str(n)]:>10.2f}{r['latency_p50_ms']:>13.0f}"
              f"{r['latency_p95_ms']:>8.0f}{r['ttft_p50_ms']:>10.0f}{r['ttft_p95_ms']:>8.0f}{r['errors']:>8}")


if __name__ == "__main__":
    main()
