"""Every dataset rule of rlhf.data.datasets, on hand-built records."""
from __future__ import annotations

from transformers import AutoTokenizer

from rlhf.data.datasets import DataSettings, build_datasets, split_of, to_standard
from rlhf.data.records import ComparisonRecord, ConversationRecord, FeedbackRecord, MessageRecord

ALL_TRAIN = DataSettings(eval_fraction=0.0)


def conv(cid, answers, question="How do I cook rice?", comparisons=(), extra=()):
    """A conversation: one question (id cid*100) and answers (content, feedback) as siblings."""
    q = MessageRecord(cid * 100, "user", question)
    msgs = [q] + [MessageRecord(cid * 100 + i + 1, "assistant", text, q.id, fb) for i, (text, fb) in enumerate(answers)]
    return ConversationRecord(cid, tuple(msgs) + tuple(extra), tuple(comparisons))


def texts(row):
    return row["chosen"][0]["content"], row["rejected"][0]["content"]


def test_score_folds_thumbs_and_ratings():
    assert FeedbackRecord(thumb="up").score() == 1.0
    assert FeedbackRecord(thumb="down", rating=1).score() == -1.0
    assert FeedbackRecord(rating=4).score() == 0.5
    assert FeedbackRecord(thumb="up", rating=2).score() == 0.25
    assert FeedbackRecord(comment="meh").score() is None


def test_correction_is_chosen_over_the_answer_it_corrects():
    b = build_datasets([conv(1, [("Ugh, rinse it.", FeedbackRecord(correction="Rinse it in cold water."))])], ALL_TRAIN)
    [row] = b.pairs["train"]
    assert texts(row) == ("Rinse it in cold water.", "Ugh, rinse it.")
    assert row["source"] == "correction" and row["margin"] == 1.0
    assert row["prompt"] == [{"role": "user", "content": "How do I cook rice?"}]
    labels = {(r["completion"][0]["content"], r["label"]) for r in b.kto["train"]}
    assert labels == {("Rinse it in cold water.", True), ("Ugh, rinse it.", False)}
    assert b.counts["corrections"] == 1


def test_compare_votes_make_pairs_ties_do_not_and_both_bad_are_negatives():
    records = [
        conv(1, [("A1", None), ("B1", None)], comparisons=[ComparisonRecord(1, 100, 101, 102, "b")]),
        conv(2, [("A2", None), ("B2", None)], comparisons=[ComparisonRecord(2, 200, 201, 202, "tie")]),
        conv(3, [("A3", None), ("B3", None)], comparisons=[ComparisonRecord(3, 300, 301, 302, "both_bad")]),
        conv(4, [("A4", None), ("B4", None)], comparisons=[ComparisonRecord(4, 400, 401, 402, None)]),
    ]
    b = build_datasets(records, ALL_TRAIN)
    assert [texts(r) for r in b.pairs["train"]] == [("B1", "A1")]
    kto = {(r["completion"][0]["content"], r["label"]) for r in b.kto["train"]}
    assert kto == {("B1", True), ("A1", False), ("A3", False), ("B3", False)}
    assert b.counts["votes"] == 3


def test_siblings_with_different_ratings_make_pairs_with_margins():
    b = build_datasets([conv(1, [("good", FeedbackRecord(thumb="up", rating=5)),
                                 ("bad", FeedbackRecord(thumb="down", rating=1)),
                                 ("also good", FeedbackRecord(thumb="up"))])], ALL_TRAIN)
    pairs = {texts(r): r["margin"] for r in b.pairs["train"]}
    assert pairs == {("good", "bad"): 1.0, ("also good", "bad"): 1.0}  # good vs also good: no gap
    assert all(r["source"] == "siblings" for r in b.pairs["train"])


