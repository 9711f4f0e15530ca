"""The image as users get it: the Dockerfile built with podman (tests/image.py: once per run, on a stand-in of
its public base made from Debian packages) and run. Its hot path is compiled; it carries the plugin for every
Spark line, equal to what `shuffled spark-jar` builds for that line; its daemon runs as its own user, passes
its health check on the metrics port its environment configures, is scraped by a real Prometheus, and on
`podman stop` drains and exits 0. The executor pod template of deploy/kubernetes runs under `podman kube
play`: the kubelet's probes pass, the executor reaches the daemon through the shared socket volume, and
only thanks to the pod's supplemental group.

Skipped with the reason where podman cannot run (`.ci/run` installs it).
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.error import URLError

import pytest

from shuffled import spark_jar
from shuffled.config import DaemonConfig
from shuffled_client import Client
from tests import reaper
from tests.cluster import http_get, payload, poll_until
from tests.hosts import Host, hosts_for_tests
from tests.image import (
    LABEL,
    Container,
    Image,
    Podman,
    PodmanError,
    compiled_modules,
    daemon_dir,
    remove_leftovers,
    run_label,
    unavailable,
)
from tests.jvm import needs_jdk
from tests.prometheus import prometheus_server, query, scrapes
from tests.units import MiB

# The first test that asks for the image waits for the build (most of it cold: the Spark lines' venvs, the
# stand-in base, the build); later ones reuse it.
pytestmark = [needs_jdk, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
DEFAULTS = DaemonConfig()
#: not the default 7338: the health check must follow the configured port
METRICS_PORT = 9100


def test_the_hot_path_in_the_image_is_compiled(image: Image) -> None:
    compiled = compiled_modules()
    assert {"shuffled.protocol.codec", "shuffled.protocol.credit", "shuffled.net.sender"} <= set(compiled)
    modules = [*compiled, "shuffled.server.daemon"]
    code = f"import importlib\nfor m in {modules!r}: print(m, importlib.import_module(m).__file__)"
    files = dict(line.split() for line in image.python(code).splitlines())
    assert [m for m in compiled if not files[m].endswith(".so")] == [], files
    assert files["shuffled.server.daemon"].endswith(".py"), "the rest of the package stays pure Python"


def _jar_contents(jar: Path) -> dict[str, bytes]:
    """Every entry's bytes; the manifest without the JDK build that made the jar (`Created-By`)."""
    with zipfile.ZipFile(jar) as z:
        out = {name: z.read(name) for name in z.namelist()}
    out["META-INF/MANIFEST.MF"] = re.sub(rb"Created-By: [^\r\n]*\r?\n", b"", out["META-INF/MANIFEST.MF"])
    return out


def test_the_image_carries_the_plugin_built_for_every_spark_line(image: Image, tmp_path: Path) -> None:
    """/opt/shuffled/jars holds one jar per supported line, each with the classes and the line and source
    digest (io/shuffled/spark/line.properties) that `shuffled spark-jar` gives for that line here."""
    assert sorted(image.lines) == sorted(spark_jar.LINES)
    jars = image.copy_out("/opt/shuffled/jars", tmp_path / "jars")
    assert sorted(p.name for p in jars.iterdir()) == sorted(env.jar.name for env in image.lines.values())
    for env in image.lines.values():
        assert _jar_contents(jars / env.jar.name) == _jar_contents(env.jar), f"{env.jar.name} differs"


def test_the_next_build_removes_what_a_killed_run_left_and_keeps_what_a_live_run_holds() -> None:
    """A pod and a network labelled with a run that is gone go at the next build; those of a live run (this
    one) stay. podman 4.3's `network ls` template cannot index its labels: the clean-up failed whenever any
    labelled network existed (another test worker's pod network), and with it every test that needs the image."""
    why = unavailable()
    if why is not None:
        pytest.skip(f"no podman: {why}")
    podman = Podman()
    gone = subprocess.Popen(["sleep", "60"])
    dead = reaper.owner_of(gone.pid)
    gone.kill()
    gone.wait(timeout=30)
    made = {
        f"shuffled-test-{os.getpid()}-{owner}-{kind}": (kind, label)
        for owner, label in (("dead", f"{LABEL}={dead}"), ("live", run_label()))
        for kind in ("pod", "network")
    }
    try:
        for name, (kind, label) in made.items():
            options = ["--infra=false"] if kind == "pod" else []
            podman(kind, "create", *options, "--label", label, name)
        remove_leftovers(podman)
        left = {p["Name"] for p in json.loads(podman("pod", "ps", "--format", "json").stdout or "[]")}
        left |= {n["name"] for n in json.loads(podman("network", "ls", "--format", "json").stdout or "[]")}
        assert {name for name in made if name in left} == {name for name in made if "-live-" in name}
    finally:
        for name, (kind, _) in made.items():
            podman(kind, "rm", "--force", name, check=False)


