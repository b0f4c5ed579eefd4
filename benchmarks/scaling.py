"""How the cost of serving and of a training cycle grows with model size and feedback volume.

The same work at three sizes (random weights where no trained model exists: cost does not depend
on the weights, only on the shapes):
- ``embedded``: the embedded GPT-2 (about 1 M parameters, the default base model);
- ``10m``: a GPT-2 of about 11 M parameters (6 layers, 384 wide) on the embedded tokenizer;
- ``124m``: GPT-2-small's real shape (12 layers, 768 wide, 1024 positions, 50 257-token vocabulary:
  124 M parameters). Its tokenizer is the embedded one, so ids above it decode to nothing: answers
  are mostly empty text while every token is still computed (the costs are real, the text is not).

Per size, each part in a fresh process (clean memory figures):
- serving: tokens/s through the server's batching generator (``rlhf.generation``) for 1 and 16
  concurrent users, and its ratio to plain ``model.generate`` on the same prompts (greedy, same
  token budget);
- memory: resident memory (and on CUDA, GPU memory allocated) with 0, 1 and 3 LoRA versions loaded
  on the shared weights, each having answered;
- cycle: one ``rl-train --lora`` (reward model and judge ``--reward-steps`` steps each, PPO
  ``--episodes`` rollouts) on the same stored
  feedback (canned answers rated by the ``polite`` simulated users), run through the real CLI in its
  own process with timers around TRL's PPO phases (rollout generation, policy/reference forward,
  reward and value scoring, backward: benchmark-only instrumentation, the product code is not
  changed), with wall time and peak memory per stage.
Then on the embedded model, cycle time against feedback volume (about 100/200/400/800 events) at
the default settings, and one LoRA cycle at the default episode count (the per-episode cost).

Fits (least squares in log-log space for size, linear for episodes and events) and the
extrapolations to GPT-2-small with the default episode count and to 1.3 B parameters are printed
and stored with the raw figures.

    .venv/bin/python benchmarks/scaling.py [--device cpu|cuda] [--sizes embedded 10m 124m]
        [--episodes 32] [--volumes 100 200 400 800] [--parts serving memory cycle volume] [--json FILE]

One module because it is one experiment read top to bottom, and each measured part runs as a
child process of this same script (``--child``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

SIZES = ("embedded", "10m", "124m")
DEFAULT_EPISODES = 512  # PolicySettings.episodes
DEFAULT_REWARD_STEPS = 40  # RewardSettings.min_steps: what a few hundred events train for
TARGET_1B = 1.3e9
NEW_TOKENS = 32
MIB = 2**20


# ---------------------------------------------------------------------------- models

def build_size(size: str, embedded_dir: Path, out: Path) -> Path:
    """The model of ``size`` (a copy of the embedded one, or random weights at that shape)."""
    import shutil

    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    if size == "embedded":
        shutil.copytree(embedded_dir, out, dirs_exist_ok=True)
        return out
    small = json.loads((embedded_dir / "config.json").read_text())
    shape = {"10m": dict(vocab_size=small["vocab_size"], n_positions=256, n_embd=384, n_layer=6, n_head=6),
             "124m": dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)}[size]
    cfg = GPT2Config(**shape, bos_token_id=small["bos_token_id"], eos_token_id=small["eos_token_id"],
                     pad_token_id=small["pad_token_id"])
    torch.manual_seed(0)
    GPT2LMHeadModel(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(embedded_dir).save_pretrained(out)
    return out


def parameters(model_dir: Path) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    with __import__("torch").device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def _child(part: str, *args: str, timeout: int = 1800) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", part, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"{part} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- serving

def measure_serving(model_dir: str, device: str) -> dict:
    """Tokens/s of the batching generator for 1 and 16 users vs plain generate (this process)."""
    import torch

    from rlhf.data import corpus
    from rlhf.generation import GenerationSettings, ModelPool, generate_chats
    from rlhf.models.chat_format import render_prompt

    pool = ModelPool(device)
    lm = pool.get(model_dir)
    settings = GenerationSettings(do_sample=False, max_new_tokens=NEW_TOKENS)
    questions = corpus.sample_prompts(16, seed=7)
    model, tok = lm.model, lm.tokenizer
    eos = {tok.eos_token_id, tok.pad_token_id}
    out: dict[str, Any] = {}
    generate_chats([(lm, [{"role": "user", "content": questions[0]}])], settings)  # warm-up
    for users in (1, 16):
        jobs = [(lm, [{"role": "user", "content": q}]) for q in questions[:users]]
        _sync(device)
        t0 = time.perf_counter()
        results = generate_chats(jobs, settings)
        _sync(device)
        batched_s = time.perf_counter() - t0
        batched_tokens = sum(r.token_count for r in results)

        prompts = [render_prompt(tok, [{"role": "user", "content": q}]) for q in questions[:users]]
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(lm.device)
        model.generate(**enc, max_new_tokens=2, do_sample=False, pad_token_id=tok.pad_token_id)  # warm-up
        _sync(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tok.pad_token_id)
        _sync(device)
        plain_s = time.perf_counter() - t0
        plain_tokens = 0
        for row in gen[:, enc["input_ids"].shape[1]:].tolist():  # tokens up to and including the first stop
            n = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            plain_tokens += n
        out[str(users)] = {"batched_tokens_per_s": round(batched_tokens / batched_s, 1),
                           "plain_tokens_per_s": round(plain_tokens / plain_s, 1),
                           "ratio_to_plain": round((batched_tokens / batched_s) / (plain_tokens / plain_s), 3),
                           "batched_tokens": batched_tokens, "plain_tokens": plain_tokens,
                           "batched_s": round(batched_s, 3), "plain_s": round(plain_s, 3)}
    return out


# ---------------------------------------------------------------------------- memory

def measure_memory(paths: list[str], device: str) -> dict:
    """Load ``paths`` (a base, then LoRA versions on it) through the server's pool, answer, report memory."""
    import gc

    import peft  # noqa: F401  (imported in every configuration: the library is not an adapter's cost)
    import torch

    from rlhf.generation import GenerationSettings, ModelPool, generate_chats

    pool = ModelPool(device)
    loaded = [pool.get(p) for p in paths]
    settings = GenerationSettings(do_sample=False, max_new_tokens=8)
    generate_chats([(lm, [{"role": "user", "content": "How do I cook rice?"}]) for lm in loaded], settings)
    gc.collect()
    out = {"rss_mib": round(_status_mib("VmRSS"), 1), "peak_rss_mib": round(_status_mib("VmHWM"), 1)}
    if device.startswith("cuda"):
        out["gpu_allocated_mib"] = round(torch.cuda.memory_allocated() / MIB, 1)
        out["gpu_peak_mib"] = round(torch.cuda.max_memory_allocated() / MIB, 1)
    return out


