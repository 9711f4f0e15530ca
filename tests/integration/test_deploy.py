"""Dockerfile and deploy/: linted by the tools operators use, consistent with the package,
and the monitoring pieces checked against a live daemon and a real Prometheus server.

Tools that are missing make their test skip with the reason; `.ci/run` installs them.
"""

from __future__ import annotations

import asyncio
import configparser
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuffled import __version__, spark_jar
from shuffled import config as settings
from shuffled.cli import _build_parser
from shuffled.config import DaemonConfig, parse_size
from shuffled_client import AsyncClient
from tests.aio import within
from tests.cluster import DaemonProcess, free_port, http_get, metric_samples, payload, start_daemon, wait_until
from tests.prometheus import prometheus_dir, prometheus_server, query, scrapes, tool
from tests.units import MiB

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DEFAULTS = DaemonConfig()


def _run(*cmd: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)


def _yaml_docs(path: Path) -> list[dict[str, Any]]:
    yaml = pytest.importorskip("yaml")
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# -- Dockerfile


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_passes_hadolint() -> None:
    result = _run(tool("hadolint"), str(ROOT / "Dockerfile"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_runs_the_package_entry_point_on_its_ports() -> None:
    instructions = _dockerfile()

    def get(name: str) -> list[str]:
        return [args for word, args in instructions if word == name]

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    (entry,) = get("ENTRYPOINT")
    command = json.loads(entry)
    assert command[0] in scripts and scripts[command[0]] == "shuffled.cli:main"
    assert _build_parser().parse_args(command[1:]).command == "serve"
    exposed = {int(p) for args in get("EXPOSE") for p in args.split()}
    assert exposed == {DEFAULTS.port, DEFAULTS.metrics_port}
    # The health check asks the daemon's /healthz where the container's settings put it (`shuffled health`).
    (health,) = get("HEALTHCHECK")
    check = json.loads(health.split("CMD", 1)[1])
    assert check[0] == command[0] and _build_parser().parse_args(check[1:]).command == "health"
    (user,) = get("USER")
    assert user.split(":")[0] not in ("root", "0")
    shuffled_env = _image_env()
    assert not settings.unknown_env(shuffled_env)
    # The image listens on 0.0.0.0, so whoever runs it names the daemon (the manifests set it from the pod IP).
    with pytest.raises(settings.ConfigError, match="advertise must be set"):
        settings.load(None, shuffled_env)
    config, _ = settings.load(None, {**shuffled_env, "SHUFFLED_ADVERTISE": "10.1.2.3:7337"})
    assert config.metrics_host == "0.0.0.0" and config.host == "0.0.0.0"
    for args in get("COPY"):
        if args.startswith("--from="):
            continue  # from a build stage, not from the source tree
        for src in args.split()[:-1]:
            assert (ROOT / src).exists(), f"COPY {src}: no such path"


def test_the_image_builds_the_plugin_for_every_supported_spark_line() -> None:
    """The build stage's loop names the lines shuffled.spark_jar supports, and the image keeps their jars."""
    (loop,) = [args for word, args in _dockerfile() if word == "RUN" and "for line in" in args]
    lines = loop.split("for line in", 1)[1].split(";", 1)[0].split()
    assert lines == list(spark_jar.LINES)
    assert "--spark-home" in loop
    assert ("COPY", "--from=plugin /jars /opt/shuffled/jars") in _dockerfile()


def _image_env() -> dict[str, str]:
    """The SHUFFLED_ variables the image sets."""
    pairs = (item.split("=", 1) for word, args in _dockerfile() if word == "ENV" for item in shlex.split(args))
    return {k: v for k, v in pairs if k.startswith("SHUFFLED_")}


# -- Kubernetes


def test_kubernetes_manifests_validate() -> None:
    validate = tool("kubernetes-validate")
    result = _run(validate, "--strict", *map(str, sorted((DEPLOY / "kubernetes").glob("*.yaml"))))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed" in result.stdout + result.stderr


def _env_config(container: dict[str, Any], extra: dict[str, str] | None = None) -> DaemonConfig:
    """The configuration the image's and the container's env (and --config args) give, $(VAR) resolved."""
    env = {**_image_env(), "POD_IP": "10.1.2.3", "NODE_IP": "10.0.0.5", **(extra or {})}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], item["value"])
    shuffled_env = {k: v for k, v in env.items() if k.startswith("SHUFFLED_")}
    assert not settings.unknown_env(shuffled_env)
    args = _build_parser().parse_args(["serve", *container.get("args", [])])
    config, _ = settings.load(args, shuffled_env)
    return config


