"""Facts: what a host is, read with read-only commands and parsed by pure functions (apt, cuda, nvidia,
system, the model manifests, the accepted models' records in trust) and model integrity judged from them
(modelcheck). Provision (opsctl.ops) and deploy (opsctl.deploy) both read them; nothing here changes a host."""
