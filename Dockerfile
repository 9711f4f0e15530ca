# shuffled daemon image: `docker build -t shuffled .`
# Runs `shuffled serve` as a non-root user. Settings come from SHUFFLED_* variables,
# flags after the image name, or a TOML file passed with --config (see README).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system --gid 10001 shuffled \
    && useradd --system --uid 10001 --gid shuffled --home-dir /var/lib/shuffled --create-home shuffled \
    && install -d -o shuffled -g shuffled /run/shuffled

WORKDIR /opt/shuffled
COPY pyproject.toml README.md ./
COPY shuffled ./shuffled
COPY client/python ./client/python
RUN pip install --no-compile . && rm -rf /opt/shuffled/build

# Listen on all interfaces inside the container; the metrics endpoint serves the
# Kubernetes probes, so it must be reachable from the kubelet. The daemon then needs
# SHUFFLED_ADVERTISE (its address as other daemons reach it) from whoever runs the
# image: deploy/kubernetes sets it from the pod IP; `docker run -e SHUFFLED_ADVERTISE=...`.
ENV SHUFFLED_HOST=0.0.0.0 \
    SHUFFLED_METRICS_HOST=0.0.0.0 \
    SHUFFLED_UNIX_SOCKET=/run/shuffled/shuffled.sock \
    SHUFFLED_DATA_DIR=/var/lib/shuffled/spill

USER 10001:10001
WORKDIR /var/lib/shuffled
# 7337: clients and peer daemons; 7338: /metrics, /healthz, /readyz
EXPOSE 7337 7338
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7338/healthz', timeout=2)"]
ENTRYPOINT ["shuffled", "serve"]
