"""Preference data shared by reward-model training (and DPO): pairs of a chosen and a rejected response."""