def _check_daemon_container(container: dict[str, Any], config: DaemonConfig) -> None:
    assert container["image"] == f"shuffled:{__version__}"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["shuffled"] == config.port and ports["shuffled-http"] == config.metrics_port
    assert config.metrics_host == "0.0.0.0" and config.host == "0.0.0.0"  # probes come from the kubelet
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "shuffled-http"}
    memory = container["resources"]["limits"]["memory"]
    assert memory == container["resources"]["requests"]["memory"]
    headroom = parse_size(memory.removesuffix("i")) - config.pool_size
    assert 128 * MiB <= headroom <= 1024 * MiB, f"memory {memory} is not pool {config.pool_size} + 128Mi..1Gi"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert config.unix_socket is not None and str(Path(config.unix_socket).parent) in mounts
    assert config.data_dir is not None and any(config.data_dir.startswith(m) for m in mounts)
    assert container["securityContext"]["runAsNonRoot"] is True


def test_executor_pod_template_sidecar_matches_the_daemon_and_spark_conf() -> None:
    (pod,) = _yaml_docs(DEPLOY / "kubernetes" / "executor-pod-template.yaml")
    (sidecar,) = pod["spec"]["initContainers"]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: up before the executor, down after it
    config = _env_config(sidecar)
    _check_daemon_container(sidecar, config)
    assert config.advertise == f"10.1.2.3:{config.port}"
    assert pod["spec"]["terminationGracePeriodSeconds"] > config.drain_timeout

    conf = dict(
        line.split(None, 1) for line in (DEPLOY / "spark" / "spark-defaults.conf").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )  # fmt: skip
    assert conf["spark.shuffled.address"] == f"unix:{config.unix_socket}"
    (executor,) = pod["spec"]["containers"]
    assert executor["name"] == conf["spark.kubernetes.executor.podTemplateContainerName"]
    shared = {m["name"] for m in executor["volumeMounts"]} & {m["name"] for m in sidecar["volumeMounts"]}
    assert config.unix_socket is not None
    assert any(m["mountPath"] == str(Path(config.unix_socket).parent) for m in executor["volumeMounts"])
    assert shared, "the executor must mount the sidecar's socket directory"
    assert config.unix_socket_mode & 0o060 == 0o060 and 10001 in pod["spec"]["securityContext"]["supplementalGroups"]