def test_unpaired_ratings_pair_up_across_conversations_with_the_same_question():
    records = [conv(i, [(f"answer {i}", FeedbackRecord(thumb="up" if i % 2 else "down"))],
                    question="How do I cook rice?  ") for i in range(1, 5)]
    b = build_datasets(records, ALL_TRAIN)
    assert b.counts["pairs_by_source"] == {"same_prompt": 4}
    for row in b.pairs["train"]:
        good, bad = texts(row)
        assert int(good.split()[1]) % 2 == 1 and int(bad.split()[1]) % 2 == 0


def test_rated_answers_pair_across_questions_for_the_reward_model_only():
    """Bradley-Terry over every rated answer: liked answers to one question over disliked ones to
    another, each side with its own prompt, each answer in a bounded number of pairs."""
    questions = [f"How do I do thing {i}?" for i in range(6)]
    liked = [conv(i, [(f"good {i}", FeedbackRecord(thumb="up", rating=5))], question=questions[i]) for i in range(3)]
    disliked = [conv(10 + i, [(f"bad {i}", FeedbackRecord(thumb="down", rating=1))], question=questions[3 + i])
                for i in range(3)]
    b = build_datasets(liked + disliked, DataSettings(eval_fraction=0.0, mismatched_pairs_per_answer=0))
    assert b.pairs["train"] == []  # no question was asked twice: no same_prompt pair, as before
    rows = b.rated["train"]
    assert b.counts["rated_pairs"] == {"train": len(rows), "eval": 0} and len(rows) == 9  # 3 pairs per answer
    for row in rows:
        assert row["chosen"].startswith("good") and row["rejected"].startswith("bad")
        good_q, bad_q = row["chosen_prompt"][0]["content"], row["rejected_prompt"][0]["content"]
        assert good_q == questions[int(row["chosen"].split()[1])] and good_q != bad_q
        assert row["margin"] == 1.0 and row["source"] == "rated" and len(row["raters"]) == 0
    # every answer is used, none more than 3 times
    from collections import Counter
    assert set(Counter(r["rejected"] for r in rows).values()) == {3}
    # the knob turns them off; equal scores never pair
    assert build_datasets(liked + disliked, DataSettings(eval_fraction=0.0, max_rated_pairs_per_answer=0,
                                                         mismatched_pairs_per_answer=0)).rated \
        == {"train": [], "eval": []}
    assert build_datasets(liked, DataSettings(eval_fraction=0.0, mismatched_pairs_per_answer=0)).rated["train"] == []


def test_mismatched_pairs_put_a_liked_answer_under_an_unrelated_question():
    """The answer is the same on both sides; the rejected side's question shares the fewest words
    with the answer's own question, so a rephrasing of it is never the negative."""
    own = "How do I cook rice?"
    rephrased, unrelated = "How can I cook rice?", "How do I train my dog?"
    records = [conv(1, [("Rinse the rice first.", FeedbackRecord(thumb="up"))], question=own),
               conv(2, [("Reward it right away.", FeedbackRecord(thumb="up"))], question=unrelated),
               conv(3, [("Use two cups of water.", FeedbackRecord(thumb="down"))], question=rephrased)]
    on = DataSettings(eval_fraction=0.0, max_rated_pairs_per_answer=0, mismatched_pairs_per_answer=1)
    assert build_datasets(records, DataSettings(eval_fraction=0.0, max_rated_pairs_per_answer=0)).rated["train"] == []
    b = build_datasets(records, on)
    rows = b.rated["train"]
    assert b.counts["rated_by_source"] == {"mismatched": 2}  # one per liked answer; the disliked one gets none
    rice = next(r for r in rows if r["chosen"] == "Rinse the rice first.")
    assert rice["rejected"] == rice["chosen"] and rice["chosen_prompt"][0]["content"] == own
    assert rice["rejected_prompt"][0]["content"] == unrelated  # never the rephrasing
    assert build_datasets(records, on).rated == b.rated  # seeded


