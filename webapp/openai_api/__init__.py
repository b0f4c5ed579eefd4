"""The OpenAI-compatible API (/v1): keys, the end users behind them, completions stored as conversations."""
