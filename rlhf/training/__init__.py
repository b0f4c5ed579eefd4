"""Trainer plumbing shared by the reward and policy stages: TRL callbacks and precision,
multi-process (accelerate) coordination and the training-curves file."""
