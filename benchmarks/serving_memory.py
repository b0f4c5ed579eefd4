"""Resident memory of serving control and variants together: full copies vs LoRA adapters.

A model store gets a base version, three LoRA adapter versions on it (rank 16 on the
attention and MLP projections, ``PolicySettings.lora_r``; random non-trivial weights, saved
the way ``rl-train --lora`` saves them) and one full-copy variant (the first adapter merged
into a plain model: what LoRA training saved before adapter versions existed). Each
configuration is loaded in a fresh process through the server's ``ModelPool``; every loaded
version answers two questions (greedy); then the process reports its resident memory (VmRSS)
and peak (VmHWM). Medians over ``--repeats`` processes per configuration.

Configurations: base alone (the baseline), base + full copy, base + 1/2/3 LoRA versions.
Reported: each extra variant's cost (RSS difference) vs its adapter's size (target: at most
twice the adapter plus 2 MiB, "about its adapter, not a whole model"), and the answers
check (the base answers the same everywhere, each adapter differently, the full copy like
the first adapter). ``--shapes`` adds a GPT-2-small-shaped model with random weights (no
download), where the difference between a copy and an adapter is large. Weights are
memory-mapped, so RSS is read after every version has answered (all pages touched).

    .venv/bin/python benchmarks/serving_memory.py [--shapes embedded gpt2-small] [--repeats 3] [--json FILE]
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

MIB = 1024 * 1024
QUESTIONS = ["How do I cook rice?", "What should I read next?"]
# Target ("about its adapter, not a whole model"): an extra LoRA variant costs at most twice its
# adapter's fp32 size plus a fixed allowance (its generation worker's buffers, the injected layers).
TARGET_FACTOR = 2.0
TARGET_SLACK_MIB = 2.0


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def measure(paths: list[str]) -> dict:
    """In this (fresh) process: load ``paths`` through ModelPool, let each answer, report memory."""
    import torch

    from rlhf.generation import GenerationSettings, ModelPool, generate_chat

    torch.set_num_threads(1)
    before_peft = _status_kib("VmRSS")
    importlib.import_module("peft")  # loaded by the first adapter; imported up front in every configuration
    # so that the library's own memory is not counted as the first adapter's cost

    rss_imports = _status_kib("VmRSS")
    pool = ModelPool("cpu")
    loaded = [pool.get(p) for p in paths]
    gc.collect()
    rss_loaded = _status_kib("VmRSS") / 1024  # loaded, before any answer
    settings = GenerationSettings(do_sample=False, max_new_tokens=24)
    answers, speed = [], []
    for lm in loaded:
        texts = [generate_chat(lm, [{"role": "user", "content": q}], settings).text for q in QUESTIONS]
        answers.append(texts)
    gc.collect()
    rss, peak = _status_kib("VmRSS") / 1024, _status_kib("VmHWM") / 1024
    for lm in loaded:  # throughput of each version (warm), greedy, no early stop
        timed = GenerationSettings(do_sample=False, max_new_tokens=32)
        t0, tokens = time.perf_counter(), 0
        for q in QUESTIONS * 2:
            tokens += generate_chat(lm, [{"role": "user", "content": q}], timed).token_count
        speed.append(round(tokens / (time.perf_counter() - t0), 1))
    return {"rss_mib": rss, "peak_mib": peak, "rss_after_imports_mib": rss_imports / 1024, "rss_loaded_mib": rss_loaded,
            "peft_import_mib": (rss_imports - before_peft) / 1024, "answers": answers, "tokens_per_s": speed}


# ---------------------------------------------------------------------------- the store

def synthetic_gpt2_small(model_dir: Path, out: Path) -> None:
    """GPT-2-small-shaped model (12 layers, 768 wide) with random weights and the embedded
    model's tokenizer: the size of a real small model, built without a download."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(model_dir)
    small = json.loads((model_dir / "config.json").read_text())
    cfg = GPT2Config(vocab_size=small["vocab_size"], n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                     bos_token_id=small["bos_token_id"], eos_token_id=small["eos_token_id"],
                     pad_token_id=small["pad_token_id"])
    torch.manual_seed(0)
    GPT2LMHeadModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)