def memory_curve(model_dir: Path, work: Path, device: str) -> dict:
    from benchmarks.serving_memory import build_store

    store = build_store(model_dir, work / "store", adapters=3)
    configs = {"0": [store["base"]], "1": [store["base"], store["lora"][0]], "3": [store["base"], *store["lora"]]}
    out = {k: _child("memory", device, *paths) for k, paths in configs.items()}
    base = out["0"]["rss_mib"]
    for k in ("1", "3"):
        out[k]["extra_rss_mib_per_variant"] = round((out[k]["rss_mib"] - base) / int(k), 1)
        if "gpu_allocated_mib" in out[k]:
            out[k]["extra_gpu_mib_per_variant"] = round(
                (out[k]["gpu_allocated_mib"] - out["0"]["gpu_allocated_mib"]) / int(k), 2)
    out["adapter_file_mib"] = store["adapter_file_mib"]
    return out


# ---------------------------------------------------------------------------- one cycle

PHASES = ("rollout_generation", "forward", "reward_value_scoring", "backward")


def profiled_rl_train(profile_out: str, device: str, *cli_args: str) -> None:
    """rl-train in this process, with timers around TRL's PPO phases (written to ``profile_out``)."""
    import atexit

    import accelerate
    import trl.experimental.ppo.ppo_trainer as ppo

    totals = {p: 0.0 for p in PHASES}
    calls = {p: 0 for p in PHASES}
    in_ppo = [False]  # the reward model's trainer calls backward too: count PPO's alone

    def train(self, *a, **kw):
        in_ppo[0] = True
        try:
            return ppo_train(self, *a, **kw)
        finally:
            in_ppo[0] = False

    def timed(phase: str, fn):
        def wrapper(*a, **kw):
            if not in_ppo[0]:
                return fn(*a, **kw)
            _sync(device)
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                _sync(device)
                totals[phase] += time.perf_counter() - t0
                calls[phase] += 1
        return wrapper

    ppo_train = ppo.PPOTrainer.train
    ppo.PPOTrainer.train = train
    ppo.batch_generation = timed("rollout_generation", ppo.batch_generation)
    ppo.forward = timed("forward", ppo.forward)
    ppo.get_reward = timed("reward_value_scoring", ppo.get_reward)
    accelerate.Accelerator.backward = timed("backward", accelerate.Accelerator.backward)
    atexit.register(lambda: Path(profile_out).write_text(json.dumps(
        {"seconds": {k: round(v, 3) for k, v in totals.items()}, "calls": calls})))
    from flask.cli import main

    sys.argv = ["flask", "--app", "webapp", "rl-train", *cli_args]
    main()


