"""Monitoring rendered from the inventory: Prometheus scrape configuration with file_sd targets, recording and
alert rules (opsctl.monitor.rules), a Grafana dashboard (opsctl.monitor.dashboard). docs/monitoring.md."""
