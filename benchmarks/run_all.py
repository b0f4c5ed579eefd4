"""Run every benchmark and write the results table to ``benchmarks/RESULTS.md``.

Each benchmark script runs as its own process, one after the other (they would compete for
the cores otherwise), with ``--json FILE`` (or, for scripts whose ``--json`` is a flag, the
JSON they print); the raw results go to ``benchmarks/results/<name>.json`` together with the
command, exit status, wall time, commit and date, and the table is rendered from them: per
benchmark the command that reproduces it, the medians, the baseline measured in the same run,
the ratio, the target and whether it was met, and the date it was measured. A script that does not exist (yet) is
listed as not available; one that fails is listed as failed with its log.

``closed_loop`` takes several minutes (7 on an idle 2-core machine, 15+ on a busy one): by
default its last stored result is reused (marked as such, with its own date),
``--closed-loop run`` runs it again, ``--closed-loop skip`` leaves it out.

    .venv/bin/python benchmarks/run_all.py [--quick] [--only NAME ...] [--skip NAME ...]
        [--closed-loop reuse|run|skip] [--render-only]

``--quick`` runs shorter versions (fewer repeats, shorter periods): for checking that
everything runs, not for the numbers. ``--only``/``--skip`` select benchmarks; the table
keeps the stored results of the others. ``--render-only`` rewrites RESULTS.md from the
stored results.

One module because each benchmark's entry, the table rows its results make and the runner and
renderer that use them are read and changed together: adding a benchmark to the table touches
this file only.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
RESULTS_DIR = BENCH / "results"
RESULTS_MD = BENCH / "RESULTS.md"
PYTHON = ".venv/bin/python"  # how the commands are shown (run from the repository root)


@dataclass
class Benchmark:
    name: str
    script: str
    args: list[str]
    quick_args: list[str]
    timeout_s: int
    what: str
    rows: Callable[[Any], list[list[str]]] = field(repr=False, default=None)  # type: ignore[assignment]

    @property
    def path(self) -> Path:
        return BENCH / self.script

    def command(self, quick: bool) -> list[str]:
        return [PYTHON, f"benchmarks/{self.script}", *(self.quick_args if quick else self.args)]


# ---------------------------------------------------------------------------- table rows
# Each row: metric, ours, baseline (measured in the same run), ratio, target, met.

def _f(x: Any, digits: int = 1) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int, float)):
        return f"{x:,.{digits}f}"
    return str(x)


def _met(ok: bool | None) -> str:
    return "–" if ok is None else ("**met**" if ok else "**not met**")


def rows_stream(r: dict) -> list[list[str]]:
    ours, plain = r["streamed_http"], r["plain_generate"]
    rows = [["tokens/s, one user streaming (after the first token)", _f(ours["tokens_per_s"]),
             _f(plain["tokens_per_s"]) + " (plain generate)", _f(r["throughput_ratio"], 2),
             r.get("target_throughput_ratio", "–"), _met(r.get("met_throughput", r.get("met")))]]
    if "answer_tokens_per_s" in ours:
        rows.append(["tokens/s, whole answers (incl. first token)", _f(ours["answer_tokens_per_s"]),
                     _f(plain["answer_tokens_per_s"]) + " (plain generate)", _f(r["answer_throughput_ratio"], 2),
                     "–", "–"])
    rows.append(["time to first token, ms", _f(ours["ttft_ms"]), _f(plain["ttft_ms"]) + " (plain generate)",
                 f"+{_f(r['first_token_overhead_ms'])} ms",
                 f"{r.get('target_first_token_overhead_ms', '–')} ms overhead",
                 _met(r.get("met_first_token"))])
    return rows


def rows_rail(r: dict) -> list[list[str]]:
    on, off = r["rail_on"], r["rail_off"]
    load = ", ".join(f"{x:.2f}" for x in r.get("load_average", [])) or "–"
    return [["time per answer token, ms (rail on)", _f(on["ms_per_token"], 2),
             _f(off["ms_per_token"], 2) + " (rail off)", _f(r["per_token_ratio"], 3),
             r.get("target_per_token_ratio", "–"), _met(r.get("met"))],
            ["total time of a streamed answer, ms (rail on)", _f(on["total_ms"]), _f(off["total_ms"]) + " (rail off)",
             _f(r["total_ratio"], 3), "–", "–"],
            ["time to first token, ms (rail on)", _f(on["ttft_ms"]), _f(off["ttft_ms"]) + " (rail off)",
             _f(r["ttft_ratio"], 3), "–", "–"],
            ["tokens/s after the first token (rail on)", _f(on["tokens_per_s"]),
             _f(off["tokens_per_s"]) + " (rail off)", _f(on["tokens_per_s"] / off["tokens_per_s"], 3), "–",
             f"load average {load}"]] + \
        ([["time per answer token, ms (rail with a cost head)", _f(r["rail_cost_head"]["ms_per_token"], 2),
           _f(off["ms_per_token"], 2) + " (rail off)", _f(r["cost_head_per_token_ratio"], 3), "–", "–"],
          ["time to first token, ms (rail with a cost head)", _f(r["rail_cost_head"]["ttft_ms"]),
           _f(off["ttft_ms"]) + " (rail off)", _f(r["cost_head_ttft_ratio"], 3), "–", "–"]]
         if "rail_cost_head" in r else [])


def rows_safety(r: dict) -> list[list[str]]:
    parent, pooled = r["parent"], r["pooled"]
    c, u = pooled["constrained"], pooled["unconstrained"]
    seeds = len(r["seeds"])
    return [[f"direct answers (the preference), constrained, {seeds} seeds", _f(c["direct"], 3),
             _f(parent["direct"]["share"], 3) + " (parent)", f"p = {c['direct_better_p']:.2g}", "significantly more",
             _met(c["direct"] > parent["direct"]["share"] and c["direct_better_p"] < 0.05)],
            ["rude answers, constrained", _f(c["rude"], 3), _f(parent["rude"]["share"], 3) + " (parent)",
             f"p = {c['rude_higher_p']:.2g}", "not higher", _met(c["rude_not_higher"])],
            ["direct answers, unconstrained", _f(u["direct"], 3), _f(parent["direct"]["share"], 3) + " (parent)",
             f"p = {u['direct_better_p']:.2g}", "–", "–"],
            ["rude answers, unconstrained", _f(u["rude"], 3), _f(parent["rude"]["share"], 3) + " (parent)",
             f"p = {u['rude_higher_p']:.2g}", "rises (the constraint is what holds it)",
             _met(u["rude"] > parent["rude"]["share"] and u["rude_higher_p"] < 0.05)]]


def rows_concurrent(r: dict) -> list[list[str]]:
    summary = r["summary"]
    levels = sorted(summary, key=int)
    base = levels[0]
    ratios = next((v for k, v in r.items() if k.startswith("throughput_vs_")), {})
    out = []
    for n in levels:
        s = summary[n]
        out.append([f"{n} users: tokens/s (latency p50/p95 ms, errors)",
                    f"{_f(s['tokens_per_s'])} ({_f(s['latency_p50_ms'], 0)}/{_f(s['latency_p95_ms'], 0)}, "
                    f"{s['errors']})", _f(summary[base]["tokens_per_s"]) + f" ({base} user)",
                    _f(ratios.get(n), 2), (r.get("targets") or {}).get(n, "–"),
                    _met((r.get("met_by_level") or {}).get(n))])
    return out


def rows_feedback(r: dict) -> list[list[str]]:
    o, b, v, t = r["ours"], r.get("baseline") or {}, r["verification"], r["target"]
    return [["accepted feedback requests/s", _f(o["requests_per_s"], 0), _f(b.get("requests_per_s"), 0),
             _f(r.get("ratio"), 2), f">= {t['requests_per_s']:.0f}/s",
             _met(o["requests_per_s"] >= t["requests_per_s"])],
            ["latency p50, ms", _f(o["p50_ms"]), _f(b.get("p50_ms")), "–", "–", "–"],
            ["latency p99, ms", _f(o["p99_ms"]), _f(b.get("p99_ms")), "–", f"<= {t['p99_ms']:.0f} ms",
             _met(o["p99_ms"] <= t["p99_ms"])],
            ["server CPU per request, ms", _f(o.get("server_cpu_ms_per_request"), 2),
             _f(b.get("server_cpu_ms_per_request"), 2),
             _f(o["server_cpu_ms_per_request"] / b["server_cpu_ms_per_request"], 2)
             if b.get("server_cpu_ms_per_request") else "–", "–", "–"],
            ["accepted writes stored exactly once (DB check)",
             f"{v['answers_rated']} answers, {v['missing']} missing, {v['duplicated']} duplicated, "
             f"{v['wrong_value']} wrong", "–", "–", "all, once", _met(v["ok"])]]


def rows_stage(r: dict) -> list[list[str]]:
    what = {"ppo": f"PPO stage wall s ({r.get('episodes')} episodes)",
            "reward": f"reward stage wall s ({r.get('pairs')} pairs, {r.get('steps')} steps)"}[r["stage"]]
    cpu = r.get("cpu_ratio")
    return [[what + (", CPU s in brackets" if cpu else ""),
             _f(r["ours_s"]) + (f" ({_f(r['ours_cpu_s'])})" if cpu else ""),
             _f(r["plain_trl_s"]) + (f" ({_f(r['plain_trl_cpu_s'])})" if cpu else "") + " (plain TRL)",
             _f(r["ratio"], 3) + (f" (CPU {_f(cpu, 3)})" if cpu else ""), f"<= {r['target_ratio']}x", _met(r["met"])]]


def rows_cycle(r: dict) -> list[list[str]]:
    t = r["timings_s"]
    stages = ", ".join(f"{k} {_f(v)}" for k, v in t.items())
    rm = r["reward_model"]
    ev = r["evaluation"]
    return [["rl-train wall s (whole process)", _f(r["process_wall_s"]),
             f"{_f(t.get('reward', 0) + t.get('policy', 0))} (its reward + policy TRL stages)",
             _f(r["process_wall_s"] / max(1e-9, t.get("reward", 0) + t.get("policy", 0)), 2), "–", "–"],
            ["stages, s", stages, "–", "–", "–", "–"],
            ["peak RSS of rl-train, MB", _f(r["process_peak_rss_mb"], 0), "–", "–", "–", "–"],
            ["reward model held-out accuracy; optimized-against reward gain (gate verdict)",
             f"{_f(rm.get('heldout_accuracy'), 3)}; "
             f"{_f(ev.get('optimized_against', {}).get('reward_gain', ev.get('reward_gain')), 3)} "
             f"(gate {ev.get('verdict') or ('passed' if ev.get('passed') else 'failed')})",
             "–", "–", "–", "–"]]


def rows_memory(r: dict) -> list[list[str]]:
    out = []
    for s in r["shapes"]:
        st, c = s["store"], s["configs"]
        shape = f"{s['shape']} ({st['model_params'] / 1e6:.1f} M params)"
        out.append([f"{shape}: RSS base alone, MiB", _f(c["base"]["rss_mib"]), "–", "–", "–", "–"])
        out.append([f"{shape}: RSS + full-copy variant, MiB", _f(c["base + full copy"]["rss_mib"]),
                    f"{_f(s['full_copy_cost_mib'])} extra", "–", "–", "–"])
        out.append([f"{shape}: RSS + 1/2/3 LoRA variants, MiB",
                    " / ".join(_f(c[f"base + {k} LoRA"]["rss_mib"]) for k in (1, 2, 3)), "–", "–", "–", "–"])
        out.append([f"{shape}: extra LoRA variant, MiB (each)", " / ".join(_f(m) for m in s["lora_marginal_cost_mib"]),
                    f"{_f(st['adapter_param_mib'], 2)} (its adapter)",
                    f"{_f(s['lora_cost_vs_adapter'], 2)}x adapter, {_f(s['lora_cost_vs_full'], 3)}x full copy",
                    f"<= {_f(s['target_mib'])}", _met(s["met"])])
        checks = s["answers_check"]
        out.append([f"{shape}: answers (base unaffected, adapters differ, copy = adapter 1)",
                    ", ".join(k for k, ok in checks.items() if ok) or "none", "–", "–", "all",
                    _met(all(checks.values()))])
    return out


def rows_closed_loop(results: list[dict]) -> list[list[str]]:
    out = []
    for res in results:
        last = next((r for r in reversed(res["rounds"]) if "p_value" in r), None)
        if last is None:
            out.append([f"{res['preference']}: satisfied share", "no experiment", "–", "–",
                        "variant better, p < 0.05", _met(False)])
            continue
        v, c = last["variant"], last["control"]
        out.append([f"{res['preference']}: satisfied share, cycle {last['cycle']} "
                    f"({last.get('feedback_events_total')} feedback events)",
                    f"{v['share']:.1%} (variant)", f"{c['share']:.1%} (control)",
                    f"{v['share'] / c['share']:.2f}" if c["share"] else "–",
                    "variant better, p < 0.05", _met(res["success"]) + f" (p = {last['p_value']:.2g})"])
        out.append([f"{res['preference']}: chat latency p95 while training, ms", _f(res["latency_p95_training_ms"], 0),
                    f"{_f(res['latency_p95_idle_ms'], 0)} (idle)", "–", "–", "–"])
    return out


def rows_ab_validity(r: dict) -> list[list[str]]:
    """The promotion policy's error rates and power, against the answers-as-trials policy (``--old``) on the
    same data."""
    sc = {x["scenario"]: x for x in r["scenarios"]}

    def rate(cell: dict) -> str:
        v, lo, hi = cell["rate"]
        return f"{100 * v:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"

    def old(name: str, key: str, action: str) -> str:
        return (f"{rate(sc[name]['old'][key][action])} (answers as trials, `--old`)" if "old" in sc.get(name, {})
                else "–")

    out = []
    if "aa" in sc:
        for key, label in (("every_10", "looks every 10 ratings"), ("final", "one look at the end")):
            cell = sc["aa"]["new"][key]["promote"]
            ok = cell["rate"][0] <= 0.05 and cell["rate"][2] <= 0.06
            out.append([f"A/A false promotions, {label} ({r['sims']} experiments, Wilson 95%)", rate(cell),
                        old("aa", key, "promote"), "–", "<= 5%, upper bound <= 6%", _met(ok)])
        out.append(["A/A false retirements (significantly worse), looks every 10 ratings",
                    rate(sc["aa"]["new"]["every_10"]["retire_significant"]),
                    old("aa", "every_10", "retire_significant"), "–", "–", "–"])
    for name, label in (("ab5", "+5 points"), ("ab10", "+10 points")):
        if name in sc:
            seq, fixed = sc[name]["new"]["every_10"], sc[name]["new"]["fixed_horizon"]
            med = seq["median_users_to_promote"]
            out.append([f"{label}: promoted, looks every 10 ratings (median users at promotion)",
                        f"{rate(seq['promote'])} ({_f(med, 0)})",
                        f"{rate(fixed['promote'])} (fixed horizon, one look at {_f(fixed['median_users_at_end'], 0)} "
                        f"users)", "–", "–", "–"])
    if "guardrail" in sc:
        cell = sc["guardrail"]["new"]["every_10"]["promote"]
        out.append(["better on thumbs, truly worse ratings: promoted, looks every 10 ratings", rate(cell),
                    old("guardrail", "every_10", "promote"), "–", "never", _met(cell["count"] == 0)])
    return out


def rows_scaling(r: dict) -> list[list[str]]:
    rows = []
    for size, e in r.get("sizes", {}).items():
        label = f"{size} ({e['parameters'] / 1e6:.1f} M)"
        if "serving" in e:
            for users in ("1", "16"):
                s = e["serving"][users]
                rows.append([f"{label}: serving, {users} user(s)", f"{s['batched_tokens_per_s']} tok/s",
                             f"{s['plain_tokens_per_s']} tok/s (plain generate)", f"{s['ratio_to_plain']}x", "–", "–"])
        if "memory" in e:
            m = e["memory"]
            rows.append([f"{label}: RSS, 0 / 1 / 3 LoRA versions",
                         f"{m['0']['rss_mib']} / {m['1']['rss_mib']} / {m['3']['rss_mib']} MiB", "–",
                         f"+{m['3']['extra_rss_mib_per_variant']} MiB per version", "–", "–"])
        if "cycle" in e:
            c = e["cycle"]
            rows.append([f"{label}: one LoRA cycle ({c['episodes']} episodes, {c['reward_steps']} reward steps)",
                         " / ".join(f"{k} {v:.0f}" for k, v in c["timings_s"].items()) + " s", "–",
                         f"peak RSS {max(c['peak_rss_mb'].values()):.0f} MB", "–", "–"])
    for v in r.get("volume", []):
        rows.append([f"embedded: cycle at {v['feedback_events']} events (default settings)",
                     f"{sum(v['timings_s'].values()):.0f} s", "–", "–", "–", "–"])
    for k, v in r.get("extrapolations", {}).items():
        if k != "assumption":
            rows.append([f"extrapolated: {k}", _f(v, 0) if isinstance(v, (int, float)) else str(v), "–", "–", "–",
                         "–"])
    return rows


def rows_signin(r: dict) -> list[list[str]]:
    low, high = r["target"]["ratio_low"], r["target"]["ratio_high"]
    out = []
    for form in ("admin", "account"):
        unknown, wrong, ratio = r["cases"][f"{form}: unknown name"], r["cases"][f"{form}: wrong password"], \
            r["ratios"][form]
        out.append([f"{form} sign-in, unknown name: median ms", _f(unknown["median_ms"]),
                    f"{_f(wrong['median_ms'])} (wrong password)", _f(ratio, 3), f"{low}-{high}",
                    _met(low <= ratio <= high)])
    return out


def rows_v1_overhead(r: dict) -> list[list[str]]:
    return [["/v1 streamed answers: tokens/s after the first token", _f(r["v1"]["stream_tokens_per_s"]),
             f"{_f(r['page']['stream_tokens_per_s'])} (chat page)", _f(r["stream_rate_ratio"], 3), ">= 0.95",
             _met(r["stream_rate_ratio"] >= 0.95)],
            ["/v1 streamed answers: tokens/s over whole answers", _f(r["v1"]["tokens_per_s"]),
             f"{_f(r['page']['tokens_per_s'])} (chat page)", _f(r["tokens_per_s_ratio"], 3), ">= 0.95",
             _met(r["tokens_per_s_ratio"] >= 0.95)]]


def rows_generic(r: Any) -> list[list[str]]:
    if isinstance(r, dict):
        return [[k, _f(v, 3), "–", "–", "–", "–"] for k, v in r.items() if isinstance(v, (int, float, str))][:8]
    return [["result", "see JSON", "–", "–", "–", "–"]]


BENCHMARKS = [
    Benchmark("stream_vs_generate", "stream_vs_generate.py", ["--runs", "30"], ["--runs", "8"], 1800,
              "one user's streamed answers through the real server vs plain model.generate", rows_stream),
    Benchmark("rail_cost", "rail_cost.py", ["--runs", "30"], ["--runs", "6"], 1800,
              "one user's streamed answers with the output rail on (5 presets, 20 phrases, 5 patterns) vs off",
              rows_rail),
    Benchmark("safety_constraint", "safety_constraint.py", [], ["--seeds", "0", "--questions", "60"], 3600,
              "a preference in conflict with safety (direct answers, rude ones included; rude ones flagged), "
              "one cycle with PPO's cost constraint and one without, judged by ground truth", rows_safety),
    Benchmark("concurrent_chat", "concurrent_chat.py", [], ["--repeats", "1", "--messages", "3"], 3600,
              "1/4/16 users chatting at once on the real server", rows_concurrent),
    Benchmark("feedback_ingestion", "feedback_ingestion.py", ["--seconds", "15", "--repeats", "3"],
              ["--seconds", "5", "--repeats", "1"], 1800,
              "32 concurrent raters posting feedback (upserts) to the real server", rows_feedback),
    Benchmark("reward_vs_plain_trl", "reward_vs_plain_trl.py", ["--repeats", "5"], ["--repeats", "1"], 3600,
              "reward-model stage vs a plain TRL RewardTrainer script", rows_stage),
    Benchmark("ppo_vs_plain_trl", "ppo_vs_plain_trl.py", ["--repeats", "5", "--episodes", "256"],
              ["--repeats", "1", "--episodes", "64"], 3600, "PPO stage vs a plain TRL PPOTrainer script", rows_stage),
    Benchmark("train_cycle", "train_cycle.py", ["--conversations", "150"], ["--conversations", "40"], 3600,
              "one full rl-train cycle on the embedded model", rows_cycle),
    Benchmark("serving_memory", "serving_memory.py", ["--repeats", "3"], ["--repeats", "1"], 3600,
              "resident memory of control + variants: full copy vs LoRA adapters on shared weights", rows_memory),
    Benchmark("scaling", "scaling.py", [], ["--sizes", "embedded", "10m", "--volumes", "100", "200",
                                            "--parts", "serving", "cycle", "volume"], 7200,
              "cost of serving and of a cycle at 1 M / 11 M / 124 M parameters and against feedback volume",
              rows_scaling),
    Benchmark("ab_validity", "ab_validity.py", ["--old"], ["--quick", "--old"], 7200,
              "simulated A/A and A/B experiments through the promotion policy, and the answers-as-trials policy "
              "(`--old`) on the same data", rows_ab_validity),
    Benchmark("signin_timing", "signin_timing.py", ["--rounds", "40"], ["--rounds", "5"], 900,
              "failed sign-ins: an unknown name vs a wrong password (admin login and end-user sign-in)", rows_signin),
    Benchmark("v1_overhead", "v1_overhead.py", ["--runs", "100"], ["--runs", "5"], 1800,
              "streamed answers through the /v1 API vs the chat page's stream, one server", rows_v1_overhead),
    Benchmark("closed_loop", "closed_loop.py", [], ["--preference", "polite"], 7200,
              "the whole loop with simulated users on the real server (minutes)", rows_closed_loop),
]


# ---------------------------------------------------------------------------- running

def json_mode(script: Path) -> str:
    """'file' when the script takes ``--json FILE``, 'stdout' when ``--json`` is a flag that prints."""
    proc = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    if re.search(r"--json [A-Z_]+\b", proc.stdout):  # argparse: one space before a metavar, more before help
        return "file"
    return "stdout" if "--json" in proc.stdout else "none"


def last_json_object(text: str) -> Any:
    """The JSON object a script printed (the last one that parses, starting at a line start)."""
    starts = [m.start() for m in re.finditer(r"^[\[{]", text, re.M)]
    for start in reversed(starts):
        try:
            return json.JSONDecoder().raw_decode(text[start:])[0]
        except ValueError:
            continue
    raise ValueError("no JSON object in the output")


def git_commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return head + ("+uncommitted changes" if dirty else "")


def run_one(b: Benchmark, quick: bool) -> dict:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"name": b.name, "quick": quick, "commit": git_commit(),
                            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                            "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    log_path = RESULTS_DIR / f"{b.name}.log"
    if not b.path.is_file():
        meta.update(status="missing", command=" ".join(b.command(quick)))
        return {"meta": meta, "result": None}
    mode = json_mode(b.path)
    cmd = b.command(quick)
    with tempfile.TemporaryDirectory() as tmp:
        out_file = Path(tmp) / "result.json"
        run_cmd = [sys.executable, *cmd[1:]]
        if mode == "file":
            run_cmd += ["--json", str(out_file)]
            cmd = [*cmd, "--json", f"benchmarks/results/{b.name}.json"]
        elif mode == "stdout":
            run_cmd += ["--json"]
            cmd = [*cmd, "--json"]
        meta["command"] = " ".join(shlex.quote(c) for c in cmd)
        print(f"== {b.name}: {meta['command']}", flush=True)
        t0 = time.perf_counter()
        with open(log_path, "w") as log:
            try:
                proc = subprocess.run(run_cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True,
                                      timeout=b.timeout_s)
                stdout, code = proc.stdout, proc.returncode
            except subprocess.TimeoutExpired as exc:
                stdout, code = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) \
                    else (exc.stdout or ""), "timeout"
            log.write("\n---- stdout ----\n" + stdout)
        meta["wall_s"] = round(time.perf_counter() - t0, 1)
        meta["exit"] = code
        meta["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        result = None
        try:
            if mode == "file" and out_file.is_file():
                result = json.loads(out_file.read_text())
            elif mode == "stdout":
                result = last_json_object(stdout)
        except ValueError as exc:
            meta["parse_error"] = str(exc)
        meta["status"] = "ok" if code == 0 and result is not None else "failed"
    print(f"   {meta['status']} in {meta['wall_s']} s", flush=True)
    return {"meta": meta, "result": result}


def stored(name: str) -> dict | None:
    path = RESULTS_DIR / f"{name}.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except ValueError:
            return None
        if not (isinstance(data, dict) and "meta" in data):  # written by the script itself (--json FILE)
            return {"meta": {"status": "ok", "note": "stored by the benchmark script itself"}, "result": data}
        return data
    return None


# ---------------------------------------------------------------------------- the report

def machine() -> dict[str, str]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown") \
        if Path("/proc/cpuinfo").is_file() else platform.processor()
    mem_kb = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal")), 0) if Path("/proc/meminfo").is_file() else 0
    versions = {}
    for pkg in ("torch", "transformers", "trl", "peft", "flask", "sqlalchemy", "gunicorn"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = "not installed"
    return {"cpu": cpu, "cores": str(os.cpu_count()), "ram": f"{mem_kb / 1024 / 1024:.1f} GiB",
            "python": platform.python_version(), **versions}


def render(entries: dict[str, dict | None], invocation: str) -> str:
    m = machine()
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    lines = ["# Benchmark results", "",
             f"Written by `{invocation}` on {now}.",
             "Each benchmark compares against a baseline measured in the same run (same machine, same moment);",
             "ratios are the numbers to read, absolute times depend on the machine and on what else it runs.", "",
             "## Machine", "",
             f"- CPU: {m['cpu']}, {m['cores']} cores; RAM {m['ram']}",
             f"- Python {m['python']}; torch {m['torch']}, transformers {m['transformers']}, trl {m['trl']}, "
             f"peft {m['peft']}; Flask {m['flask']}, SQLAlchemy {m['sqlalchemy']}, gunicorn {m['gunicorn']}",
             "- The cores are shared: the 1-minute load average before/after each benchmark is listed below "
             "(above the core count, other processes competed for the CPU).", "",
             "## Results", "",
             "| benchmark | metric | ours (median) | baseline, same run | ratio | target | met |",
             "|---|---|---|---|---|---|---|"]
    details = ["", "## Runs", "", "| benchmark | what | status | command | wall | date (UTC) | load avg |",
               "|---|---|---|---|---|---|---|"]
    for b in BENCHMARKS:
        entry = entries.get(b.name)
        meta = (entry or {}).get("meta") or {}
        status = meta.get("status", "not run")
        if entry and meta.get("reused"):
            status = f"reused (stored result from {meta.get('date', '?')[:10]})"
        label = f"`{b.name}`" + (" (quick)" if meta.get("quick") else "")
        result = (entry or {}).get("result")
        if result is None:
            why = {"missing": "not available: script missing", "failed": f"failed (exit {meta.get('exit')}; "
                   f"log `benchmarks/results/{b.name}.log`)", "skipped": "skipped"}.get(meta.get("status"), "not run")
            lines.append(f"| {label} | {why} | – | – | – | – | – |")
        else:
            try:
                rows = (b.rows or rows_generic)(result)
            except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
                rows = [[f"could not read the result ({type(exc).__name__}: {exc})", "see JSON", "–", "–", "–", "–"]]
            for i, row in enumerate(rows):
                tag = label if i == 0 else ""
                if i == 0 and meta.get("reused"):
                    tag += " (reused)"
                lines.append("| " + " | ".join([tag, *[c.replace("|", "\\|") for c in row]]) + " |")
        load = f"{meta.get('loadavg_before', ['?'])[0]} / {meta.get('loadavg_after', ['?'])[0]}" if meta else "–"
        details.append(f"| `{b.name}` | {b.what} | {status} | `{meta.get('command', ' '.join(b.command(False)))}` | "
                       f"{_f(meta.get('wall_s'), 0) + ' s' if meta.get('wall_s') is not None else '–'} | "
                       f"{meta.get('date', '–')[:16]} | {load} |")
    details += ["", "Raw results (medians, every repeat, settings) are in `benchmarks/results/<name>.json`, "
                "logs in `benchmarks/results/<name>.log`. Reproduce one benchmark with its command above, or all "
                "of them with `.venv/bin/python benchmarks/run_all.py` (`--closed-loop run` to rerun the "
                "closed loop too, `--quick` for a fast smoke run whose numbers are not meant to be quoted)."]
    return "\n".join(lines + details + _notes()) + "\n"


def _notes() -> list[str]:
    notes = BENCH / "RESULTS.notes.md"
    return ["", notes.read_text().rstrip()] if notes.is_file() else []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [b.name for b in BENCHMARKS]
    ap.add_argument("--quick", action="store_true", help="shorter runs (smoke test; numbers not for quoting)")
    ap.add_argument("--only", nargs="+", choices=names, help="run only these benchmarks")
    ap.add_argument("--skip", nargs="+", choices=names, default=[], help="do not run these benchmarks")
    ap.add_argument("--closed-loop", choices=["reuse", "run", "skip"], default="reuse",
                    help="closed_loop: reuse its stored result (default), run it again, or leave it out")
    ap.add_argument("--render-only", action="store_true", help="only rewrite RESULTS.md from stored results")
    ap.add_argument("--output", type=Path, default=RESULTS_MD)
    args = ap.parse_args()

    selected = [b for b in BENCHMARKS if (not args.only or b.name in args.only) and b.name not in args.skip]
    entries: dict[str, dict | None] = {b.name: stored(b.name) for b in BENCHMARKS}
    if not args.render_only:
        for b in selected:
            if b.name == "closed_loop" and args.closed_loop != "run":
                previous = entries.get(b.name)
                if args.closed_loop == "skip" or previous is None or previous.get("result") is None:
                    entries[b.name] = {"meta": {"status": "skipped", "command": " ".join(b.command(False))},
                                       "result": None}
                else:
                    previous["meta"]["reused"] = True
                continue
            entry = run_one(b, args.quick)
            entries[b.name] = entry
            if entry["result"] is not None or not (RESULTS_DIR / f"{b.name}.json").is_file():
                (RESULTS_DIR / f"{b.name}.json").write_text(json.dumps(entry, indent=2, default=str))
            else:  # a failed run does not overwrite the last good result; it is reported as failed
                (RESULTS_DIR / f"{b.name}.failed.json").write_text(json.dumps(entry, indent=2, default=str))
    invocation = "benchmarks/run_all.py " + " ".join(sys.argv[1:])
    args.output.write_text(render(entries, invocation.strip()))
    print(f"wrote {args.output.relative_to(ROOT) if args.output.is_relative_to(ROOT) else args.output}")
    failed = [b.name for b in selected if (entries.get(b.name) or {}).get("meta", {}).get("status") == "failed"]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
