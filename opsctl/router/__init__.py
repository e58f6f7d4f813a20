"""sglang-router in front of services, as a target of its own: render its release (render), deploy it like a
service (deploy, run), speak to its control API (api), keep its membership file (keptout), report it (status)
and remove it (remove). Rolling and canary deploys behind it are opsctl.rollout's."""
