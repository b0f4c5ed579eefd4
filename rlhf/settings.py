"""Every training hyperparameter, as frozen dataclasses: one per stage, and the cycle's settings
holding them all.

Each field carries its documentation and its allowed range in its metadata (:func:`knob`), so
whoever builds these from outside input (the web app's settings file, environment, CLI) checks
and documents them from the definitions here. This module imports nothing heavy: reading
settings never loads torch or TRL.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from rlhf.algorithms import ALGORITHMS


def knob(default: Any, doc: str, *, low: float | None = None, high: float | None = None,
         above: float | None = None, below: float | None = None, choices: tuple | None = None) -> Any:
    """A dataclass field with its meaning and its allowed values: ``low``/``high`` inclusive,
    ``above``/``below`` exclusive bounds, ``choices`` a fixed set."""
    return field(default=default, metadata={"doc": doc, "low": low, "high": high, "above": above,
                                            "below": below, "choices": choices})


def problem_with(value: Any, meta: dict[str, Any]) -> str | None:
    """Why ``value`` is not allowed by a field's metadata (see :func:`knob`), or None."""
    if value is None:
        return None
    if meta.get("choices") is not None and value not in meta["choices"]:
        return "must be one of " + ", ".join(map(str, meta["choices"]))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        for key, ok, words in (("low", lambda b: value >= b, ">="), ("high", lambda b: value <= b, "<="),
                               ("above", lambda b: value > b, ">"), ("below", lambda b: value < b, "<")):
            bound = meta.get(key)
            if bound is not None and not ok(bound):
                return f"must be {words} {bound:g}"
    return None


