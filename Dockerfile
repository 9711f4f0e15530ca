# shuffled daemon image: `docker build -t shuffled .`
# Runs `shuffled serve` as a non-root user. Settings come from SHUFFLED_* variables,
# flags after the image name, or a TOML file passed with --config (see README).
# The Spark plugin, built for every supported Spark line, is in /opt/shuffled/jars
# (shuffled-spark-<line>_<scala>.jar: spark.jars=local:///opt/shuffled/jars/... on Kubernetes).

# Build stage: a JDK, and each line's Spark jars (from its pyspark release) to compile against; a C
# compiler for the wheel whose hot path mypyc compiles (setup.py; pure Python if that fails).
FROM python:3.11-slim-bookworm AS plugin
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jdk-headless gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE NOTICE ./
COPY shuffled ./shuffled
COPY client ./client
RUN SHUFFLED_COMPILE=1 pip wheel --no-deps -w /wheels .
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The lines are shuffled.spark_jar.LINES (a test keeps this list equal to it).
RUN for line in 3.5 4.0 4.1 4.2 4.3; do \
        next="${line%.*}.$(( ${line#*.} + 1 ))"; \
        pip download --no-deps --no-binary :all: -d "/tmp/dl-${line}" "pyspark>=${line},<${next}" \
        && mkdir -p "/tmp/spark-${line}" \
        && tar -xzf "/tmp/dl-${line}"/pyspark-*.tar.gz -C "/tmp/spark-${line}" --strip-components=2 --wildcards '*/deps/jars/*' \
        && python3 -m shuffled.spark_jar --spark-home "/tmp/spark-${line}" --out-dir /jars \
        && rm -rf "/tmp/dl-${line}" "/tmp/spark-${line}" || exit 1; \
    done

FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system --gid 10001 shuffled \
    && useradd --system --uid 10001 --gid shuffled --home-dir /var/lib/shuffled --create-home shuffled \
    && install -d -o shuffled -g shuffled /run/shuffled

WORKDIR /opt/shuffled
COPY --from=plugin /wheels /tmp/wheels
RUN pip install --no-compile /tmp/wheels/shuffled-*.whl && rm -rf /tmp/wheels
COPY --from=plugin /jars /opt/shuffled/jars

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
