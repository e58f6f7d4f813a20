"""Releases, the per-host deploy lock, the health and smoke gates, rollout and rollback, the audit log."""
