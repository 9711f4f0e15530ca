"""Operating the daemon: Prometheus metrics and the HTTP endpoint for /metrics, /healthz and /readyz."""
