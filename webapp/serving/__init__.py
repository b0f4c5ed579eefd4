"""Which model answers: the base model's first build, the versions' fallbacks when one cannot
load, the pool of loaded models, and the route of each user's next answer."""
