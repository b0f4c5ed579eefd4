"""The reward model: scoring answers, per-criterion heads and the safety cost, and training it."""