def test_split_is_by_first_question_and_never_leaks():
    """A conversation and every pair built from it stay on one side, and so does every
    conversation opening with the same question: held-out questions are new to training, and
    answers to one question in different conversations still pair up (same_prompt) on either side."""
    settings = DataSettings(eval_fraction=0.5)
    records = [conv(i, [(f"good {i}", FeedbackRecord(thumb="up")), (f"bad {i}", FeedbackRecord(thumb="down"))],
                    question=f"Question {i % 8}?" + " " * (i % 2)) for i in range(1, 41)]
    b = build_datasets(records, settings)
    assert b.pairs["train"] and b.pairs["eval"]
    side = {i: split_of(f"question:question {i % 8}?", settings) for i in range(1, 41)}
    for split in ("train", "eval"):
        for row in b.pairs[split] + b.kto[split]:
            for key in ("chosen", "rejected", "completion"):
                if key in row:
                    assert side[int(row[key][0]["content"].split()[1])] == split
        questions = {r["prompt"][0]["content"].strip() for r in b.prompts[split]}
        assert questions == {f"Question {i % 8}?" for i in side if side[i] == split}
    # no same_prompt pair is lost at the boundary: as many as with nothing held out
    everything = build_datasets(records, ALL_TRAIN).counts["pairs_by_source"]["same_prompt"]
    assert b.counts["pairs_by_source"]["same_prompt"] == everything > 0
    assert split_of(7, settings) == split_of(7, settings)


def test_duplicates_empty_and_over_long_items_are_dropped_and_counted():
    fb_up, fb_down = FeedbackRecord(thumb="up"), FeedbackRecord(thumb="down")
    records = [conv(1, [("same good", fb_up), ("same bad", fb_down)]),
               conv(2, [("same good", fb_up), ("same bad", fb_down)], question="How do I cook rice?"),
               conv(3, [("x" * 50, fb_up), ("short", fb_down)], question="Long one?"),
               conv(4, [("   ", fb_up), ("fine", fb_down)], question="Empty one?"),
               conv(5, [("identical", FeedbackRecord(correction="identical"))], question="Same?")]
    b = build_datasets(records, DataSettings(eval_fraction=0.0, max_chars=40))
    c = b.counts
    assert c["pairs_dropped"]["duplicate"] >= 1 and c["pairs_dropped"]["too_long"] == 1
    assert c["pairs_dropped"]["empty"] == 1
    assert [texts(r) for r in b.pairs["train"]] == [("same good", "same bad")]
    assert c["kto_dropped"]["duplicate"] >= 2


def test_prompts_carry_the_history_and_sft_takes_positives():
    q1 = MessageRecord(1, "user", "How do I cook rice?")
    a1 = MessageRecord(2, "assistant", "Rinse it.", 1, FeedbackRecord(thumb="up"))
    q2 = MessageRecord(3, "user", "And then?", 2)
    a2 = MessageRecord(4, "assistant", "Ugh.", 3, FeedbackRecord(thumb="down"))
    b = build_datasets([ConversationRecord(1, (q1, a1, q2, a2))], ALL_TRAIN)
    assert [len(r["prompt"]) for r in b.prompts["train"]] == [1, 3]
    assert b.prompts["train"][1]["prompt"][-1] == {"role": "user", "content": "And then?"}
    assert [r["completion"][0]["content"] for r in b.sft["train"]] == ["Rinse it."]
    assert b.kto["train"][1]["prompt"][1]["content"] == "Rinse it."


def test_standard_format_matches_what_ppo_scores(micro_model_dir):
    tok = AutoTokenizer.from_pretrained(micro_model_dir)
    row = {"prompt": [{"role": "user", "content": "Hi?"}], "chosen": [{"role": "assistant", "content": "Hello."}],
           "rejected": [{"role": "assistant", "content": "Go away."}], "margin": 1.0}
    std = to_standard(row, tok)
    assert std == {"prompt": "User: Hi?\nAssistant:", "chosen": " Hello.<|endoftext|>",
                   "rejected": " Go away.<|endoftext|>", "margin": 1.0}