# -- the daemon container, in a network namespace of its own (a host of tests/hosts.py)


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    with hosts_for_tests(1) as hosts:
        yield hosts.hosts[0]


@pytest.fixture(scope="module")
def daemon(image: Image, host: Host, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    """The image run as its docs say (SHUFFLED_ADVERTISE, the only setting it needs), the metrics port moved."""
    options = [
        "--network", f"ns:/run/netns/{host.netns}",
        "--env", f"SHUFFLED_ADVERTISE={host.daemon_addr}", "--env", "SHUFFLED_POOL_SIZE=64M",
        "--env", f"SHUFFLED_METRICS_PORT={METRICS_PORT}",
        "--volume", f"{daemon_dir(tmp_path_factory.mktemp('daemon') / 'data')}:/var/lib/shuffled",
    ]  # fmt: skip
    container = Container.run(image, f"shuffled-test-{os.getpid()}-daemon", host.daemon_addr, options)
    yield container
    container.remove()


def test_the_daemon_runs_as_its_own_user(daemon: Container) -> None:
    status = daemon.podman("exec", daemon.name, "cat", "/proc/1/status", "/proc/1/cmdline").stdout
    ids = {k: v.split() for k, v in re.findall(r"^(Uid|Gid):\s+(.*)$", status, re.MULTILINE)}
    assert ids == {"Uid": ["10001"] * 4, "Gid": ["10001"] * 4}, status
    assert "shuffled\0serve" in status, "PID 1 is the daemon itself (signals reach it)"


def test_the_health_check_follows_the_configured_metrics_port(daemon: Container, host: Host) -> None:
    """`podman healthcheck run` passes on the moved port, where /healthz and /readyz answer; nothing listens
    on the default port, so a check hard-wired to it would fail."""
    check = daemon.podman("healthcheck", "run", daemon.name, check=False)
    assert check.returncode == 0, check.stdout + check.stderr + daemon.logs()
    for path in ("/healthz", "/readyz"):
        assert http_get(f"{host.addr}:{METRICS_PORT}", path)[0] == 200
    with pytest.raises(URLError) as default_port:
        http_get(f"{host.addr}:{DEFAULTS.metrics_port}", "/healthz")
    assert isinstance(default_port.value.reason, ConnectionRefusedError)


def test_prometheus_scrapes_the_container_and_sees_its_bytes(daemon: Container, host: Host, tmp_path: Path) -> None:
    """The real Prometheus with the deploy/ config, from outside the container as a cluster's would."""
    series = f'shuffled_pushed_bytes_total{{job="shuffled",env="test",instance="{host.addr}:{METRICS_PORT}"}}'
    with prometheus_server(tmp_path, f"{host.addr}:{METRICS_PORT}") as api:
        poll_until(lambda: scrapes(api), 60, "prometheus scrapes the container")
        before = poll_until(lambda: query(api, series), 30, "the pushed bytes series")
        with Client(daemon.addr, timeout=30) as client:
            writer = client.open_writer("image-app", 0, 0, 1, 1)
            writer.write(0, payload(1, 0, MiB))
            writer.commit()
        total = float(before[0]["value"][1]) + MiB
        poll_until(lambda: float(query(api, series)[0]["value"][1]) == total, 60, "pushed bytes rise by 1 MiB")
        (info,) = query(api, "shuffled_info")
        assert info["metric"]["node"] == host.daemon_addr


def test_podman_stop_drains_and_exits_0(daemon: Container) -> None:
    """Last of the daemon's tests: SIGTERM drains, writes the committed data held in memory to the data dir
    (the volume) and exits 0."""
    with Client(daemon.addr, timeout=30) as client:
        writer = client.open_writer("image-stop", 0, 0, 1, 1)
        writer.write(0, payload(1, 0, MiB))
        writer.commit()
    assert daemon.stop() == 0, daemon.logs()
    logs = daemon.logs()
    assert "msg=drained" in logs and "msg=stopped exit_code=0" in logs, logs
    assert re.search(r"msg=persisted shuffles=[1-9]", logs), logs


# -- the executor pod template, played by podman


POD_TEMPLATE = REPO / "deploy" / "kubernetes" / "executor-pod-template.yaml"
#: a Spark image's user (uid 185), in group 10001 only through the pod's supplementalGroups
EXECUTOR_UID = 185
#: the executor's process: Spark's part is played by the test, so it only waits; it ends on SIGTERM (as a
#: container's PID 1 it would not by default)
EXECUTOR_WAITS = "import signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit()); signal.pause()"
#: the pool the sidecar runs with here: smaller than the template's, with the template's headroom
POOL, MEMORY = "256M", "512Mi"


def _played(pod: dict[str, Any], ip: str, image: str) -> dict[str, Any]:
    """The template as podman 4 can play it, and as Spark would fill it in; what changes, and why:
    - podman runs init containers to completion before the others and refuses probes on them: the native
      sidecar becomes the ordinary first container it was before Kubernetes 1.29;
    - podman sets no `status.podIP` and expands no `$(VAR)`: the pod's address is given, as the kubelet would;
    - podman publishes every containerPort on the host's addresses, the kubelet none: the ports go (the
      probes below name them from the template);
    - the sidecar's image (`shuffled:<version>`) is this run's build, under this run's tag;
    - the executor container gets an image and a command (Spark's part) and Spark's user;
    - a smaller pool, its memory limit keeping the template's headroom over the pool."""
    pod = copy.deepcopy(pod)
    spec = pod["spec"]
    (sidecar,) = spec.pop("initContainers")
    assert sidecar.pop("restartPolicy") == "Always"
    env = {"POD_IP": ip}
    for item in sidecar["env"]:
        if item.pop("valueFrom", None) is not None:
            item["value"] = env[item["name"]]
        elif item["name"] == "SHUFFLED_POOL_SIZE":
            item["value"] = POOL
        else:
            item["value"] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], item["value"])
        env[item["name"]] = item["value"]
    sidecar["resources"]["requests"]["memory"] = sidecar["resources"]["limits"]["memory"] = MEMORY
    sidecar["image"] = image
    (executor,) = spec["containers"]
    executor.update(
        image=image,
        # Spark's part is played by the test; this only waits, and ends on SIGTERM (as PID 1 it would not by default)
        command=[
            "python3",
            "-c",
            "import signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit()); signal.pause()",
        ],
        securityContext={"runAsUser": EXECUTOR_UID, "runAsGroup": EXECUTOR_UID},
    )
    for container in (sidecar, executor):
        container.pop("ports", None)
    spec["containers"] = [sidecar, executor]
    return pod


