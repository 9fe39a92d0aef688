"""The DPO job (kind: dpo)."""