def build_store(model_dir: Path, store: Path, adapters: int = 3) -> dict:
    import torch
    from peft import get_peft_model

    from rlhf.models import registry
    from rlhf.models.adapters import adapter_bytes
    from rlhf.models.loading import load_causal_lm
    from rlhf.policy.common import lora_config, save_policy
    from rlhf.settings import PolicySettings

    _, base, _ = registry.write_version(store, "base", lambda tmp: shutil.copytree(model_dir, tmp, dirs_exist_ok=True)
                                        and None, name="v1-base")
    settings = PolicySettings(lora=True)
    lora, params = [], 0
    for i in range(adapters):
        torch.manual_seed(100 + i)
        model, tok = load_causal_lm(base, "cpu")
        peft_model = get_peft_model(model, lora_config(model, settings))
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_" in name:  # large enough to change the greedy answers of either model
                    p.normal_(0, 0.1)
        params = sum(p.numel() for n, p in peft_model.named_parameters() if "lora_" in n)
        lora.append(registry.write_version(store, "ppo", lambda tmp: save_policy(peft_model, tok, tmp, base, settings),
                                           lineage={"parent": "v1-base"})[1])
    merged, tok = load_causal_lm(lora[0], "cpu")  # the first adapter as a full copy

    def write_full(tmp: Path) -> None:
        merged.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    full = registry.write_version(store, "ppo", write_full, lineage={"parent": "v1-base"})[1]
    base_params = sum(p.numel() for p in load_causal_lm(base, "cpu")[0].parameters())
    return {"base": str(base), "lora": [str(p) for p in lora], "full": str(full),
            "adapter_file_mib": round(adapter_bytes(lora[0]) / MIB, 3),
            "adapter_params": params, "adapter_param_mib": round(params * 4 / MIB, 3),
            "model_params": base_params, "model_param_mib": round(base_params * 4 / MIB, 2),
            "model_file_mib": round((base / "model.safetensors").stat().st_size / MIB, 2)}


