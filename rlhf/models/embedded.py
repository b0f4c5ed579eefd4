"""Build the embedded base model: tokenizer + small GPT-2 trained from scratch on the corpus.

The result is an ordinary ``save_pretrained`` directory; from then on nothing treats it
specially. Training is a plain PyTorch loop over packed token blocks: for a model this small,
the fixed overheads of a full ``Trainer`` would eat a noticeable share of the time.

The model is defined by its spec alone (corpus, sizes, steps, seed and torch thread count):
the same spec gives the same weights on any machine, however busy; a slow machine only takes
longer. It trains on one torch thread: on 2 cores shared with other work, torch's intra-op
threads spin-wait for each other and a step took 5-6x longer with 2 threads than with 1
(measured at load 3: 1.2-1.7 s vs 0.25 s per step), and a fixed count keeps the arithmetic,
and so the weights, identical everywhere.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterator

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from rlhf.data.corpus import generate_corpus
from rlhf.models.chat_format import PAD_TOKEN, PLAIN_CHAT_TEMPLATE
from rlhf.progress import ProgressFn

EOS_TOKEN = "<|endoftext|>"

# progress(stage, done, total) -- called often; the caller draws bars or stores progress.


@dataclass(frozen=True)
class EmbeddedModelSpec:
    """Everything that determines the embedded model; stored with it for reproducibility."""

    n_dialogues: int = 20000
    vocab_size: int = 2048
    n_positions: int = 256
    n_embd: int = 128
    n_layer: int = 4
    n_head: int = 4
    block_size: int = 128
    batch_size: int = 16
    steps: int = 900
    learning_rate: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.05
    seed: int = 0
    threads: int = 1  # torch intra-op threads while training (part of the spec: see above)


PRESETS: dict[str, EmbeddedModelSpec] = {
    "default": EmbeddedModelSpec(),
    # Seconds to build; used by the test suite. Its samples are not meant to read well.
    "micro": EmbeddedModelSpec(n_dialogues=400, vocab_size=384, n_positions=128, n_embd=32,
                               n_layer=2, n_head=2, block_size=64, batch_size=8, steps=30,
                               warmup_steps=5),
}


def spec_for(preset: str, **overrides) -> EmbeddedModelSpec:
    if preset not in PRESETS:
        raise ValueError(f"unknown embedded model preset {preset!r} (choose from {', '.join(PRESETS)})")
    return replace(PRESETS[preset], **overrides)


def _noop(stage: str, done: int, total: int) -> None:
    pass


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (any input text encodes) with EOS, a distinct pad token,
    left padding and the plain chat template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN, PAD_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS_TOKEN, eos_token=EOS_TOKEN,
                                      unk_token=EOS_TOKEN, pad_token=PAD_TOKEN, padding_side="left")
    wrapped.chat_template = PLAIN_CHAT_TEMPLATE
    return wrapped


def _blocks(token_ids: list[int], block_size: int) -> torch.Tensor:
    n = len(token_ids) // block_size
    return torch.tensor(token_ids[: n * block_size], dtype=torch.long).view(n, block_size)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads, then restore the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def build_embedded_model(out_dir: str | Path, spec: EmbeddedModelSpec = PRESETS["default"],
                         progress: ProgressFn = _noop) -> dict:
    """Generate the corpus, train tokenizer and model, ``save_pretrained`` into ``out_dir``.

    Returns metrics (losses, sizes, timings) for the model registry.
    """
    with torch_threads(spec.threads):
        return _build(Path(out_dir), spec, progress)


def _build(out_dir: Path, spec: EmbeddedModelSpec, progress: ProgressFn) -> dict:
    started = time.perf_counter()
    torch.manual_seed(spec.seed)

    progress("corpus", 0, 1)
    dialogues = generate_corpus(spec.n_dialogues, seed=spec.seed)
    progress("corpus", 1, 1)

    progress("tokenizer", 0, 1)
    # Train the tokenizer on the raw turns; then render every dialogue through the chat
    # template it will be served with, so training text and prompts match byte for byte.
    tokenizer = train_tokenizer([m["content"] for d in dialogues for m in d.messages]
                                + ["User: ", "Assistant: "] * 100, spec.vocab_size)
    texts = [tokenizer.apply_chat_template(list(d.messages), tokenize=False) for d in dialogues]
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
    progress("tokenizer", 1, 1)

    data = _blocks(ids, spec.block_size)
    n_val = max(1, len(data) // 50)
    gen = torch.Generator().manual_seed(spec.seed)
    data = data[torch.randperm(len(data), generator=gen)]
    val, train = data[:n_val], data[n_val:]

    config = GPT2Config(vocab_size=len(tokenizer), n_positions=spec.n_positions, n_embd=spec.n_embd,
                        n_layer=spec.n_layer, n_head=spec.n_head, bos_token_id=tokenizer.bos_token_id,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate,
                                  weight_decay=spec.weight_decay, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < spec.warmup_steps:
            return (step + 1) / spec.warmup_steps
        frac = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    model.train()
    train_started = time.perf_counter()
    loss_value = float("nan")
    for step in range(spec.steps):
        idx = torch.randint(0, len(train), (spec.batch_size,), generator=gen)
        batch = train[idx]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = loss.item()
        progress("train", step + 1, spec.steps)
    train_seconds = time.perf_counter() - train_started

    model.eval()
    with torch.no_grad():
        val_loss = model(input_ids=val, labels=val).loss.item()

    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    progress("save", 1, 1)
    return {
        "spec": asdict(spec),
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus_tokens": len(ids),
        "train_steps": spec.steps,
        "train_loss": round(loss_value, 4),
        "val_loss": round(val_loss, 4),
        "val_perplexity": round(math.exp(val_loss), 3),
        "train_seconds": round(train_seconds, 1),
        "total_seconds": round(time.perf_counter() - started, 1),
    }