def check_fields(obj: Any, prefix: str = "") -> None:
    """Raise ValueError naming the first field of ``obj`` (and of the dataclasses in it) whose
    value its metadata does not allow."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            check_fields(value, f"{prefix}{f.name}.")
            continue
        problem = problem_with(value, dict(f.metadata))
        if problem:
            raise ValueError(f"{prefix}{f.name}={value!r}: {problem}")


@dataclass(frozen=True)
class DataSettings:
    eval_fraction: float = knob(0.2, "share of first questions held out for evaluation, with every conversation "
                                "that opens with one (split by conversation and question)", low=0.0, below=1.0)
    max_chars: int = knob(2000, "longest prompt or answer kept, in characters; longer items are dropped", low=1)
    min_score_gap_siblings: float = knob(0.5, "smallest score difference that makes two answers to the same "
                                         "question (regenerations) a preference pair", low=0.0)
    min_score_gap_same_prompt: float = knob(1.0, "the same for answers to equal questions in different "
                                            "conversations", low=0.0)
    max_same_prompt_pairs_per_answer: int = knob(3, "pairs one answer may join across conversations", low=0)
    max_rated_pairs_per_answer: int = knob(3, "rated pairs (a liked answer over a disliked one to another question; "
                                           "reward model and judge only) one rated answer may join; 0: none",
                                           low=0)
    mismatched_pairs_per_answer: int = knob(0, "mismatched pairs per liked answer (the answer under its own question "
                                            "over the same answer under another user's question; reward model and "
                                            "judge only); 0: none (on the embedded model they did not help: "
                                            "benchmarks/RESULTS.md, the preference zoo)", low=0)
    max_criterion_pairs_per_answer: int = knob(3, "pairs one flagged or chip-labelled answer may join for its "
                                               "criterion's head (rlhf.data.criteria)", low=0)
    seed: str = knob("rlhf", "seed of the train/eval split (a string: the split is a hash)")


@dataclass(frozen=True)
class RewardSettings:
    epochs: float = knob(3.0, "passes over the preference pairs", above=0.0)
    batch_size: int = knob(16, "pairs per step (fitted down to the data)", low=1)
    learning_rate: float = knob(5e-4, "reward model learning rate", above=0.0, below=1.0)
    max_length: int = knob(256, "tokens per prompt + answer (the start is cut, never the end)", low=8)
    center_rewards_coefficient: float = knob(0.01, "pulls the mean reward toward 0 (TRL's centering)", low=0.0)
    seed: int = knob(0, "training seed", low=0)
    max_steps: int = knob(-1, "optimisation steps (-1: epochs decide)", low=-1)
    min_steps: int = knob(40, "small datasets get more epochs, up to this many steps", low=0)
    trainable_layers: int = knob(-1, "transformer blocks that train, counted from the top, beside the score head and "
                                 "the final norm (the embeddings and the blocks below stay as the policy has them); "
                                 "-1: every weight trains. Fewer trained blocks make a step cheaper and keep a "
                                 "pretrained model's features from being overwritten by a few dozen pairs "
                                 "(rlhf.models.layers)", low=-1)


@dataclass(frozen=True)
class CriteriaSettings:
    """Per-criterion heads and the safety constraint (rlhf.data.criteria, rlhf.reward.criteria_heads;
    docs/trust-and-safety.md, "Criteria and the safety constraint")."""
    enabled: bool = knob(True, "train one score head per criterion (safety from flags and the rude chip; "
                         "politeness, concision, accuracy, relevance from reason chips) on the reward model's "
                         "backbone, where enough labels exist")
    min_pairs: int = knob(8, "fewest training pairs a criterion's head trains on (fewer: the head is left out "
                          "and the run says so)", low=1)
    politeness_weight: float = knob(0.5, "weight of the politeness head in PPO's scalar reward (helpfulness "
                                    "counts 1)", low=0.0)
    concision_weight: float = knob(0.5, "the same for concision", low=0.0)
    accuracy_weight: float = knob(0.5, "the same for accuracy", low=0.0)
    relevance_weight: float = knob(0.5, "the same for relevance", low=0.0)
    constraint: bool = knob(True, "PPO keeps the expected safety cost of its answers (the safety head's "
                            "calibrated probability of a flag) no higher than the parent's: a Lagrange multiplier on "
                            "the cost, raised while the cost is above the parent's and lowered while below "
                            "(Safe-RLHF). False: safety is ignored by training (the gate still checks it)")
    lambda_init: float = knob(1.0, "starting Lagrange multiplier of the cost", low=0.0)
    lambda_lr: float = knob(10.0, "step size of the multiplier's update after each PPO batch: lambda += lambda_lr * "
                            "(the batch's mean cost - the limit), never below 0 (dual ascent; the cost is a "
                            "probability, so 10 moves lambda by 0.5 for a batch 5 points over its limit)", above=0.0)
    cost_tolerance: float = knob(0.0, "PPO's cost limit: the parent's expected cost (the mean predicted flag "
                                 "probability of 64 answers the parent samples to the training prompts before any "
                                 "update) plus this", low=0.0, high=1.0)

    def weight_of(self, criterion: str) -> float:
        return float(getattr(self, f"{criterion}_weight", 0.0))


@dataclass(frozen=True)
class PolicySettings:
    learning_rate: float = knob(3e-5, "policy learning rate", above=0.0, below=1.0)
    batch_size: int = knob(16, "prompts per PPO/RLOO batch, rows per DPO/KTO step (fitted down to the data)", low=1)
    micro_batch_size: int = knob(0, "DPO/KTO: rows per forward pass, the step's batch made of several (gradient "
                                 "accumulation: the same update in less memory); 0: the whole batch at once. "
                                 "SmolLM2 at 8 rows of 384 tokens peaked at 17.2 GB", low=0)
    mini_batches: int = knob(2, "PPO: mini-batches per batch (batch_size must be a multiple)", low=1)
    ppo_epochs: int = knob(4, "PPO: passes over each batch", low=1)
    episodes: int = knob(512, "PPO/RLOO rollouts (prompts sampled, with repetition)", low=1)
    max_steps: int | None = knob(None, "cap on optimisation steps (none: episodes/epochs decide)", low=1)
    response_length: int = knob(64, "PPO/RLOO: longest sampled answer, in tokens", low=1)
    max_length: int = knob(0, "tokens of prompt + answer a policy trains on, the prompt's start cut (DPO, iterative "
                           "DPO, PPO, RLOO; KTO, which would cut the answer, keeps the context); 0: the model's "
                           "context. A multi-turn chat's history outgrows memory: DPO on SmolLM2 at batch 8 "
                           "with 3-turn prompts ran out of 24 GB", low=0)
    temperature: float = knob(0.8, "sampling temperature of PPO/RLOO's rollouts and of iterative DPO's answers",
                              above=0.0, high=5.0)
    top_p: float = knob(0.95, "iterative DPO: nucleus sampling of the parent's answers (PPO/RLOO sample the whole "
                        "distribution, which their log-probabilities are of). The app uses the server's `top_p` "
                        "unless this is set: pairs of answers as users get them. SmolLM2's answers were lists "
                        "15.6 % of the time at 1.0, 39.3 % as served at 0.95", above=0.0, high=1.0)
    kl_coef: float = knob(0.05, "KL penalty coefficient against the reference model", low=0.0)
    missing_eos_penalty: float = knob(1.0, "PPO/RLOO: reward subtracted from answers that never end", low=0.0)
    beta: float = knob(0.1, "DPO/KTO: strength of the reference-model constraint", above=0.0)
    epochs: float = knob(2.0, "DPO/KTO: passes over the data", above=0.0)
    min_steps: int = knob(0, "DPO/KTO: few rows get more whole passes, until at least this many optimisation steps "
                          "(0: epochs decide). Iterative DPO's pairs vary with how the reward model spreads the "
                          "sampled answers: 13 pairs on SmolLM2 made 4 steps, a change no user noticed", low=0)
    rloo_generations: int = knob(4, "RLOO: answers sampled per prompt", low=2)
    samples_per_prompt: int = knob(8, "iterative DPO: answers the parent samples per training prompt for the "
                                   "reward model to rank", low=2)
    max_prompts: int = knob(0, "iterative DPO: distinct training prompts the parent samples answers to, at most (a "
                            "seeded random subset; 0: all). Multi-turn chats make a prompt of every rated turn: 150 "
                            "events of them held 91 on SmolLM2, 546 answers to sample before any training", low=0)
    pairs_per_prompt: int = knob(2, "iterative DPO: pairs per prompt (best over worst, second best over second "
                                 "worst, ...)", low=1)
    min_pair_gap: float = knob(0.5, "iterative DPO: smallest reward difference, in standard deviations of the "
                               "sampled answers' rewards, that makes a pair", low=0.0)
    lora: bool = knob(False, "train a LoRA adapter (served on the base's shared weights) instead of all weights")
    lora_r: int = knob(16, "LoRA rank", low=1)
    lora_merge: bool = knob(False, "with lora: save the merged model instead of the adapter")
    lora_value: bool = knob(True, "with lora: PPO's value model (critic) trains a LoRA adapter and its score head "
                            "instead of all its weights")
    seed: int = knob(0, "training seed", low=0)

    def validate(self) -> "PolicySettings":
        """Every field within its range; an algorithm's own rules (PPO's mini-batches) are checked by
        the algorithm (rlhf.policy.algorithms.check_settings)."""
        check_fields(self)
        return self

    def passes(self, rows: int) -> float:
        """DPO/KTO's passes over ``rows`` rows: ``epochs``, or more whole passes until ``min_steps``
        optimisation steps of ``batch_size`` rows."""
        if not self.min_steps:
            return self.epochs
        return max(self.epochs, math.ceil(self.min_steps / max(1, math.ceil(rows / self.batch_size))))


@dataclass(frozen=True)
class GateThresholds:
    min_heldout_pairs: int = knob(8, "fewest held-out preference pairs the gate judges on; with fewer it says "
                                  "\"not enough evidence\" and the candidate is not passed", low=1)
    alpha: float = knob(0.05, "significance level of the gate's evidence: the one-sided p-values of the held-out "
                        "pairs' effect (mean margin above min_margin) and of the judge's gain (above "
                        "min_reward_gain, when the judge counts), combined by Simes' test, must fall below it, and "
                        "neither may show a decline (the pairs' sign test, the judge's signed-rank test) at this "
                        "level", above=0.0, high=1.0)
    min_margin: float = knob(0.75, "the held-out pairs count as evidence of an improvement only when the candidate's "
                             "mean implicit reward margin over them (nats, candidate vs parent) is above this with "
                             "one-sided 1 - alpha confidence (Student's t lower bound): a consistent but tiny shift is "
                             "no improvement. 0.75: the candidate makes the preferred answer about twice as likely "
                             "(e^0.75), relative to the other, as its parent does. Chosen on flat candidates "
                             "(benchmarks/gate_false_pass.py; docs/training.md, \"The evaluation gate\")", low=0.0)
    judge_flat_p: float = knob(0.5, "a trusted judge whose one-sided p-value for any gain (above 0) is at least this "
                               "says \"flat or worse\", and then the held-out pairs alone cannot pass the candidate "
                               "(0.5: its evidence leans to no gain; 1: the judge never vetoes)", above=0.0, high=1.0)
    evidence: str = knob("required", "`required`: the held-out evidence decides; `reported`: it is computed and shown "
                         "but only the KL and degeneration checks decide (development and tests on models too "
                         "small to learn; the run page says so)", choices=("required", "reported"))
    min_reward_gain: float = knob(0.2, "judge reward model (trained on held-out pairs, never optimized against): "
                                  "its gain, candidate minus parent reward per prompt, must exceed this significantly "
                                  "(signed-rank test) to count as evidence of an improvement. The judge is a "
                                  "Bradley-Terry model, so 0.2 means it prefers the candidate's answer about 55 % of "
                                  "the time (sigmoid 0.2); chosen on flat candidates (benchmarks/gate_false_pass.py)")
    max_kl: float = knob(25.0, "largest KL from the parent, in nats per answer, on the candidate's own samples",
                         above=0.0)
    max_empty_rate: float = knob(0.1, "largest share of empty answers", low=0.0, high=1.0)
    max_repetition: float = knob(0.5, "largest share of repeated word trigrams", low=0.0, high=1.0)
    min_distinct2_ratio: float = knob(0.5, "candidate distinct-2 over parent distinct-2 must reach this", low=0.0)
    max_flag_risk_increase: float = knob(0.02, "largest rise of the share of answers users would flag (the safety "
                                         "head's calibrated probability, averaged over the same held-out prompts) "
                                         "from the parent to the candidate", low=0.0, high=1.0)


@dataclass(frozen=True)
class EvalSettings:
    samples_per_prompt: int = knob(2, "answers sampled per held-out prompt", low=1)
    max_prompts: int = knob(64, "held-out prompts evaluated", low=1)
    max_new_tokens: int = knob(64, "longest evaluated answer, in tokens", low=1)
    temperature: float = knob(0.8, "sampling temperature of the evaluation (the app uses the server's unless this "
                              "is set)", above=0.0, high=5.0)
    top_p: float = knob(0.95, "nucleus sampling of the evaluation (the app uses the server's unless this is set): "
                        "the gate judges answers as users get them", above=0.0, high=1.0)
    seed: int = knob(1234, "sampling seed (the same for candidate and parent)", low=0)
    min_judged_prompts: int = knob(16, "fewest prompts the judge's gain is tested over. The judge scores only answers "
                                   "to held-out questions (the ones it learned from); with fewer of them, each is "
                                   "asked again until there are this many, and the gain then speaks for those "
                                   "questions (a deployment whose users ask the same few questions)", low=1)
    max_pairs: int = knob(512, "held-out preference pairs compared, and training pairs the judge's accuracy is "
                          "measured on (at most)", low=1)
    judge_min_steps: int = knob(-1, "fewest optimisation steps of the judge, which trains on the held-out rows alone "
                                "(a few dozen: the reward model's min_steps can be that many epochs over them); "
                                "-1: the reward model's min_steps", low=-1)
    judge_min_questions: int = knob(1, "fewest distinct held-out questions the judge is trained on; with fewer, no "
                                    "judge is trained (the held-out pairs and the checks decide) and the held-out "
                                    "prompts are not asked again for it. A judge of a few questions is rarely "
                                    "trusted: on SmolLM2 one of 3 questions reached 0.58 at 20 steps (156 s), "
                                    "0.74 at 120 (453 s)", low=1)


# ---------------------------------------------------------------------------- rater trust (rlhf.trust)
@dataclass(frozen=True)
class TrustSettings:
    """How much each rater's feedback counts (rlhf.trust, docs/rater-trust.md; docs/trust-and-safety.md,
    "How the loop defends itself"). The numbers in the help texts were measured with rlhf.sim.users.simulate_records:
    30 honest users asking 10 questions each, with or without 10 or 20 contrary users asking 30,
    preferences polite, concise and detailed, 3-5 seeds each."""
    enabled: bool = knob(True, "weigh each rater's feedback before training: volume caps, new identities, "
                         "reliability from agreement with the other raters, quarantine of raters who consistently "
                         "disagree (false: every rating counts the same)")
    max_share: float = knob(0.1, "no rater makes more than this share of a cycle's signal (water-filling: the "
                            "heaviest are cut to a common level); with fewer than 1/max_share raters every rater "
                            "counts the same. 0.1: one person is at most a tenth of a cycle, and it cost 30 honest "
                            "raters nothing (0.05 cost them 1%)", above=0.0, high=1.0)
    max_multiple_of_median: float = knob(2.0, "no rater counts more than this many times the median rater's rows: "
                                         "heavy raters still add data, but volume cannot buy a majority. 2 cost "
                                         "honest raters nothing and cut a 3x-volume swarm of a quarter of the "
                                         "accounts from 57% to 42% of the signal before any other rule (1.5: 35%, "
                                         "but 1% of honest weight)", low=1.0)
    new_weight: float = knob(0.5, "weight of a new identity's rows (a fresh anonymous cookie costs nothing: at half "
                             "weight a swarm needs twice the accounts), and what a new identity counts when camps of "
                             "raters are compared", low=0.0, high=1.0)
    new_hours: float = knob(24.0, "an identity younger than this (hours) is new, unless its agreement with the "
                            "others is significantly above chance, which graduates it (a day: a swarm must be "
                            "created a day ahead of the cycle it targets)", low=0.0)
    new_events: int = knob(5, "an identity with fewer feedback events before this cycle is new too, however old "
                           "(an aged but silent cookie is as cheap as a fresh one); a signed-in account is new by "
                           "its age only", low=0)
    folds: int = knob(5, "raters are split into this many folds; each fold's agreement is measured with a model "
                      "fitted on the other folds' raters (3 and 10 caught the same swarms; 10 took twice as long, "
                      "3 cost honest raters a little more weight)", low=2)
    iterations: int = knob(3, "reweighting rounds (weights -> leave-raters-out fit -> agreement -> weights, "
                           "Dawid-Skene style; 0 turns reliability and quarantine off). 1 round left contrary "
                           "swarms 40% of the signal on average, 2 removed them, 3 is one round of margin", low=0)
    quarantine_p: float = knob(0.01, "significance level of the trust decisions: a rater below chance at this level "
                               "(one-sided binomial test) is quarantined, one below the crowd's agreement is "
                               "down-weighted, a new one above chance graduates, and the guard's tests use it. 0.01 "
                               "quarantined no honest rater in 60 simulated cycles (0.05 cost honest raters up to "
                               "4% of their weight, 0.001 let 7 of 270 contrary raters through)", above=0.0, below=1.0)
    min_checked: int = knob(10, "fewest items of a rater its agreement is measured on before it can quarantine or "
                            "graduate it (at 10 items below chance at p < 0.01 means at most 1 agreeing; 5 and 20 "
                            "gave the same results in the simulations)", low=1)
    prior_strength: float = knob(20.0, "shrinkage of a rater's agreement toward the pooled agreement, in items: a "
                                 "rater with n checked items counts n / (n + prior_strength) of its own evidence "
                                 "(5: honest raters lost up to 4% of their weight, 50: one contrary rater of 270 "
                                 "kept some)", low=0.0)


@dataclass(frozen=True)
class CycleSettings:
    algorithm: str = knob("ppo", "policy-training algorithm", choices=ALGORITHMS)
    min_pairs: int = knob(8, "fewest preference pairs a reward model trains on", low=1)
    min_prompts: int = knob(4, "fewest distinct prompts a PPO/RLOO run trains on", low=1)
    data: DataSettings = field(default_factory=DataSettings)
    reward: RewardSettings = field(default_factory=RewardSettings)
    criteria: CriteriaSettings = field(default_factory=CriteriaSettings)
    policy: PolicySettings = field(default_factory=PolicySettings)
    gate: GateThresholds = field(default_factory=GateThresholds)
    evaluation: EvalSettings = field(default_factory=EvalSettings)
    trust: TrustSettings = field(default_factory=TrustSettings)
    device: str = knob("auto", "auto, cpu, cuda or cuda:N")

    def validate(self) -> "CycleSettings":
        check_fields(self)
        if self.evaluation.max_pairs < self.gate.min_heldout_pairs:
            raise ValueError(f"evaluation.max_pairs={self.evaluation.max_pairs} must be >= "
                             f"gate.min_heldout_pairs={self.gate.min_heldout_pairs} (the gate could never pass)")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