def run_config(paths: list[str]) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--measure", *paths], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    if proc.returncode:
        raise RuntimeError(f"measurement failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_shape(shape: str, model_dir: Path, repeats: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"bench-memory-{shape}-"))
    source = model_dir
    if shape == "gpt2-small":
        source = work / "gpt2-small"
        synthetic_gpt2_small(model_dir, source)
    store = build_store(source, work / "models")
    configs = {"base": [store["base"]], "base + full copy": [store["base"], store["full"]],
               "base + 1 LoRA": [store["base"], *store["lora"][:1]],
               "base + 2 LoRA": [store["base"], *store["lora"][:2]],
               "base + 3 LoRA": [store["base"], *store["lora"][:3]]}
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for _ in range(repeats):  # interleaved, so drift affects every configuration alike
        for name, paths in configs.items():
            runs[name].append(run_config(paths))
    out: dict = {"shape": shape, "store": {k: v for k, v in store.items() if k not in ("base", "lora", "full")},
                 "repeats": repeats, "configs": {}}
    for name, rs in runs.items():
        out["configs"][name] = {"rss_mib": round(statistics.median(r["rss_mib"] for r in rs), 1),
                                "peak_mib": round(statistics.median(r["peak_mib"] for r in rs), 1),
                                "rss_after_imports_mib": round(statistics.median(r["rss_after_imports_mib"]
                                                                                 for r in rs), 1),
                                "peft_import_mib": round(statistics.median(r["peft_import_mib"] for r in rs), 1),
                                "rss_loaded_mib": round(statistics.median(r["rss_loaded_mib"] for r in rs), 1),
                                "tokens_per_s": [statistics.median(col)
                                                 for col in zip(*(r["tokens_per_s"] for r in rs))],
                                "rss_runs": [round(r["rss_mib"], 1) for r in rs]}
    c = out["configs"]
    base = c["base"]["rss_mib"]
    full_cost = c["base + full copy"]["rss_mib"] - base
    lora = [c[f"base + {k} LoRA"]["rss_mib"] for k in (1, 2, 3)]
    marginal = [lora[0] - base, lora[1] - lora[0], lora[2] - lora[1]]
    out["full_copy_cost_mib"] = round(full_cost, 1)
    out["lora_marginal_cost_mib"] = [round(m, 1) for m in marginal]
    out["lora_cost_median_mib"] = round(statistics.median(marginal), 1)
    out["lora_cost_vs_full"] = round(out["lora_cost_median_mib"] / full_cost, 3) if full_cost > 0 else None
    out["lora_cost_vs_adapter"] = round(out["lora_cost_median_mib"] / store["adapter_param_mib"], 2)
    limit = TARGET_FACTOR * store["adapter_param_mib"] + TARGET_SLACK_MIB
    out["target_mib"] = round(limit, 2)
    out["target"] = (f"each extra LoRA variant <= {TARGET_FACTOR:g} x its adapter "
                     f"({store['adapter_param_mib']:.2f} MiB)"
                     f" + {TARGET_SLACK_MIB:g} MiB = {limit:.1f} MiB")
    out["met"] = bool(max(marginal) <= limit)
    # answers: base the same everywhere; adapters differ from it and from each other; full copy = adapter 1
    answers = {name: runs[name][0]["answers"] for name in configs}
    base_answers = answers["base"][0]
    out["answers_check"] = {
        "base_unaffected": all(a[0] == base_answers for a in answers.values()),
        "adapters_differ_from_base": all(a != base_answers for a in answers["base + 3 LoRA"][1:]),
        "adapters_differ_from_each_other": len({json.dumps(a) for a in answers["base + 3 LoRA"][1:]}) == 3,
        "full_copy_answers_like_adapter_1": answers["base + full copy"][1] == answers["base + 1 LoRA"][1]}
    shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["embedded", "gpt2-small"], choices=["embedded", "gpt2-small"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", type=Path, help="embedded model directory (default: build/reuse the default one)")
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    ap.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)), flush=True)
        os._exit(0)  # skip interpreter teardown: background generation threads may still be parked in torch
    from tests.support.models import cached_model

    model_dir = args.model or cached_model("default")
    results = [bench_shape(shape, model_dir, args.repeats) for shape in args.shapes]
    for r in results:
        s = r["store"]
        print(f"\n{r['shape']}: model {s['model_params'] / 1e6:.1f} M parameters "
              f"({s['model_param_mib']:.1f} MiB fp32), "
              f"adapter {s['adapter_params'] / 1e3:.0f} k parameters ({s['adapter_param_mib']:.2f} MiB, file "
              f"{s['adapter_file_mib']:.2f} MiB); median of {r['repeats']} processes each")
        print(f"{'configuration':20}{'RSS MiB':>10}{'peak MiB':>10}{'tokens/s per version':>28}")
        for name, c in r["configs"].items():
            print(f"{name:20}{c['rss_mib']:>10.1f}{c['peak_mib']:>10.1f}{str(c['tokens_per_s']):>28}")
        print(f"extra full copy: {r['full_copy_cost_mib']:.1f} MiB; "
              f"extra LoRA variants: {r['lora_marginal_cost_mib']} MiB "
              f"(median {r['lora_cost_median_mib']:.1f} MiB = {r['lora_cost_vs_adapter']:.1f}x its adapter, "
              f"{r['lora_cost_vs_full']}x a full copy)")
        print(f"answers: {r['answers_check']}")
        print(f"target ({r['target']}): {'met' if r['met'] else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps({"shapes": results, "met": all(r["met"] for r in results)}, indent=2))


if __name__ == "__main__":
    main()
