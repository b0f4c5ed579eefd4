"""Stored feedback -> training data in TRL's column formats.

Rules (each produces rows tagged with their ``source``):

* pairs (``prompt``/``chosen``/``rejected``/``margin``, conversational format):
  - correction: the user's correction is chosen over the answer it corrects;
  - compare: the voted winner over the loser (ties and "both bad" give no pair);
  - siblings: answers to the same question whose thumbs/ratings differ;
  - same_prompt: answers to the *same first question* in different conversations whose
    thumbs/ratings clearly differ. This is how unpaired thumbs and stars inform the reward
    model: a rated answer is compared with other rated answers to the same question.
  ``margin`` (used by TRL's RewardTrainer as ``-logsigmoid(r_c - r_r - margin)``) is 1.0 for
  explicit preferences (corrections, votes) and half the score gap for thumbs/ratings pairs.
* rated pairs (``DatasetBundle.rated``; ``chosen_prompt``/``chosen``/``rejected_prompt``/
  ``rejected``/``margin``): Bradley-Terry over every rated answer, not only answers to the same
  question: each liked answer -- on any turn of a conversation, its prompt the whole history -- is
  paired with disliked ones to *other* prompts (each side keeps its own prompt), every answer
  joining up to ``max_rated_pairs_per_answer`` pairs. Thumbs and stars are absolute judgments, so a
  liked answer to one question outranks a disliked answer to another; with few repeated questions
  this is most of the pairs the feedback holds, and where each person rates answers in their own
  multi-turn chats (later turns never repeat across users) nearly all of them. Only the reward
  model and the gate's judge train on them: DPO needs both sides to answer one prompt.
  Mismatched pairs join them (``source`` "mismatched"): a liked first answer under its own question over
  the same answer under another user's question, the one with the fewest words in common of a
  few drawn (the random negatives of response selection). Their sides differ only in the question,
  so they teach what no style feature can: that an answer must fit what was asked.
* kto (``prompt``/``completion``/``label``): every answer with a thumb or rating (label = score > 0; a liked
  answer cut at the generation limit is left out: counted as ``liked_but_cut``), corrections (True) and the
  answers they replace (False), vote winners (True) and losers (False), both answers of a "both bad" vote (False).
* sft (``prompt``/``completion``): the positive half of the kto rows.
* prompts (``prompt``): every user turn with its history, for PPO/RLOO rollouts.

Every row carries ``raters``: the user ids whose feedback made it (a conversation's owner is its
rater: users only rate their own conversations). A same_prompt pair joins two conversations and
so has two raters; a row that several raters produced identically (a duplicate, dropped) names
all of them; a row with no known rater has ``()``. rlhf.trust weighs rows by their raters.

Conversations are split into train and held-out by a hash of their first question, so no
conversation (and no pair built from one) is on both sides, and every conversation that opens
with the same question is on the same side: held-out questions are ones training never saw, and
same_prompt pairs are never lost at the boundary (split by conversation, the held-out side kept
only about ``eval_fraction ** 2`` of them). Duplicates, empty and over-long items are dropped and
every count is reported.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from rlhf.data.criteria import LabelledAnswer, balanced_partners, criterion_pairs, labels_of
from rlhf.data.records import ConversationRecord, MessageRecord
from rlhf.settings import DataSettings

Messages = list[dict[str, str]]


@dataclass
class DatasetBundle:
    pairs: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"train": [], "eval": []})
    kto: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"train": [], "eval": []})
    sft: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"train": [], "eval": []})
    prompts: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"train": [], "eval": []})
    # per-criterion pairs (rlhf.data.criteria.criterion_pairs): each side with its own prompt
    criteria: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"train": [], "eval": []})
    # rated pairs across questions (``rated_pairs``): each side with its own prompt
    rated: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"train": [], "eval": []})
    counts: dict[str, Any] = field(default_factory=dict)


def split_of(key: int | str, settings: DataSettings) -> str:
    """"eval" for a stable ``eval_fraction`` of keys (a hash: raising the fraction only moves keys
    from train to eval), else "train"."""
    digest = hashlib.sha256(f"{settings.seed}:{key}".encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "big") / 2**64 < settings.eval_fraction else "train"


def question_key(text: str) -> str:
    """A question as the split and same_prompt pairing compare it (case and outer spaces ignored)."""
    return text.strip().lower()


def conversation_split(conv: ConversationRecord, settings: DataSettings) -> str:
    """The side of a conversation: that of its first question (its id when it has none)."""
    first = min((m for m in conv.messages if m.role == "user"), key=lambda m: m.id, default=None)
    return split_of(f"question:{question_key(first.content)}" if first else conv.id, settings)


def _history(msg: MessageRecord, by_id: dict[int, MessageRecord]) -> Messages:
    chain = []
    node: MessageRecord | None = msg
    while node is not None:
        chain.append({"role": node.role, "content": node.content})
        node = by_id.get(node.parent_id) if node.parent_id is not None else None
    return list(reversed(chain))


def _assistant(text: str) -> Messages:
    return [{"role": "assistant", "content": text}]


def _key(*parts: Any) -> str:
    return json.dumps(parts, sort_keys=True)


class _Collector:
    """Accumulates rows per split with dedup and length checks, counting every drop."""

    def __init__(self, settings: DataSettings) -> None:
        self.settings = settings
        self.rows: dict[str, list[dict]] = {"train": [], "eval": []}
        self.seen: dict[str, dict] = {}
        self.dropped: Counter = Counter()
        self.sources: Counter = Counter()

    def add(self, split: str, row: dict, key: str, texts: Iterable[str], source: str,
            raters: tuple[int, ...] = ()) -> None:
        texts = list(texts)
        if any(not t.strip() for t in texts):
            self.dropped["empty"] += 1
            return
        if any(len(t) > self.settings.max_chars for t in texts):
            self.dropped["too_long"] += 1
            return
        if key in self.seen:  # the same row again: dropped, but its raters made it too
            self.dropped["duplicate"] += 1
            kept = self.seen[key]
            kept["raters"] = _merge(kept["raters"], raters)
            return
        self.seen[key] = stored = {**row, "source": source, "raters": _merge((), raters)}
        self.rows[split].append(stored)
        self.sources[source] += 1


def _merge(first: tuple[int, ...], more: tuple[int, ...]) -> tuple[int, ...]:
    """``first`` then the ids of ``more`` it lacks (order kept, no repeats)."""
    out = list(first)
    for r in more:
        if r not in out:
            out.append(r)
    return tuple(out)


def _add_pair(pairs: _Collector, split: str, prompt: Messages, chosen: str, rejected: str, margin: float,
              source: str, raters: tuple[int, ...]) -> None:
    pairs.add(split, {"prompt": prompt, "chosen": _assistant(chosen), "rejected": _assistant(rejected),
                      "margin": margin}, _key(history_text(prompt), chosen, rejected), [chosen, rejected], source,
              raters)


def _add_kto(kto: _Collector, split: str, prompt: Messages, text: str, label: bool, source: str,
             raters: tuple[int, ...]) -> None:
    kto.add(split, {"prompt": prompt, "completion": _assistant(text), "label": label},
            _key(history_text(prompt), text, label), [text], source, raters)


def build_datasets(conversations: Iterable[ConversationRecord],
                   settings: DataSettings = DataSettings()) -> DatasetBundle:
    pairs, kto, prompts = _Collector(settings), _Collector(settings), _Collector(settings)
    totals: Counter = Counter()
    # answers to first questions, grouped by the question's text, for same_prompt pairs
    by_question: dict[str, list[tuple[str, int, Messages, str, float, tuple[int, ...]]]] = defaultdict(list)
    rated_answers: list[RatedAnswer] = []  # every liked or disliked answer, on any turn, for rated pairs
    labelled: dict[str, dict[bool, list[LabelledAnswer]]] = defaultdict(lambda: defaultdict(list))

    for conv in conversations:
        totals["conversations"] += 1
        split = conversation_split(conv, settings)
        rater: tuple[int, ...] = () if conv.user_id is None else (conv.user_id,)
        by_id = {m.id: m for m in conv.messages}
        children: dict[int, list[MessageRecord]] = defaultdict(list)
        for m in conv.messages:
            totals["messages"] += 1
            if m.parent_id is not None:
                children[m.parent_id].append(m)

        for m in conv.messages:
            if m.role == "user":
                history = _history(m, by_id)
                text = history_text(history)
                prompts.add(split, {"prompt": history}, _key(text), [text], "user_turn", rater)
                continue
            if m.role != "assistant" or m.parent_id is None or m.parent_id not in by_id:
                continue
            prompt = _history(by_id[m.parent_id], by_id)
            fb = m.feedback
            if fb is None:
                continue
            totals["feedback"] += 1
            if fb.flag:
                totals["flags"] += 1
            score = fb.score()
            liked = None if score is None or score == 0 else score > 0
            for criterion, label in labels_of(fb).items():
                labelled[criterion][label].append(LabelledAnswer(split, prompt, m.content, rater, liked))
            if score is not None and m.cut and score > 0:
                # liked but cut at the generation limit: a good start, not an answer to imitate whole (the
                # KTO and SFT rows would teach ending there); it ranks in every pair (SmolLM2 cut 125 of 128)
                totals["liked_but_cut"] += 1
            elif score is not None:
                _add_kto(kto, split, prompt, m.content, score > 0, "rating", rater)
            if score is not None and score != 0:
                rated_answers.append((split, conv.id, prompt, m.content, score, rater))
                if len(prompt) == 1:
                    by_question[question_key(prompt[0]["content"])].append(
                        (split, conv.id, prompt, m.content, score, rater))
            if fb.correction and fb.correction.strip() != m.content.strip():
                totals["corrections"] += 1
                _add_pair(pairs, split, prompt, fb.correction, m.content, 1.0, "correction", rater)
                _add_kto(kto, split, prompt, fb.correction, True, "correction", rater)
                _add_kto(kto, split, prompt, m.content, False, "corrected", rater)

        # siblings: answers to the same question with different thumbs/ratings
        for parent_id, kids in children.items():
            scored = [(k, k.feedback.score()) for k in kids if k.role == "assistant" and k.feedback is not None]
            scored = [(k, s) for k, s in scored if s is not None]
            prompt = _history(by_id[parent_id], by_id)
            for i, (a, sa) in enumerate(scored):
                for b, sb in scored[i + 1:]:
                    if abs(sa - sb) < settings.min_score_gap_siblings:
                        continue
                    win, lose = (a, b) if sa > sb else (b, a)
                    _add_pair(pairs, split, prompt, win.content, lose.content, round(abs(sa - sb) / 2, 3),
                              "siblings", rater)

        for c in conv.comparisons:
            if c.winner is None:
                continue
            totals["votes"] += 1
            a, b = by_id.get(c.a_id), by_id.get(c.b_id)
            q = by_id.get(c.prompt_message_id)
            if a is None or b is None or q is None:
                continue
            prompt = _history(q, by_id)
            if c.winner in ("a", "b"):
                win, lose = (a, b) if c.winner == "a" else (b, a)
                _add_pair(pairs, split, prompt, win.content, lose.content, 1.0, "compare", rater)
                _add_kto(kto, split, prompt, win.content, True, "compare_winner", rater)
                _add_kto(kto, split, prompt, lose.content, False, "compare_loser", rater)
            elif c.winner == "both_bad":
                for m in (a, b):
                    _add_kto(kto, split, prompt, m.content, False, "both_bad", rater)

    # same question, different conversations: clearly better vs clearly worse answers
    for answers in by_question.values():
        used: Counter = Counter()
        good = sorted((x for x in answers if x[4] > 0), key=lambda x: -x[4])
        bad = sorted((x for x in answers if x[4] < 0), key=lambda x: x[4])
        for g in good:
            for b in bad:
                if g[0] != b[0] or g[1] == b[1]:  # both on the same side of the split; siblings are done
                    continue
                if g[4] - b[4] < settings.min_score_gap_same_prompt:
                    continue
                if used[id(g)] >= settings.max_same_prompt_pairs_per_answer or \
                        used[id(b)] >= settings.max_same_prompt_pairs_per_answer:
                    continue
                used[id(g)] += 1
                used[id(b)] += 1
                _add_pair(pairs, g[0], g[2], g[3], b[3], round((g[4] - b[4]) / 2, 3), "same_prompt",
                          _merge(g[5], b[5]))

    # pairs whose chosen and rejected texts are identical teach nothing
    for split in ("train", "eval"):
        kept = [r for r in pairs.rows[split]
                if r["chosen"][0]["content"].strip() != r["rejected"][0]["content"].strip()]
        pairs.dropped["identical"] += len(pairs.rows[split]) - len(kept)
        pairs.rows[split] = kept

    bundle = DatasetBundle(pairs=pairs.rows, kto=kto.rows, prompts=prompts.rows,
                           criteria=criterion_pairs(labelled, settings.max_criterion_pairs_per_answer),
                           rated=rated_pairs(rated_answers, settings.max_rated_pairs_per_answer,
                                             settings.min_score_gap_same_prompt,
                                             settings.mismatched_pairs_per_answer, settings.seed))
    bundle.sft = {split: [{"prompt": r["prompt"], "completion": r["completion"], "source": r["source"],
                           "raters": r["raters"]} for r in rows if r["label"]] for split, rows in kto.rows.items()}
    bundle.counts = {
        **dict(totals),
        "pairs": {s: len(r) for s, r in pairs.rows.items()},
        "pairs_by_source": dict(pairs.sources),
        "pairs_dropped": dict(pairs.dropped),
        "kto": {s: len(r) for s, r in kto.rows.items()},
        "kto_positive": sum(r["label"] for rows in kto.rows.values() for r in rows),
        "kto_dropped": dict(kto.dropped),
        "sft": {s: len(r) for s, r in bundle.sft.items()},
        "prompts": {s: len(r) for s, r in prompts.rows.items()},
        "prompts_dropped": dict(prompts.dropped),
        "criteria": criteria_counts(bundle.criteria),
        "rated_pairs": {s: len(r) for s, r in bundle.rated.items()},
        "rated_by_source": dict(Counter(r["source"] for rows in bundle.rated.values() for r in rows)),
    }
    return bundle


RatedAnswer = tuple[str, int, Messages, str, float, tuple[int, ...]]  # split, conv. id, prompt, answer, score, raters


def prompt_key(prompt: Messages) -> str:
    """A prompt (the whole history up to the question) as rated pairs compare them: two answers to
    the same prompt are siblings or same_prompt pairs, never rated ones."""
    return question_key(history_text(prompt))


def _content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 3}


def mismatched_pairs(answers: list[RatedAnswer], per_answer: int, seed: str) -> dict[str, list[dict[str, Any]]]:
    """Each liked first answer under its own question over the same answer under another question of
    the same split: of 4 drawn, the one sharing the fewest content words with its own (a rephrasing
    of the same question would make a false negative). Seeded: the same feedback gives the same pairs."""
    out: dict[str, list[dict[str, Any]]] = {"train": [], "eval": []}
    if per_answer <= 0:
        return out
    rng = random.Random(f"{seed}:mismatched")
    for split in out:
        liked = [a for a in answers if a[0] == split and a[4] > 0]
        questions = sorted({question_key(a[2][0]["content"]): a[2] for a in answers if a[0] == split}.items())
        if len(questions) < 2:
            continue
        for a in liked:
            own = question_key(a[2][0]["content"])
            others = [q for q in questions if q[0] != own]
            for _ in range(per_answer):
                drawn = rng.sample(others, min(4, len(others)))
                words = _content_words(own)
                other = min(drawn, key=lambda q: (len(_content_words(q[0]) & words), q[0]))[1]
                out[split].append({"chosen_prompt": a[2], "chosen": a[3], "rejected_prompt": other, "rejected": a[3],
                                   "margin": 0.0, "source": "mismatched", "raters": a[5]})
    return out


def rated_pairs(answers: list[RatedAnswer], max_per_answer: int, min_gap: float, mismatched_per_answer: int = 0,
                seed: str = "rlhf") -> dict[str, list[dict[str, Any]]]:
    """Bradley-Terry pairs over every rated answer (any turn): liked over disliked answers to *different*
    prompts (answers to the same one are siblings or same_prompt pairs), on the same side of the split.
    Every answer of the larger side joins ``max_per_answer`` pairs scaled down by how much rarer the
    other side is (at least one), its partners the least used of the other side, so every rated
    answer teaches something and none dominates. ``margin``: half the score gap, as same_prompt's.
    With ``mismatched_per_answer``, the mismatched pairs of the first answers (``mismatched_pairs``) are added."""
    out = mismatched_pairs([a for a in answers if len(a[2]) == 1], mismatched_per_answer, seed)
    if max_per_answer <= 0:
        return out
    for split in out:
        good = [a for a in answers if a[0] == split and a[4] > 0]
        bad = [a for a in answers if a[0] == split and a[4] < 0]
        if not good or not bad:
            continue
        big, small = (good, bad) if len(good) >= len(bad) else (bad, good)

        def eligible(b: RatedAnswer, i: int) -> bool:
            return prompt_key(small[i][2]) != prompt_key(b[2]) and small[i][3].strip() != b[3].strip()

        for b, i in balanced_partners(big, small, max_per_answer, lambda b, i: (), eligible,
                                      lambda b, i: abs(b[4] - small[i][4]) >= min_gap):  # liked > 0 > disliked
            g, lo = (b, small[i]) if big is good else (small[i], b)
            out[split].append({"chosen_prompt": g[2], "chosen": g[3], "rejected_prompt": lo[2], "rejected": lo[3],
                               "margin": round((g[4] - lo[4]) / 2, 3), "source": "rated",
                               "raters": _merge(g[5], lo[5])})
    return out


def criteria_counts(rows: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, int]]:
    """Pairs per criterion and split: ``{criterion: {"train": n, "eval": m}}``."""
    out: dict[str, dict[str, int]] = {}
    for split, items in rows.items():
        for r in items:
            out.setdefault(r["criterion"], {"train": 0, "eval": 0})[split] += 1
    return out


def history_text(messages: Messages) -> str:
    """A template-free rendering, used only for deduplication keys."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def to_standard(row: dict, tokenizer: Any) -> dict:
    """Conversational row -> standard (text) row rendered with ``tokenizer``'s chat template.

    The prompt ends with the generation prompt and each completion is exactly the text the
    model would generate after it, ending with EOS -- the same token sequence PPO scores.
    """
    prompt_text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    out = {"prompt": prompt_text}
    for key in ("chosen", "rejected", "completion"):
        if key in row:
            full = tokenizer.apply_chat_template(row["prompt"] + row[key], tokenize=False)
            completion = full[len(prompt_text):] if full.startswith(prompt_text) else " " + row[key][0]["content"]
            eos = tokenizer.eos_token
            if eos and eos in completion:
                completion = completion[: completion.index(eos) + len(eos)]
            out[key] = completion
    for key in ("label", "margin", "weight"):  # weight: rlhf.trust's row weight
        if key in row:
            out[key] = row[key]
    return out
