"""The training loop around rlhf.cycle: the feedback it learns from, runs (lock, records,
spawning), the runner, the watchdog, the curves, and the scheduler that closes the loop."""