def one_cycle(model_dir: Path, work: Path, device: str, conversations: int, episodes: int | None,
              lora: bool = True, reward_steps: int | None = None, env: dict[str, str] | None = None) -> dict:
    """Store feedback for ``model_dir`` in a new instance, run one rl-train through the CLI."""
    from tests.support.app import make_app, register_model
    from tests.support.feedback_factory import seed_feedback

    instance = Path(tempfile.mkdtemp(prefix="inst-", dir=work))
    app = make_app(instance)
    register_model(app, model_dir)
    events = seed_feedback(app, conversations, "polite")
    env = {**os.environ, **(env or {}), "RLHF_INSTANCE_DIR": str(instance), "RLHF_DEVICE": device}
    if episodes:
        env["RLHF_PPO_EPISODES"] = str(episodes)
    if reward_steps:  # the reward model and the gate's judge: this many optimisation steps each
        env["RLHF_TRAINING_REWARD_MAX_STEPS"] = str(reward_steps)
    profile = instance / "ppo_profile.json"
    args = ["--json", "--min-feedback", "1"] + (["--lora"] if lora else [])
    cmd = [sys.executable, __file__, "--child", "rl-train", str(profile), device, *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 3):  # 3: the gate rejected the candidate (still a whole cycle)
        raise RuntimeError(f"rl-train failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    prof = json.loads(profile.read_text()) if profile.exists() else {}
    policy = out["timings_s"].get("policy", 0.0)
    phases = prof.get("seconds", {})
    return {"feedback_events": events, "episodes": episodes or DEFAULT_EPISODES, "lora": lora,
            "reward_steps": out["reward_model"]["steps"], "judge_trained": bool(out["evaluation"].get("judge")),
            "process_wall_s": round(wall, 1), "timings_s": out["timings_s"], "peak_rss_mb": out["peak_rss_mb"],
            "peak_gpu_mb": out.get("peak_gpu_mb"),
            "ppo_phases_s": phases, "ppo_phase_calls": prof.get("calls", {}),
            "ppo_other_s": round(policy - sum(phases.values()), 2) if phases else None,
            "pairs": out["data_counts"]["pairs"], "decision": out["decision"]}


# ---------------------------------------------------------------------------- fits

def fit_power(xs: list[float], ys: list[float]) -> dict:
    """y = a * x^k by least squares on logs."""
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-9)) for y in ys]
    n = len(xs)
    mx, my = sum(lx) / n, sum(ly) / n
    sxx = sum((x - mx) ** 2 for x in lx)
    k = sum((x - mx) * (y - my) for x, y in zip(lx, ly)) / sxx if sxx else 0.0
    a = math.exp(my - k * mx)
    return {"a": float(f"{a:.4g}"), "exponent": round(k, 3)}


