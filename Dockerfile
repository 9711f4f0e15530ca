# shuffled daemon image: `docker build -t shuffled:0.1.0 .`, then
#   docker run -e SHUFFLED_ADVERTISE=host-a:7337 -e SHUFFLED_POOL_SIZE=4G -p 7337:7337 -p 7338:7338 shuffled:0.1.0
# (the daemon listens on every address of the container, so it must be told the name others reach it by).
# Runs `shuffled serve` as a non-root user. Settings come from SHUFFLED_* variables,
# flags after the image name, or a TOML file passed with --config (see docs/operations.md).
# The Spark plugin, built for every supported Spark line, is in /opt/shuffled/jars
# (shuffled-spark-<line>_<scala>.jar: spark.jars=local:///opt/shuffled/jars/... on Kubernetes).

# Two build stages, independent of each other (BuildKit, or `podman build --jobs 2`, runs them at once).
# plugin: a JDK and each line's Spark jars (from its pyspark release) to compile against; it copies only
# what the plugin is built from, so a change to the Python code leaves its layers cached.
FROM python:3.11-slim-bookworm AS plugin
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jdk-headless \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY shuffled/__init__.py shuffled/spark_jar.py ./shuffled/
COPY client/jvm/src ./shuffled/jvm
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The lines are shuffled.spark_jar.LINES (a test keeps this list equal to it). A line's Spark already at
# hand (a pyspark package or a Spark distribution: a folder with jars/) can be mounted at /spark/<line>
# (`podman build -v DIR:/spark/4.3:ro`, as the image tests do), which saves downloading its pyspark.
RUN for line in 3.5 4.0 4.1 4.2 4.3; do \
        home="/spark/${line}"; \
        if [ ! -d "${home}/jars" ]; then \
            home="/tmp/spark-${line}"; \
            next="${line%.*}.$(( ${line#*.} + 1 ))"; \
            pip download --no-deps --no-binary :all: -d "/tmp/dl-${line}" "pyspark>=${line},<${next}" \
            && mkdir -p "${home}" \
            && tar -xzf "/tmp/dl-${line}"/pyspark-*.tar.gz -C "${home}" --strip-components=2 --wildcards '*/deps/jars/*' \
            || exit 1; \
        fi; \
        python3 -m shuffled.spark_jar --spark-home "${home}" --out-dir /jars \
        && rm -rf "/tmp/dl-${line}" "/tmp/spark-${line}" || exit 1; \
    done

# wheel: the package, its hot path compiled by mypyc (setup.py) with a C compiler.
FROM python:3.11-slim-bookworm AS wheel
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE NOTICE ./
COPY shuffled ./shuffled
COPY client ./client
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# setup.py falls back to pure Python when mypyc cannot compile; the image promises the compiled hot path,
# so its build fails instead (a compiled wheel is tagged cp3XX-...-linux_..., a pure one py3-none-any).
RUN SHUFFLED_COMPILE=1 pip wheel --no-deps -w /wheels . \
    && { compgen -G "/wheels/shuffled-*-cp3*-linux_*.whl" || { echo "mypyc did not compile the hot path" >&2; exit 1; }; }

FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system --gid 10001 shuffled \
    && useradd --system --uid 10001 --gid shuffled --home-dir /var/lib/shuffled --create-home shuffled \
    && install -d -o shuffled -g shuffled /run/shuffled

WORKDIR /opt/shuffled
COPY --from=wheel /wheels /tmp/wheels
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
# /healthz on the metrics port the environment configures (SHUFFLED_METRICS_PORT, or SHUFFLED_CONFIG's file):
# set the ports there rather than as flags after the image name, which the health check does not see.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 CMD ["shuffled", "health"]
ENTRYPOINT ["shuffled", "serve"]
