"""Seeded synthetic dialogue corpus for the embedded base model.

Every dialogue is a user question about one topic followed by an assistant answer of one
deliberate *quality*: helpful, terse, rude, off-topic or rambling. The base model learns all
five styles, so the answers it samples differ in ways that users (real or simulated) can
rate, and that the reward model and PPO can learn to prefer.

The vocabulary lists here (topic keywords, rude and polite phrases) are also what simulated
users' preference functions look at, so they are exported as plain module constants.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

QUALITIES: tuple[str, ...] = ("helpful", "terse", "rude", "off_topic", "rambling")
# Sampling weights of the qualities above: most answers are helpful, but every bad style is
# common enough that the base model produces it often.
QUALITY_WEIGHTS: tuple[float, ...] = (0.40, 0.15, 0.15, 0.15, 0.15)


@dataclass(frozen=True)
class Task:
    """Something a user may ask how to do, with tips that answer it."""

    phrase: str  # "cook rice", used in "How do I cook rice?"
    tips: tuple[str, ...]


@dataclass(frozen=True)
class Topic:
    name: str
    keywords: tuple[str, ...]  # words an on-topic answer tends to contain
    tasks: tuple[Task, ...]
    facts: tuple[str, ...] = field(default=())


TOPICS: tuple[Topic, ...] = (
    Topic("cooking", ("cook", "rice", "pasta", "soup", "salt", "water", "pan", "heat", "taste", "bread"), (
        Task("cook rice", ("Rinse the rice in cold water before you cook it.",
                           "Use about two cups of water for every cup of rice.",
                           "Let the rice rest with the lid on for ten minutes after cooking.")),
        Task("make a simple soup", ("Start by cooking an onion in a little oil.",
                                    "Add vegetables, water and a pinch of salt, then simmer.",
                                    "Taste the soup near the end and add more salt if it needs it.")),
        Task("cook pasta", ("Bring a large pot of salted water to a boil.",
                            "Stir the pasta in the first minute so it does not stick.",
                            "Taste a piece a minute before the time on the box.")),
        Task("bake bread", ("Mix flour, water, yeast and salt into a soft dough.",
                            "Let the dough rise until it doubles in size.",
                            "Bake it in a hot oven until the crust sounds hollow when you tap it.")),
    ), ("A sharp knife is safer than a dull one.", "Salt brings out the taste of most dishes.")),
    Topic("gardening", ("plant", "garden", "soil", "water", "seeds", "sun", "leaves", "roots", "tomatoes"), (
        Task("grow tomatoes", ("Plant tomatoes in a spot with at least six hours of sun.",
                               "Water them deeply at the roots a few times a week.",
                               "Tie the stems to a stake as the plants grow taller.")),
        Task("keep my houseplants alive", ("Check the soil with your finger before you water.",
                                           "Most houseplants like bright light but not direct sun.",
                                           "Make sure the pot has a hole so extra water can drain.")),
        Task("start a vegetable garden", ("Begin with a small bed so it is easy to look after.",
                                          "Mix compost into the soil before you plant.",
                                          "Choose easy plants like beans, lettuce and herbs.")),
    ), ("Plants turn sunlight into food through their leaves.", "Earthworms are a sign of healthy soil.")),
    Topic("fitness", ("exercise", "run", "walk", "muscles", "stretch", "workout", "strength", "rest", "body"), (
        Task("start running", ("Begin with short runs mixed with walking breaks.",
                               "Run at a pace where you can still talk.",
                               "Add a little more distance each week, not all at once.")),
        Task("build strength", ("Train the main muscle groups two or three times a week.",
                                "Focus on good form before you add more weight.",
                                "Give your muscles a day of rest between hard workouts.")),
        Task("stretch after a workout", ("Hold each stretch for about thirty seconds.",
                                         "Breathe slowly and never bounce while you stretch.",
                                         "Stretch the muscles you used the most in your workout.")),
    ), ("Regular exercise helps you sleep better.", "A short walk after a meal is good for the body.")),
    Topic("sleep", ("sleep", "bed", "night", "rest", "tired", "dark", "routine", "morning", "caffeine"), (
        Task("sleep better", ("Go to bed and wake up at the same time every day.",
                              "Keep your bedroom dark, quiet and cool.",
                              "Avoid caffeine in the afternoon and evening.")),
        Task("fall asleep faster", ("Put your phone away an hour before bed.",
                                    "Try a calm routine like reading or slow breathing.",
                                    "Get out of bed for a while if you cannot sleep after twenty minutes.")),
        Task("stop feeling tired in the morning", ("Open the curtains and get daylight soon after you wake up.",
                                                   "Drink a glass of water before your coffee.",
                                                   "Aim for seven to nine hours of sleep each night.")),
    ), ("Adults need about seven to nine hours of sleep.", "The body repairs itself during deep sleep.")),
    Topic("programming", ("code", "python", "function", "bug", "test", "program", "variable", "error", "computer"), (
        Task("learn python", ("Start with small programs that print and add numbers.",
                              "Practice a little every day instead of a lot once a week.",
                              "Read the error messages, because they tell you where the problem is.")),
        Task("fix a bug in my code", ("Find the smallest input that shows the bug.",
                                      "Print the values of your variables near the problem.",
                                      "Write a test that fails because of the bug, then fix it.")),
        Task("write cleaner code", ("Give your variables and functions clear names.",
                                    "Keep each function short and make it do one thing.",
                                    "Remove code that is no longer used.")),
    ), ("A function is a named block of code.", "Python is a popular first programming language.")),
    Topic("travel", ("travel", "trip", "pack", "bag", "flight", "hotel", "city", "passport", "map"), (
        Task("pack for a trip", ("Make a list a few days before you leave.",
                                 "Roll your clothes so they take less space in the bag.",
                                 "Keep your passport and tickets in one safe pocket.")),
        Task("find a cheap flight", ("Compare prices on several days, not just one.",
                                     "Book a few weeks ahead rather than at the last minute.",
                                     "Fly in the middle of the week when prices are often lower.")),
        Task("explore a new city", ("Walk around the center on your first day.",
                                    "Ask the people at your hotel where they like to eat.",
                                    "Download a map so you can use it without the internet.")),
    ), ("Many cities have free walking tours.", "A passport is needed for most trips abroad.")),
    Topic("money", ("money", "save", "budget", "spend", "bank", "bills", "account", "price", "cost"), (
        Task("save money", ("Put a small amount into savings as soon as you get paid.",
                            "Cook at home more often instead of eating out.",
                            "Cancel subscriptions that you do not use.")),
        Task("make a budget", ("Write down what you earn and what you spend each month.",
                               "Sort your spending into needs and wants.",
                               "Set a limit for each group and check it every week.")),
        Task("pay off my debt", ("List every debt with its interest rate.",
                                 "Pay the debt with the highest rate first.",
                                 "Always pay at least the minimum on the others.")),
    ), ("Interest is the price of borrowing money.", "A budget shows where your money goes.")),
    Topic("pets", ("dog", "cat", "pet", "walk", "food", "vet", "train", "toys", "play"), (
        Task("train my dog", ("Reward your dog right away when it does the right thing.",
                              "Keep training sessions short and fun.",
                              "Use the same word for each command every time.")),
        Task("take care of a cat", ("Give your cat fresh water every day.",
                                    "Clean the litter box once a day.",
                                    "Play with your cat using toys so it stays active.")),
        Task("keep my pet healthy", ("Take your pet to the vet for a check every year.",
                                     "Feed it the right amount of good food.",
                                     "Make sure it gets exercise and play every day.")),
    ), ("Dogs need a walk every day.", "Cats sleep for most of the day.")),
    Topic("space", ("space", "planet", "moon", "star", "sun", "earth", "orbit", "sky", "light"), (
        Task("see the planets at night", ("Find a dark place away from city lights.",
                                          "Planets shine with a steady light, while stars twinkle.",
                                          "Use a free sky map app to know where to look.")),
        Task("learn about the moon", ("The moon goes around the earth about once a month.",
                                      "We always see the same side of the moon.",
                                      "The moon shines because it reflects light from the sun.")),
        Task("understand why stars shine", ("Stars are huge balls of hot gas.",
                                            "Deep inside a star, atoms join together and release energy.",
                                            "That energy leaves the star as light and heat.")),
    ), ("The sun is a star.", "Light from the sun takes about eight minutes to reach the earth.")),
    Topic("music", ("music", "guitar", "piano", "song", "play", "practice", "notes", "chords", "sing"), (
        Task("learn the guitar", ("Start with a few easy chords and switch between them slowly.",
                                  "Practice for fifteen minutes every day.",
                                  "Play songs you love so practice stays fun.")),
        Task("practice the piano", ("Warm up with slow scales before you play songs.",
                                    "Practice the hard part of a piece on its own.",
                                    "Use a metronome to keep a steady beat.")),
        Task("sing better", ("Stand up straight and breathe from your belly.",
                             "Warm up your voice with gentle humming.",
                             "Record yourself and listen for notes that are off.")),
    ), ("A chord is three or more notes played together.", "Music is made of rhythm, melody and harmony.")),
    Topic("writing", ("write", "writing", "essay", "words", "sentence", "story", "draft", "read", "edit"), (
        Task("write a good essay", ("Start with a clear question that your essay will answer.",
                                    "Write a plan with one main point for each paragraph.",
                                    "Read it out loud when you edit to find awkward sentences.")),
        Task("write a short story", ("Give your main character something they really want.",
                                     "Put a problem in their way early in the story.",
                                     "Finish the first draft before you start to edit.")),
        Task("write a polite email", ("Open with a friendly greeting.",
                                      "Say what you need in the first two sentences.",
                                      "Thank the reader and sign with your name.")),
    ), ("Short sentences are easier to read.", "Most good writing is rewriting.")),
    Topic("study", ("study", "learn", "exam", "notes", "remember", "class", "test", "read", "review"), (
        Task("study for an exam", ("Start a week early and study a little each day.",
                                   "Test yourself instead of just reading your notes again.",
                                   "Sleep well the night before the exam.")),
        Task("remember what I read", ("Stop after each section and say the main idea in your own words.",
                                      "Review the material again after one day and after one week.",
                                      "Teach the idea to a friend.")),
        Task("focus while studying", ("Put your phone in another room.",
                                      "Work for twenty five minutes, then take a five minute break.",
                                      "Keep one clear goal for each study session.")),
    ), ("Sleep helps the brain remember what you learned.", "Short reviews beat one long session.")),
)

TOPIC_BY_NAME: dict[str, Topic] = {t.name: t for t in TOPICS}

# Question forms: "{task}" is a task phrase, "{topic}" a topic name.
TASK_QUESTIONS: tuple[str, ...] = (
    "How do I {task}?",
    "How can I {task}?",
    "What is the best way to {task}?",
    "Can you help me {task}?",
    "Any tips to {task}?",
    "I want to {task}. Where do I start?",
    "What should I know before I try to {task}?",
    "Could you tell me how to {task}?",
    "Please explain how to {task}.",
    "I am trying to {task}. What do you suggest?",
)
TOPIC_QUESTIONS: tuple[str, ...] = (
    "Tell me something about {topic}.",
    "Can you give me a tip about {topic}?",
    "What is a good fact about {topic}?",
    "I am curious about {topic}. What should I know?",
)
FOLLOW_UPS: tuple[str, ...] = (
    "Thanks. Anything else?",
    "Can you tell me more?",
    "What else should I do?",
    "Got it. What is the next step?",
)

POLITE_OPENERS: tuple[str, ...] = (
    "Sure!", "Good question!", "Happy to help.", "Of course.", "Great question!", "Glad you asked.",
)
POLITE_CLOSERS: tuple[str, ...] = (
    "Hope that helps!", "Good luck!", "Let me know if you have more questions.",
    "You can do it!", "Have fun with it!",
)
RUDE_OPENERS: tuple[str, ...] = (
    "Ugh, fine.", "That is a silly question.", "Seriously? Everyone knows this.",
    "Why would you even ask that?", "Whatever.", "I can not believe you do not know this.",
)
RUDE_CLOSERS: tuple[str, ...] = (
    "Figure out the rest yourself.", "Stop bothering me.", "Do not ask me again.",
    "It is not that hard.", "Try to think next time.",
)
RAMBLE_FILLERS: tuple[str, ...] = (
    "Well, let me think about that for a moment.",
    "There are so many things one could say about this.",
    "Now, this reminds me of something else entirely.",
    "Anyway, where was I?",
    "Some people say one thing and other people say another thing.",
    "It really depends on a lot of things, if you think about it.",
    "I once heard a long story about this, but I forget how it ends.",
    "In any case, it is all quite interesting when you stop to think.",
)
TERSE_PREFIXES: tuple[str, ...] = ("", "", "Just this:", "Simple.", "Easy.")

# Phrases that mark an answer as rude / polite; used by simulated users and tests.
RUDE_MARKERS: tuple[str, ...] = tuple(p.lower() for p in RUDE_OPENERS + RUDE_CLOSERS)
POLITE_MARKERS: tuple[str, ...] = tuple(p.lower() for p in POLITE_OPENERS + POLITE_CLOSERS)


@dataclass(frozen=True)
class Dialogue:
    """A conversation in chat-template form plus what generated each assistant turn."""

    messages: tuple[dict, ...]
    topic: str
    qualities: tuple[str, ...]


def _question(rng: random.Random, topic: Topic) -> tuple[str, Task | None]:
    if rng.random() < 0.8:
        task = rng.choice(topic.tasks)
        return rng.choice(TASK_QUESTIONS).format(task=task.phrase), task
    return rng.choice(TOPIC_QUESTIONS).format(topic=topic.name), None


def _tips(rng: random.Random, topic: Topic, task: Task | None, k: int) -> list[str]:
    pool = list(task.tips) if task else list(topic.facts) + [t for tk in topic.tasks for t in tk.tips[:1]]
    return rng.sample(pool, min(k, len(pool)))


def make_answer(rng: random.Random, quality: str, topic: Topic, task: Task | None) -> str:
    """One assistant answer of the given quality to a question about ``topic``/``task``."""
    if quality == "helpful":
        parts = [rng.choice(POLITE_OPENERS), *_tips(rng, topic, task, rng.choice((2, 3)))]
        if rng.random() < 0.8:
            parts.append(rng.choice(POLITE_CLOSERS))
    elif quality == "terse":
        prefix = rng.choice(TERSE_PREFIXES)
        parts = ([prefix] if prefix else []) + _tips(rng, topic, task, 1)
    elif quality == "rude":
        parts = [rng.choice(RUDE_OPENERS), *_tips(rng, topic, task, 1), rng.choice(RUDE_CLOSERS)]
    elif quality == "off_topic":
        other = rng.choice([t for t in TOPICS if t.name != topic.name])
        other_task = rng.choice(other.tasks)
        parts = [rng.choice(POLITE_OPENERS + ("",)), *_tips(rng, other, other_task, 2)]
    elif quality == "rambling":
        fillers = rng.sample(RAMBLE_FILLERS, 4)
        tip = _tips(rng, topic, task, 1)
        parts = fillers[:2] + tip + fillers[2:] + [rng.choice(fillers[:2])]
    else:
        raise ValueError(f"unknown answer quality {quality!r}")
    return " ".join(p for p in parts if p)


def make_dialogue(rng: random.Random) -> Dialogue:
    topic = rng.choice(TOPICS)
    question, task = _question(rng, topic)
    quality = rng.choices(QUALITIES, QUALITY_WEIGHTS)[0]
    messages = [{"role": "user", "content": question},
                {"role": "assistant", "content": make_answer(rng, quality, topic, task)}]
    qualities = [quality]
    if rng.random() < 0.2:  # some two-turn dialogues, so the model learns turn structure
        quality2 = rng.choices(QUALITIES, QUALITY_WEIGHTS)[0]
        messages += [{"role": "user", "content": rng.choice(FOLLOW_UPS)},
                     {"role": "assistant", "content": make_answer(rng, quality2, topic, task)}]
        qualities.append(quality2)
    return Dialogue(tuple(messages), topic.name, tuple(qualities))


def generate_corpus(n_dialogues: int, seed: int = 0) -> list[Dialogue]:
    """``n_dialogues`` dialogues; the same seed always gives the same corpus."""
    rng = random.Random(seed)
    return [make_dialogue(rng) for _ in range(n_dialogues)]


def sample_prompts(n: int, seed: int = 1) -> list[str]:
    """Distinct user questions in the corpus's style (for demos, evaluation and simulated users)."""
    rng = random.Random(seed)
    all_questions = sorted({form.format(task=task.phrase) for topic in TOPICS for task in topic.tasks
                            for form in TASK_QUESTIONS}
                           | {form.format(topic=topic.name) for topic in TOPICS for form in TOPIC_QUESTIONS})
    rng.shuffle(all_questions)
    return all_questions[:n]


def topic_of(question: str) -> Topic | None:
    """The topic a corpus-style question is about, or None if it names no known task/topic."""
    q = question.lower()
    for topic in TOPICS:
        if any(task.phrase.lower() in q for task in topic.tasks) or topic.name in q:
            return topic
    return None