class PodNetwork:
    """An internal podman network (no route out, no NAT) on a bridge and a /24 of 198.18.0.0/15 of its own;
    the host has the gateway address, so the test reaches pods at their IPs as a kubelet does. The run's
    reaper (tests/reaper.py) hands out the subnet (no run holds it, no address or route of the host overlaps
    it) and the name; a subnet podman still refuses as in use (by a network of another podman storage) is
    kept aside and the next one tried."""

    TRIES = 5

    def __init__(self, podman: Podman) -> None:
        self.podman = podman
        self.run = reaper.current()
        tag = self.run.tag()
        self.name, self.bridge = f"shuffled-test-{tag}", f"shpod{tag}"
        self.run.add("link", self.bridge)
        self.subnets: list[str] = []
        for _ in range(self.TRIES):
            self.subnets.append(str(self.run.subnet()))
            create = ["network", "create", "--internal", "--disable-dns", "--subnet", self.subnets[-1]]
            done = podman(*create, "--label", self.run.label, self.name, check=False)
            if done.returncode == 0:
                break
            if "already used" not in done.stderr:
                raise PodmanError(f"podman network create: {done.stderr.strip()}")
        else:
            raise PodmanError(f"podman refused {self.TRIES} subnets as already used: {', '.join(self.subnets)}")
        self.prefix = self.subnets[-1].rpartition(".")[0]
        # podman 4.3 cannot name the bridge (--interface-name came in 4.4): its network file is given one, so
        # that the bridge cannot be another podman's podman0 or podman1.
        path = podman.network_dir / f"{self.name}.json"
        config = json.loads(path.read_text())
        config["network_interface"] = self.bridge
        path.write_text(json.dumps(config))

    def reach(self) -> None:
        """The gateway address on the bridge, which podman made for the first pod."""
        subprocess.run(["ip", "addr", "add", f"{self.prefix}.1/24", "dev", self.bridge], check=True, timeout=30)

    def remove(self) -> None:
        self.podman("network", "rm", "--force", self.name, check=False)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)
        self.run.remove("link", self.bridge)
        for subnet in self.subnets:
            self.run.remove("subnet", subnet)


