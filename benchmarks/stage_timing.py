"""Shared by the training-stage benchmarks (reward_vs_plain_trl.py, ppo_vs_plain_trl.py):
the preference data they train on and the side-by-side timer that compares our stage with a
plain TRL script."""
from __future__ import annotations

import random
import statistics
import time
from typing import Callable

from rlhf.data import corpus


def preference_pairs(n: int, seed: int) -> list[dict]:
    """``n`` conversational pairs (TRL's format, with margins): a helpful answer preferred over a
    rude one to the same corpus question."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        topic = rng.choice(corpus.TOPICS)
        task = rng.choice(topic.tasks)
        q = [{"role": "user", "content": rng.choice(corpus.TASK_QUESTIONS).format(task=task.phrase)}]
        pairs.append({"prompt": q, "margin": 1.0,
                      "chosen": [{"role": "assistant", "content": corpus.make_answer(rng, "helpful", topic, task)}],
                      "rejected": [{"role": "assistant", "content": corpus.make_answer(rng, "rude", topic, task)}]})
    return pairs


def time_side_by_side(ours: Callable[[int], None], plain: Callable[[int], None], repeats: int,
                      before_each: Callable[[], None] = lambda: None) -> dict[str, list[tuple[float, float]]]:
    """(wall s, CPU s) of each of ``repeats`` runs of both sides, alternating which side goes
    first (a slow spell of the machine then hits both). The caller warms both up beforehand."""
    times: dict[str, list[tuple[float, float]]] = {"ours": [], "plain": []}
    order = [("ours", ours), ("plain", plain)]
    for i in range(repeats):
        for name, run in order if i % 2 == 0 else order[::-1]:
            before_each()
            t, c = time.perf_counter(), time.process_time()
            run(i)
            times[name].append((time.perf_counter() - t, time.process_time() - c))
        print(f"repeat {i + 1}: ours {times['ours'][-1][0]:.1f} s, plain TRL {times['plain'][-1][0]:.1f} s", flush=True)
    return times


def stage_result(times: dict[str, list[tuple[float, float]]], target_ratio: float) -> dict:
    """Medians of wall time (the ratio the target is about) and of CPU time (less sensitive to
    other processes on shared cores), and every run's wall time."""
    mo, mp = (statistics.median(w for w, _ in times[k]) for k in ("ours", "plain"))
    co, cp = (statistics.median(c for _, c in times[k]) for k in ("ours", "plain"))
    return {"ours_s": round(mo, 2), "plain_trl_s": round(mp, 2), "ratio": round(mo / mp, 3),
            "target_ratio": target_ratio, "met": mo / mp <= target_ratio,
            "ours_cpu_s": round(co, 2), "plain_trl_cpu_s": round(cp, 2), "cpu_ratio": round(co / cp, 3),
            "ours_runs_s": [round(w, 2) for w, _ in times["ours"]],
            "plain_runs_s": [round(w, 2) for w, _ in times["plain"]]}
