"""What the /v1 API costs a streamed answer: ``POST /v1/chat/completions`` (``stream: true``) against the
chat page's own stream (``POST /api/conversations/<id>/messages``), on one server, the same model and
settings, the same prompts, alternating which goes first.

One production server (``flask --app webapp serve``) with rate limits off. The page side is one visitor
asking each prompt as a new question (``parent_id: null``); the /v1 side one API key sending the same
prompt as a one-message conversation, sampled with the instance's settings like the page (each side
stores its answer as a conversation turn). Both are read with ``requests`` the same way. Reports per
side the median time to first token, the aggregate rate (all answer tokens / all answer time, from
the request to the last byte), the median streaming rate after the first token, and the ratios /v1 /
page, with /proc/loadavg before and after (target: the /v1 rate within 5 % of the page's).

    .venv/bin/python benchmarks/v1_overhead.py [--model DIR] [--runs 30] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
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


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def streamed_v1(session: requests.Session, url: str, key: str, prompt: str) -> tuple[float, float, int, float]:
    """(TTFT ms, total s through ``data: [DONE]``, completion tokens, first-to-last content chunk s)."""
    start = time.perf_counter()
    first = last = None
    usage = None
    with session.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, stream=True,
                      timeout=60, json={"model": "rlhf-chat", "stream": True, "stream_options": {"include_usage": True},
                                        "messages": [{"role": "user", "content": prompt}]}) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines(decode_unicode=True):
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                last = time.perf_counter()
                first = first or last
            if chunk.get("usage"):
                usage = chunk["usage"]
    total = time.perf_counter() - start
    return (first - start) * 1000, total, usage["completion_tokens"], last - first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="model directory (default: build/reuse the embedded model)")
    ap.add_argument("--runs", type=int, default=30, help="answers per side")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    model_dir = args.model or cached_model("default")
    instance = Path(tempfile.mkdtemp(prefix="bench-v1-")) / "instance"
    app = make_app(instance)
    register_model(app, model_dir)
    from webapp.openai_api.keys import create_api_key

    with app.app_context():
        key = create_api_key("bench")[1]
    load_before = loadavg()
    server = LiveServer(instance, env={"RLHF_DEVICE": "cpu", "RLHF_RATELIMIT_ENABLED": "0",
                                       "RLHF_INFERENCE_THREADS": "1"})
    rows: dict[str, list] = {"page": [], "v1": []}
    try:
        page = requests.Session()
        csrf = page.get(server.url + "/api/session").json()["csrf_token"]
        conv = page.post(server.url + "/api/conversations", json={}, headers={"X-CSRFToken": csrf}).json()["id"]
        api = requests.Session()
        sides = {"page": lambda p: streamed_http(page, server.url, csrf, conv, p),
                 "v1": lambda p: streamed_v1(api, server.url, key, p)}
        prompts = sample_prompts(10)
        for p in prompts[:3]:  # warm-up (model load, allocator, caches)
            for ask in sides.values():
                ask(p)
        order = list(sides)
        for i in range(args.runs):
            p = prompts[i % len(prompts)]
            for name in (order if i % 2 == 0 else order[::-1]):  # alternate which side goes first
                rows[name].append(sides[name](p))
    finally:
        server.stop()
    load_after = loadavg()

    def summary(r: list) -> dict:
        return {"ttft_ms": statistics.median(x[0] for x in r),
                "tokens_per_s": sum(x[2] for x in r) / sum(x[1] for x in r),  # all tokens / all answer time
                "stream_tokens_per_s": statistics.median((x[2] - 1) / x[3] for x in r if x[2] > 1 and x[3] > 0),
                "tokens": statistics.median(x[2] for x in r), "answers": len(r)}

    page_s, v1_s = summary(rows["page"]), summary(rows["v1"])
    ratio = v1_s["tokens_per_s"] / page_s["tokens_per_s"]
    result = {"runs": args.runs, "model": str(model_dir), "page": page_s, "v1": v1_s,
              "tokens_per_s_ratio": ratio, "stream_rate_ratio": v1_s["stream_tokens_per_s"] / page_s[
                  "stream_tokens_per_s"], "ttft_ratio": v1_s["ttft_ms"] / page_s["ttft_ms"],
              "target": "v1 tokens/s >= 0.95 x the page's", "met": ratio >= 0.95,
              "loadavg_before": load_before, "loadavg_after": load_after}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{'':6}{'TTFT ms':>10}{'tokens/s':>10}{'stream t/s':>12}{'tokens':>8}")
    for name, r in (("page", page_s), ("/v1", v1_s)):
        print(f"{name:6}{r['ttft_ms']:>10.1f}{r['tokens_per_s']:>10.1f}{r['stream_tokens_per_s']:>12.1f}"
              f"{r['tokens']:>8.0f}")
    print(f"/v1 / page: tokens/s x{ratio:.3f} ({'met' if result['met'] else 'missed'}: target >= 0.95), "
          f"streaming rate x{result['stream_rate_ratio']:.3f}, TTFT x{result['ttft_ratio']:.3f}; "
          f"loadavg before {load_before}, after {load_after}")


if __name__ == "__main__":
    main()