@dataclass
class PlayedPod:
    template: dict[str, Any]
    name: str
    ip: str

    def container(self, name: str) -> str:
        """The podman name of one of its containers."""
        return f"{self.name}-{name}"

    def spec(self, name: str) -> dict[str, Any]:
        """One of its containers as the template says."""
        spec = self.template["spec"]
        every: list[dict[str, Any]] = spec.get("initContainers", []) + spec["containers"]
        (container,) = [c for c in every if c["name"] == name]
        return container

    def probe(self, kind: str) -> bool:
        """One of the sidecar's probes as the kubelet makes it: its path, on the port its name says, at the
        pod's IP."""
        sidecar = self.spec("shuffled")
        http = sidecar[kind]["httpGet"]
        port = {p["name"]: p["containerPort"] for p in sidecar["ports"]}[http["port"]]
        try:
            status, _ = http_get(f"{self.ip}:{port}", http["path"], timeout=sidecar[kind].get("timeoutSeconds", 1))
        except OSError:
            return False
        return status == 200


@pytest.fixture(scope="module")
def pod(image: Image, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlayedPod]:
    yaml = pytest.importorskip("yaml")
    (template,) = [d for d in yaml.safe_load_all(POD_TEMPLATE.read_text()) if d]
    network = PodNetwork(image.podman)
    ip = f"{network.prefix}.10"
    played = _played(template, ip, image.name)
    played["metadata"]["name"] = network.name
    played["metadata"]["labels"][LABEL] = network.run.owner
    path = tmp_path_factory.mktemp("pod") / "pod.yaml"
    path.write_text(yaml.safe_dump(played))
    try:
        image.podman("kube", "play", "--network", network.name, "--ip", ip, str(path), timeout=300)
        network.reach()
        yield PlayedPod(template, network.name, ip)
    finally:
        image.podman("kube", "down", str(path), check=False, timeout=300)
        network.remove()


def test_the_executor_pod_template_runs_with_its_probes_and_socket_volume(image: Image, pod: PlayedPod) -> None:
    """The kubelet's probes pass; the sidecar runs as its user on a read-only root file system within its
    memory limit; the executor (Spark's user) reaches the daemon through the socket volume, as a member of
    the pod's supplemental group only: a process without that group is refused; `podman pod stop` drains
    the daemon, which exits 0."""
    startup = pod.spec("shuffled")["startupProbe"]
    bound = startup["periodSeconds"] * startup["failureThreshold"]
    poll_until(lambda: pod.probe("startupProbe"), bound, "the startup probe passes")
    assert pod.probe("livenessProbe") and pod.probe("readinessProbe")

    sidecar, executor = pod.container("shuffled"), pod.container("spark-kubernetes-executor")
    config = image.podman("inspect", "--format", "{{.HostConfig.ReadonlyRootfs}} {{.HostConfig.Memory}}", sidecar)
    assert config.stdout.split() == ["true", str(512 * MiB)]
    status = image.podman("exec", sidecar, "cat", "/proc/1/status").stdout
    assert re.search(r"^Uid:\s+10001\s", status, re.MULTILINE), status

    socket = pod.spec("spark-kubernetes-executor")["volumeMounts"][0]["mountPath"] + "/shuffled.sock"
    stats = image.podman("exec", executor, "shuffled", "stats", f"unix:{socket}")
    assert json.loads(stats.stdout)["node"] == f"{pod.ip}:7337"
    user = f"{EXECUTOR_UID}:{EXECUTOR_UID}"
    outsider = image.podman("exec", "--user", user, executor, "shuffled", "stats", f"unix:{socket}", check=False)
    assert outsider.returncode == 1 and "Permission denied" in outsider.stderr, outsider.stderr

    image.podman("pod", "stop", "--time", str(pod.template["spec"]["terminationGracePeriodSeconds"]), pod.name)
    assert image.podman("inspect", "--format", "{{.State.ExitCode}}", sidecar).stdout.strip() == "0"
    logs = image.podman("logs", sidecar).stderr
    assert '"msg": "drained"' in logs, logs
