"""Fleet orchestration, above deploy and the router: deploys across hosts (runner: locks, batches, canary,
max-fail, Ctrl-C; the batches planned in plan), one service through the runner for other commands (service),
drain-aware rolling deploys behind a router (rolling), and the canary measured (canary) and judged (judge)."""