def test_the_judge_scores_only_its_own_questions_asked_again_when_they_are_few():
    """200 events on a deployment's 16 questions hold out 3 of them: the gate asks each again until
    the judge's test has ``min_judged_prompts`` units, never scoring the training questions' answers
    with it (those serve the KL and degeneration checks); on 120 questions nothing changes."""
    from rlhf.cycle import evaluation_prompts, heldout_questions
    from rlhf.settings import CycleSettings
    from rlhf.sim.questions import deployment_questions
    from rlhf.sim.users import Behaviour, prompt_set, simulate_records

    def bundle(questions: list[str]):
        records, _ = simulate_records([(70, 3, "calm", Behaviour())], seed=0, questions=questions)
        return build_datasets(records, DataSettings())

    settings = CycleSettings()
    few, many = bundle(deployment_questions(16)), bundle(prompt_set(120, seed=3))
    assert heldout_questions(few) == 3 and heldout_questions(many) > 8
    heldout = [r["prompt"] for r in few.prompts["eval"]]
    train = [r["prompt"] for r in few.prompts["train"]]
    prompts, judged, notes = evaluation_prompts(heldout, train, settings)
    need = settings.evaluation.min_judged_prompts
    assert need <= judged < need + len(heldout) and prompts[judged:] == train
    assert sorted(map(repr, prompts[:judged])) == sorted(map(repr, heldout * (judged // len(heldout))))
    assert notes == [f"{len(heldout)} held-out prompts, each asked {judged // len(heldout)} times for the judge",
                     f"only {len(heldout)} held-out prompts; adding training prompts for the KL and degeneration "
                     "checks"]
    # a prompt asked again for the judge counts once in the degeneration checks
    from rlhf.gate.evaluation import _first_askings
    assert _first_askings(["a", "a", "b", "b", "a", "a", "c", "c"], 2) == [0, 1, 2, 3, 6, 7]
    heldout = [r["prompt"] for r in many.prompts["eval"]]
    assert len(heldout) >= need and evaluation_prompts(heldout, [], settings) == (heldout, len(heldout), [])

    # below evaluation.judge_min_questions no judge is trained, and the held-out prompts are asked once
    from dataclasses import replace

    from rlhf.cycle import judge_skipped
    strict = replace(settings, evaluation=replace(settings.evaluation, judge_min_questions=4))
    assert judge_skipped(few, settings) is None and judge_skipped(many, strict) is None
    assert judge_skipped(few, strict) == ("the held-out pairs ask 3 questions, a judge needs at least 4 "
                                          "(evaluation.judge_min_questions)")
    heldout = [r["prompt"] for r in few.prompts["eval"]]
    prompts, judged, notes = evaluation_prompts(heldout, train, strict, judge=False)
    assert prompts == heldout + train and judged == len(heldout) and len(notes) == 1


def chat(cid, turns, rater=None):
    """A multi-turn conversation: (question, answer, feedback) turns, each answer the next question's parent."""
    msgs, parent = [], None
    for i, (question, answer, fb) in enumerate(turns):
        q = MessageRecord(cid * 100 + 2 * i, "user", question, parent)
        a = MessageRecord(cid * 100 + 2 * i + 1, "assistant", answer, q.id, fb)
        msgs += [q, a]
        parent = a.id
    return ConversationRecord(cid, tuple(msgs), (), rater)


def test_a_thumb_on_any_turn_of_anyones_chat_teaches_the_reward_model():
    """Each person rates answers in their own multi-turn chats: later turns never repeat across users,
    so same-question pairs cannot form; before, such feedback gave "0 preference pairs" and no run.
    Rated pairs now take every rated answer, its prompt the whole history up to it."""
    import pytest

    from rlhf.data.stage_sizing import DataSize, NotEnoughData
    from rlhf.policy.algorithms import size_stages
    from rlhf.settings import PolicySettings, RewardSettings

    up, down = FeedbackRecord(thumb="up"), FeedbackRecord(thumb="down")
    records = [chat(i, [(f"Plan a trip to city {i}?", f"Go by train {i}.", None),
                        (f"And where do I stay {i}?", f"A hotel near the station {i}." if i % 2 else f"Anywhere {i}!",
                         up if i % 2 else down)], rater=i)
               for i in range(8)]
    b = build_datasets(records, DataSettings(eval_fraction=0.0, mismatched_pairs_per_answer=0))
    assert b.pairs["train"] == []  # no pair answers one prompt
    rows = b.rated["train"]
    assert len(rows) == 12 and {r["source"] for r in rows} == {"rated"}  # 4 liked x 3, every answer used
    for row in rows:
        assert row["chosen"].startswith("A hotel") and row["rejected"].startswith("Anywhere")
        assert len(row["chosen_prompt"]) == 3 and row["chosen_prompt"][1]["role"] == "assistant"  # the history
        assert row["chosen_prompt"][-1]["content"].startswith("And where do I stay")
        assert len(row["raters"]) == 2
    size = DataSize.of(b)
    assert (size.train_pairs, size.rated_train) == (0, 12)
    reward, _, notes = size_stages("ppo", RewardSettings(batch_size=16), PolicySettings(batch_size=4, mini_batches=1),
                                   size, min_pairs=8, min_prompts=1)
    assert reward.batch_size == 12 and "12 training pairs" in notes[0]
    with pytest.raises(NotEnoughData, match="0 preference pairs"):  # DPO needs pairs that answer one prompt
        size_stages("dpo", RewardSettings(), PolicySettings(), size, min_pairs=8, min_prompts=1)


def test_a_liked_answer_cut_at_the_limit_is_ranked_but_never_imitated():
    """An answer stopped by the generation limit ends mid-sentence: as a KTO/SFT positive it would
    teach the model to end there. It still counts in the pairs (what the person preferred)."""
    cut = MessageRecord(2, "assistant", "Rinse the rice and then", 1, FeedbackRecord(thumb="up"), cut=True)
    bad = MessageRecord(3, "assistant", "No idea.", 1, FeedbackRecord(thumb="down"))
    record = ConversationRecord(1, (MessageRecord(1, "user", "How do I cook rice?"), cut, bad))
    b = build_datasets([record], ALL_TRAIN)
    assert [r["completion"][0]["content"] for r in b.kto["train"]] == ["No idea."]
    assert b.sft["train"] == [] and b.counts["liked_but_cut"] == 1
    assert [texts(r) for r in b.pairs["train"]] == [("Rinse the rice and then", "No idea.")]


def test_a_liked_cut_answer_ranks_across_chats_and_questions():
    """Where nearly every answer is cut (a real model at its generation limit), a liked cut answer
    still makes same-question pairs with other people's chats and rated pairs with disliked
    answers to other questions: leaving it out left SmolLM2's feedback with no rated pair at all."""
    def cut_liked(mid, text):
        return MessageRecord(mid, "assistant", text, mid - 1, FeedbackRecord(thumb="up"), cut=True)

    rice = ConversationRecord(1, (MessageRecord(1, "user", "How do I cook rice?"),
                                  cut_liked(2, "1. Rinse the rice 2. Boil")))
    rice_bad = conv(2, [("Cook it.", FeedbackRecord(thumb="down"))])
    tea = ConversationRecord(3, (MessageRecord(5, "user", "How do I make tea?"),
                                 MessageRecord(6, "assistant", "Tea is a drink.", 5, FeedbackRecord(thumb="down"))))
    b = build_datasets([rice, rice_bad, tea], ALL_TRAIN)
    assert ("1. Rinse the rice 2. Boil", "Cook it.") in [texts(r) for r in b.pairs["train"]]
    rated = [(r["chosen"], r["rejected"]) for r in b.rated["train"]]
    assert ("1. Rinse the rice 2. Boil", "Tea is a drink.") in rated
    assert b.kto["train"] and all(r["completion"][0]["content"] != "1. Rinse the rice 2. Boil" for r in b.kto["train"])