def fit_line(xs: list[float], ys: list[float]) -> dict:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return {"intercept": round(my - b * mx, 3), "slope": round(b, 5)}


def analyse(result: dict) -> dict:
    """Growth per parameter, per episode and per event, and the extrapolations."""
    sizes = [s for s in result["sizes"] if "cycle" in result["sizes"][s]]
    fits: dict[str, Any] = {}
    if len(sizes) >= 2:
        params = [result["sizes"][s]["parameters"] for s in sizes]
        for stage in ("reward", "policy", "judge", "evaluate"):
            ys = [result["sizes"][s]["cycle"]["timings_s"][stage] for s in sizes]
            if all(ys):  # the judge is not trained on too few held-out pairs
                fits[f"{stage}_s_vs_parameters"] = fit_power(params, ys)
        for phase in PHASES:
            ys = [result["sizes"][s]["cycle"]["ppo_phases_s"].get(phase, 0) for s in sizes]
            if all(ys):
                fits[f"ppo_{phase}_s_vs_parameters"] = fit_power(params, ys)
        rss = [max(result["sizes"][s]["cycle"]["peak_rss_mb"].values()) for s in sizes]
        fits["peak_rss_mb_vs_parameters"] = fit_power(params, rss)
        serve = [result["sizes"][s]["serving"]["1"]["batched_tokens_per_s"] for s in sizes
                 if "serving" in result["sizes"][s]]
        if len(serve) == len(sizes):
            fits["tokens_per_s_1_user_vs_parameters"] = fit_power(params, serve)
    emb = result["sizes"].get("embedded", {})
    if "cycle" in emb and "default_episodes_cycle" in result:
        e1, e2 = emb["cycle"], result["default_episodes_cycle"]
        fits["policy_s_vs_episodes_embedded"] = fit_line([e1["episodes"], e2["episodes"]],
                                                         [e1["timings_s"]["policy"], e2["timings_s"]["policy"]])
    vol = result.get("volume", [])
    if len(vol) >= 2:
        xs = [v["feedback_events"] for v in vol]
        fits["cycle_s_vs_events_embedded"] = fit_line(xs, [sum(v["timings_s"].values()) for v in vol])
        fits["reward_s_vs_events_embedded"] = fit_line(xs, [v["timings_s"]["reward"] for v in vol])
    extrapolations: dict[str, Any] = {}
    big = result["sizes"].get("124m", {})
    if "cycle" in big:
        c = big["cycle"]
        per_episode = c["timings_s"]["policy"] / c["episodes"]
        # the default reward model (and judge) train DEFAULT_REWARD_STEPS steps on data this small
        steps = DEFAULT_REWARD_STEPS / c["reward_steps"]
        default = {"reward": c["timings_s"]["reward"] * steps, "judge": c["timings_s"]["judge"] * steps,
                   "evaluate": c["timings_s"]["evaluate"], "policy": per_episode * DEFAULT_EPISODES}
        extrapolations["124m_default_cycle_s"] = {k: round(v) for k, v in default.items()}
        extrapolations["124m_default_cycle_total_s"] = round(sum(default.values()))
        extrapolations["124m_per_episode_s"] = round(per_episode, 3)
        if "policy_s_vs_parameters" in fits:
            ratio = TARGET_1B / big["parameters"]
            scale = {st: ratio ** fits[f"{st}_s_vs_parameters"]["exponent"] if f"{st}_s_vs_parameters" in fits
                     else ratio for st in ("reward", "policy", "judge", "evaluate")}
            # at least linear in parameters: the small sizes are dominated by fixed per-step overheads,
            # which would make a fitted exponent below 1 understate a model that is compute-bound
            lin = {st: max(s, ratio) for st, s in scale.items()}
            extrapolations["1.3b_default_cycle_total_s"] = round(sum(v * lin[k] for k, v in default.items()))
            small = result["sizes"].get("embedded", {}).get("cycle")
            if small:  # the libraries' fixed share measured at the embedded size, the rest per parameter
                per_param = ((max(c["peak_rss_mb"].values()) - max(small["peak_rss_mb"].values()))
                             / (big["parameters"] - result["sizes"]["embedded"]["parameters"]))
                extrapolations["peak_rss_mb_per_million_parameters"] = round(per_param * 1e6, 2)
                extrapolations["1.3b_peak_rss_mb_fp32"] = round(max(small["peak_rss_mb"].values())
                                                                + per_param * TARGET_1B)
            extrapolations["assumption"] = ("stage times scale with parameters by max(fitted exponent, 1) from the "
                                            "124m run; memory linearly; same episodes, response length and data; the "
                                            "per-episode cost of a short run includes PPO's set-up (an upper bound)")
    return {"fits": fits, "extrapolations": extrapolations}