def test_daemonset_config_map_and_container_match(tmp_path: Path) -> None:
    docs = {d["kind"]: d for d in _yaml_docs(DEPLOY / "kubernetes" / "daemonset.yaml")}
    toml = tmp_path / "shuffled.toml"
    toml.write_text(docs["ConfigMap"]["data"]["shuffled.toml"])
    spec = docs["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    args = container["args"]
    assert args[:2] == ["--config", "/etc/shuffled/shuffled.toml"]
    container = {**container, "args": ["--config", str(toml)]}
    config = _env_config(container)
    _check_daemon_container(container, config)
    # The daemon advertises its pod IP, which the host network makes its node's IP: what the peers
    # Service's DNS returns for it, so it is on every daemon's placement ring once, under its own name.
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    (pod_ip,) = [e for e in container["env"] if e["name"] == "POD_IP"]
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert config.advertise == f"10.1.2.3:{config.port}"
    assert spec["terminationGracePeriodSeconds"] > config.drain_timeout
    # A rolling restart hands data over: the daemon drains (and copies) before Kubernetes sends SIGTERM.
    assert config.replicas >= 2 and config.drain_handoff == "on"
    hook = _build_parser().parse_args(container["lifecycle"]["preStop"]["exec"]["command"][1:])
    assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "shuffled"
    assert hook.command == "drain" and hook.wait and not hook.no_handoff
    assert hook.address == f"unix:{config.unix_socket}"
    assert hook.timeout is None or hook.timeout < spec["terminationGracePeriodSeconds"]
    budget = docs["PodDisruptionBudget"]
    assert budget["apiVersion"] == "policy/v1" and budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"] == docs["DaemonSet"]["spec"]["selector"]
    assert budget["metadata"]["namespace"] == docs["DaemonSet"]["metadata"]["namespace"]
    _check_peers_service(docs, config)


def _check_peers_service(docs: dict[str, dict[str, Any]], config: DaemonConfig) -> None:
    """`peers_dns` names a headless Service that lists every daemon pod, ready or not, on the daemon port."""
    service, daemonset = docs["Service"], docs["DaemonSet"]
    spec = service["spec"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    assert spec["selector"] == daemonset["spec"]["selector"]["matchLabels"]
    assert spec["selector"].items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    (port,) = spec["ports"]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port["port"] == config.port and named[port["targetPort"]] == config.port
    namespace = service["metadata"]["namespace"]
    assert namespace == daemonset["metadata"]["namespace"]
    assert config.peers_dns == f"{service['metadata']['name']}.{namespace}.svc:{config.port}"
    assert not config.peers, "the Service lists the daemons; a static list would go stale"


# -- systemd


def test_systemd_unit_runs_the_example_config() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "systemd" / "shuffled.service")
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"])
    assert (
        Path(argv[0]).name == "shuffled"
        and argv[1] == "serve"
        and argv[2:] == ["--config", "/etc/shuffled/shuffled.toml"]
    )
    # The unit names the daemon (the example config listens on 0.0.0.0); %H is systemd's host name specifier.
    key, value = service["Environment"].replace("%H", "host-a").split("=", 1)
    args = _build_parser().parse_args(["serve", "--config", str(DEPLOY / "shuffled.toml")])
    config, _ = settings.load(args, {key: value})
    assert config.advertise == f"host-a:{config.port}"
    assert int(service["TimeoutStopSec"]) > config.drain_timeout
    assert service["KillSignal"] == "SIGTERM"
    assert config.unix_socket == f"/run/{service['RuntimeDirectory']}/shuffled.sock"
    assert config.data_dir is not None and config.data_dir.startswith(f"/var/lib/{service['StateDirectory']}/")


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    """systemd's own checker, with ExecStart pointing at this installation's `shuffled` script."""
    analyze = tool("systemd-analyze")
    script = shutil.which("shuffled")
    if script is None:
        pytest.skip("the shuffled script is not installed (pip install -e .)")
    unit = tmp_path / "shuffled.service"
    text = (DEPLOY / "systemd" / "shuffled.service").read_text()
    unit.write_text(re.sub(r"(?m)^ExecStart=\S+", f"ExecStart={script}", text))
    result = _run(analyze, "verify", str(unit))
    problems = [line for line in (result.stdout + result.stderr).splitlines() if str(unit) in line]
    assert result.returncode == 0 and not problems, result.stdout + result.stderr


# -- Prometheus and Grafana


def test_promtool_checks_config_and_rules(tmp_path: Path) -> None:
    promtool = tool("promtool")
    rules = _run(promtool, "check", "rules", str(DEPLOY / "prometheus" / "alerts.yml"))
    assert rules.returncode == 0 and "SUCCESS" in rules.stdout, rules.stdout + rules.stderr
    unit = _run(promtool, "test", "rules", "alerts-test.yml", cwd=DEPLOY / "prometheus")
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr
    (alerts,) = _yaml_docs(DEPLOY / "prometheus" / "alerts.yml")
    (tests,) = _yaml_docs(DEPLOY / "prometheus" / "alerts-test.yml")
    tested = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert tested == {r["alert"] for g in alerts["groups"] for r in g["rules"]}, "every alert has a firing test"
    work = prometheus_dir(tmp_path, "127.0.0.1:7338")
    config = _run(promtool, "check", "config", "prometheus.yml", cwd=work)
    assert config.returncode == 0, config.stdout + config.stderr


def test_promtool_checks_the_kubernetes_config() -> None:
    promtool = tool("promtool")
    result = _run(promtool, "check", "config", "prometheus-kubernetes.yml", cwd=DEPLOY / "prometheus")
    if "field kubernetes_sd_configs not found" in result.stdout + result.stderr:
        pytest.skip("this promtool is built without Kubernetes service discovery (Debian's package is)")
    assert result.returncode == 0, result.stdout + result.stderr


def _exprs() -> list[str]:
    """Every PromQL expression in the alert rules and the dashboard."""
    (rules,) = _yaml_docs(DEPLOY / "prometheus" / "alerts.yml")
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dashboard = json.loads((DEPLOY / "grafana" / "shuffled-dashboard.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return exprs


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    data = tmp_path_factory.mktemp("data")
    d = start_daemon("127.0.0.1", free_port(["127.0.0.1"]), "32M", ["--data-dir", str(data)])
    yield d
    d.stop()


def test_every_metric_in_rules_and_dashboard_exists_on_a_live_daemon(daemon: DaemonProcess) -> None:
    status, body = http_get(daemon.http, "/metrics")
    assert status == 200
    live = {re.sub(r"\{.*", "", key) for key in metric_samples(body)}
    used = {name for expr in _exprs() for name in re.findall(r"\b((?:shuffled|process)_[a-z0-9_]+)\b", expr)}
    assert len(used) >= 20
    assert not used - live, f"used in deploy/ but not served by the daemon: {sorted(used - live)}"
    # `up` is Prometheus' own series for the scrape; it is the only other name the rules use.
    others = {n for e in _exprs() for n in re.findall(r"\b(up)\{", e)}
    assert others <= {"up"}


@within(120)
async def test_real_prometheus_scrapes_a_daemon_and_sees_bytes_rise(daemon: DaemonProcess, tmp_path: Path) -> None:
    """Prometheus with the deploy/ config scrapes the daemon; pushed bytes show up in its API."""

    def pushed(api: str) -> float:
        result = query(api, 'shuffled_pushed_bytes_total{job="shuffled",env="test"}')
        return float(result[0]["value"][1]) if result else -1.0

    async def body(api: str) -> None:
        await wait_until(
            lambda: asyncio.to_thread(scrapes, api), bool, timeout=60, what="prometheus scrapes the daemon"
        )
        before = await wait_until(lambda: asyncio.to_thread(pushed, api), lambda v: v >= 0, timeout=30, what="series")
        client = await AsyncClient.connect(daemon.addr)
        w = await client.open_writer("prom-app", 0, 0, 1, 2)
        await w.write(0, payload(1, 0, 3 * MiB))
        await w.write(1, payload(1, 1, 1 * MiB))
        await w.commit()
        await client.close()
        after = await wait_until(
            lambda: asyncio.to_thread(pushed, api), lambda v: v >= before + 4 * MiB, timeout=60, what="bytes rise"
        )
        assert after == before + 4 * MiB
        status, rules = await asyncio.to_thread(http_get, api, "/api/v1/rules")
        assert status == 200, rules
        names = {r["name"] for g in json.loads(rules)["data"]["groups"] for r in g["rules"]}
        assert {"ShuffledDown", "ShuffledPoolExhausted", "ShuffledDiskNearlyFull"} <= names

    with prometheus_server(tmp_path, daemon.http) as api:
        await asyncio.wait_for(body(api), 150)
