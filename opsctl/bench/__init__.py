"""`opsctl bench`: measure services side by side (tok/s, time to first token, acceptance length)."""