# ---------------------------------------------------------------------------- main

def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        part, rest = sys.argv[2], sys.argv[3:]
        if part == "rl-train":
            profiled_rl_train(rest[0], rest[1], *rest[2:])
            return
        import torch

        if not rest[0].startswith("cuda"):
            torch.set_num_threads(max(1, os.cpu_count() or 1))
        out = measure_serving(rest[1], rest[0]) if part == "serving" else measure_memory(rest[1:], rest[0])
        print(json.dumps(out))
        return

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=SIZES)
    ap.add_argument("--episodes", type=int, default=16, help="PPO rollouts of the per-size cycle")
    ap.add_argument("--reward-steps", type=int, default=4,
                    help="optimisation steps of the reward model and of the judge in the per-size cycle")
    ap.add_argument("--conversations", type=int, default=100, help="rated conversations for the per-size cycle")
    ap.add_argument("--volumes", nargs="*", type=int, default=[100, 200, 400, 800],
                    help="feedback events of the volume sweep (embedded model, default settings)")
    ap.add_argument("--parts", nargs="+", default=["serving", "memory", "cycle", "volume", "episodes"],
                    choices=["serving", "memory", "cycle", "volume", "episodes", "critic"],
                    help="critic (not in the default): one LoRA cycle with PPO's value model trained in all its "
                         "weights and one with it as a LoRA adapter, same data and seed")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch

    from tests.support.models import cached_model

    embedded = cached_model("default")
    work = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    result: dict[str, Any] = {
        "device": args.device, "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "loadavg_before": list(os.getloadavg()), "episodes": args.episodes, "sizes": {}}
    t_start = time.perf_counter()

    def say(line: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.0f} s] {line}", flush=True)
        if args.json:  # what is measured so far survives an interrupted run
            args.json.write_text(json.dumps(result, indent=2, default=str))

    for size in args.sizes:
        model_dir = build_size(size, embedded, work / f"model-{size}")
        entry: dict[str, Any] = {"parameters": parameters(model_dir)}
        result["sizes"][size] = entry
        say(f"{size}: {entry['parameters'] / 1e6:.1f} M parameters")
        if "serving" in args.parts:
            entry["serving"] = _child("serving", args.device, str(model_dir))
            s1, s16 = entry["serving"]["1"], entry["serving"]["16"]
            say(f"  serving: 1 user {s1['batched_tokens_per_s']} tok/s ({s1['ratio_to_plain']}x plain), "
                f"16 users {s16['batched_tokens_per_s']} tok/s ({s16['ratio_to_plain']}x plain)")
        if "memory" in args.parts:
            entry["memory"] = memory_curve(model_dir, work / f"mem-{size}", args.device)
            m = entry["memory"]
            say(f"  memory: RSS {m['0']['rss_mib']} MiB alone, +{m['1']['extra_rss_mib_per_variant']} MiB with 1 "
                f"LoRA version, +{m['3']['extra_rss_mib_per_variant']} MiB each with 3 (adapter file "
                f"{m['adapter_file_mib']} MiB)")
        if "critic" in args.parts:  # PPO's value model trained in all its weights vs as a LoRA adapter
            runs = {name: one_cycle(model_dir, work, args.device, args.conversations, args.episodes,
                                    reward_steps=args.reward_steps, env={"RLHF_TRAINING_POLICY_LORA_VALUE": flag})
                    for name, flag in (("full_critic", "0"), ("lora_critic", "1"))}
            full, lora = runs["full_critic"], runs["lora_critic"]
            runs["policy_s_ratio"] = round(lora["timings_s"]["policy"] / full["timings_s"]["policy"], 3)
            runs["backward_s_ratio"] = round(lora["ppo_phases_s"]["backward"] / full["ppo_phases_s"]["backward"], 3)
            runs["peak_rss_ratio"] = round(max(lora["peak_rss_mb"].values()) / max(full["peak_rss_mb"].values()), 3)
            entry["critic"] = runs
            say(f"  critic: full {full['timings_s']['policy']} s / peak {max(full['peak_rss_mb'].values())} MB; "
                f"LoRA {lora['timings_s']['policy']} s / peak {max(lora['peak_rss_mb'].values())} MB; policy stage "
                f"x{runs['policy_s_ratio']}, backward x{runs['backward_s_ratio']}, peak RSS x{runs['peak_rss_ratio']}")
        if "cycle" in args.parts:
            entry["cycle"] = c = one_cycle(model_dir, work, args.device, args.conversations, args.episodes,
                                            reward_steps=args.reward_steps)
            say(f"  cycle ({c['feedback_events']} events, {c['episodes']} episodes, LoRA, {c['reward_steps']} reward "
                f"steps, judge {'trained' if c['judge_trained'] else 'not trained'}): {c['timings_s']} s; "
                f"PPO phases {c['ppo_phases_s']} other {c['ppo_other_s']}; peak RSS {c['peak_rss_mb']} MB"
                + (f"; peak GPU {c['peak_gpu_mb']} MB" if c.get("peak_gpu_mb") else ""))
    if "episodes" in args.parts and "embedded" in args.sizes:
        model_dir = work / "model-embedded"
        result["default_episodes_cycle"] = c = one_cycle(model_dir, work, args.device, args.conversations, None)
        say(f"embedded, default episodes ({c['episodes']}, LoRA): {c['timings_s']} s")
    if "volume" in args.parts:
        result["volume"] = []
        for events in args.volumes:
            conversations = max(10, round(events / 2.15))  # two rated answers each, plus a vote in about 15 %
            c = one_cycle(work / "model-embedded" if (work / "model-embedded").exists()
                          else build_size("embedded", embedded, work / "model-embedded"),
                          work, args.device, conversations, None, lora=False)
            result["volume"].append(c)
            say(f"volume: {c['feedback_events']} events, pairs {c['pairs']}: {c['timings_s']} s "
                f"(process {c['process_wall_s']} s)")
    result.update(analyse(result))
    result["loadavg_after"] = list(os.getloadavg())
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    say(f"fits: {json.dumps(result['fits'])}")
    say(f"extrapolations: {json.dumps(result['extrapolations'])}")
    text = json.dumps(result, indent=2, default=str)
    if args.json:
        args.json.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
