"""What provision (opsctl.ops) and deploy (opsctl.deploy) share, on the ground floor below both: the audit line
(audit), the health gate (gate), the package locks (locks) and the hashing of local files (hashing)."""
