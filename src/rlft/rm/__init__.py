"""The reward-model job (kind: rm)."""
