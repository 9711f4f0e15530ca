"""Operating the daemon: the typed stats snapshot it reports, Prometheus metrics and the HTTP endpoint for
/metrics, /healthz and /readyz."""
