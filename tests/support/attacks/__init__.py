"""The attack ledger and what the attack tests share."""
