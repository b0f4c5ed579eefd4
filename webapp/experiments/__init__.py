"""A/B experiments: GrowthBook-compatible hashing and sticky assignment, the experiment and version
lifecycle, per-arm metrics and their statistics, and the promotion policy."""
