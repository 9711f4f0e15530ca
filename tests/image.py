"""The shuffled image, built from the Dockerfile and run with podman: one build per test session (the `image`
fixture in tests/conftest.py) for the image tests (tests/integration/test_image.py) and the sidecar tests
(tests/spark/test_sidecar.py).

podman runs with the tests' own settings (tests/podman/containers.conf, for VMs without full privileges)
and its own storage under ``$SHUFFLED_PODMAN`` (default ``~/.cache/shuffled/podman``), so the machine's
podman is left alone and later runs reuse the base image and the build's layers; delete the directory to
build cold. The Dockerfile's base, python:3.11-slim-bookworm, is not pulled (there may be no registry): a
stand-in is made from Debian packages (mmdebstrap, then tests/podman/python-base.Containerfile) and tagged
with that name in this storage only. Each Spark line's pyspark (tests/spark_lines.py) is mounted into the
build at /spark/<line>, so the build downloads no Spark. The build itself uses the host's network (apt and
PyPI); the containers only what the tests own: no network and a Unix socket in a shared directory, a
network namespace of tests/hosts.py, or an internal podman network on a bridge and subnet of the run's own
(`podman kube play` cannot put a pod into a namespace).

Everything a run creates in podman carries the label `shuffled-test=<owner>` (tests/reaper.py names the run's
owner) and is removed by the test that made it; should the run be killed, its reaper removes the containers,
pods and networks of that label, and the next build removes what runs of older trees left (their label is
their pid). `unavailable` says why podman cannot run here (tests skip with it; `.ci/run` installs the tools).
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shuffled_client import Client, ShuffledError
from tests import reaper
from tests.cluster import poll_until
from tests.spark_lines import LineEnv

REPO = Path(__file__).resolve().parents[1]
CONF = Path(__file__).resolve().parent / "podman"
STATE = Path(os.environ.get("SHUFFLED_PODMAN", Path.home() / ".cache" / "shuffled" / "podman"))
#: the images the tests build: each run tags its own (`:<pid>`), so that runs at once from different trees
#: never run each other's build
IMAGES = "localhost/shuffled-test"
#: the Dockerfile's FROM, made locally
PYTHON_BASE = "docker.io/library/python:3.11-slim-bookworm"
#: how the stand-in's Debian is made; its tag carries a digest of this, so a changed recipe is built anew
DEBIAN_RECIPE = (
    "--variant=minbase",
    "--include=python3,python3-venv,python3-pip,python3-dev,ca-certificates,passwd",
    "bookworm",
)
#: the host's own CA certificates (Debian's place for them), which pip and apt in the build must trust too
HOST_CAS = Path("/usr/local/share/ca-certificates")
TOOLS = ("podman", "mmdebstrap", "runc")
#: the container's daemon user (the Dockerfile's USER): directories it shares with the host belong to it
DAEMON_UID = 10001
BUILD_TIMEOUT = 1500


def compiled_modules() -> list[str]:
    """setup.py's COMPILED (the modules mypyc compiles), as module names."""
    tree = ast.parse((REPO / "setup.py").read_text())
    (paths,) = [
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["COMPILED"]
    ]
    return [p.removesuffix(".py").replace("/", ".") for p in paths]


class PodmanError(RuntimeError):
    pass


class Podman:
    """The podman command with the tests' settings and storage."""

    def __init__(self, state: Path = STATE) -> None:
        # Run-time state on tmpfs, one per storage: podman needs the same one for every use of a storage.
        run = Path("/run/shuffled-test-podman") / hashlib.sha256(str(state).encode()).hexdigest()[:12]
        #: where podman keeps the networks' files
        self.network_dir = state / "networks"
        self.flags = [
            "--root", str(state / "storage"), "--runroot", str(run / "run"), "--tmpdir", str(run / "tmp"),
            "--network-config-dir", str(self.network_dir),
        ]  # fmt: skip
        self.env = {**os.environ, "CONTAINERS_CONF": str(CONF / "containers.conf")}
        # what the run makes in this storage is the run's to remove, should it be killed
        reaper.current().add("podman", self.argv(), self.env["CONTAINERS_CONF"])

    def argv(self, *args: str) -> list[str]:
        return ["podman", *self.flags, *args]

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout, env=self.env)
        if check and done.returncode != 0:
            raise PodmanError(f"podman {' '.join(args)}: exit {done.returncode}\n{done.stderr[-4000:]}")
        return done


def unavailable() -> str | None:
    """Why the image cannot be built and run here, or None."""
    if os.geteuid() != 0:
        return "the image tests run podman as root"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not installed (.ci/run installs them: apt-get install podman mmdebstrap runc)"
    info = Podman()("info", check=False)
    if info.returncode != 0:
        return f"podman info failed: {info.stderr.strip()[-500:]}"
    return None


@dataclass
class Image:
    podman: Podman
    name: str
    #: every supported Spark line, whose pyspark the build compiled the plugin against
    lines: dict[str, LineEnv]

    def copy_out(self, path: str, dest: Path) -> Path:
        """``path`` of the image, copied to ``dest`` on the host."""
        container = self.podman("create", "--label", run_label(), self.name).stdout.strip()
        try:
            self.podman("cp", f"{container}:{path}", str(dest))
        finally:
            self.podman("rm", container)
        return dest

    def remove(self) -> None:
        """The run's tag goes; the layers stay, the next build's cache."""
        self.podman("untag", self.name, self.name, check=False)

    def python(self, code: str) -> str:
        """What ``code`` prints, run by the image's Python as the image's user (without a network)."""
        return self.podman("run", "--rm", "--network", "none", "--entrypoint", "python3", self.name, "-c", code).stdout


#: the label on everything a test run creates in podman, with the run's owner (tests/reaper.py)
LABEL = reaper.LABEL


def run_label() -> str:
    return reaper.current().label


def remove_leftovers(podman: Podman) -> None:
    """Containers, pods, networks and image tags of earlier runs whose process is gone (killed before it
    could remove them): they would hold memory and bridges until the machine restarts. The listings are
    read as JSON: podman 4.3's `network ls` template gives its labels as one string, not a map."""
    for listing, removing in (
        (["pod", "ps"], ["pod", "rm", "--force"]),
        (["ps", "--all"], ["rm", "--force", "--time", "0"]),
        (["network", "ls"], ["network", "rm", "--force"]),
    ):
        found = podman(*listing, "--filter", f"label={LABEL}", "--format", "json")
        for thing, owner in _labelled(json.loads(found.stdout or "[]")):
            if not _alive(owner):
                podman(*removing, thing, check=False)
    tags = podman("images", "--format", "{{.Repository}} {{.Tag}}").stdout.split("\n")
    for repository, pid in (line.split() for line in tags if line.startswith(f"{IMAGES} ")):
        if not Path(f"/proc/{pid}").is_dir():
            podman("untag", f"{repository}:{pid}", f"{repository}:{pid}", check=False)


def _labelled(listing: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    """(name, owner) of each entry of a podman JSON listing; the keys' case and the name's shape differ
    between pods (Name), containers (Names, a list) and networks (name)."""
    for entry in listing:
        fields = {key.lower(): value for key, value in entry.items()}
        name = fields.get("name") or fields["names"][0]
        yield name, (fields.get("labels") or {})[LABEL]


def _alive(owner: str) -> bool:
    """Whether the run of a label is still going: its owner (or, labelled by older trees, its pid) is alive."""
    return reaper.alive(owner) if "_" in owner else Path(f"/proc/{owner}").is_dir()


def build(lines: dict[str, LineEnv], scratch: Path) -> Image:
    """The Dockerfile built as this run's image on the stand-in base, with each line's pyspark mounted. The
    test workers build the same image one at a time, so each after the first finds every layer in the build
    cache (two builds at once on two cores each took the other's CPU for minutes)."""
    podman = Podman()
    name = f"{IMAGES}:{os.getpid()}"
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when this process ends, however it ends
        remove_leftovers(podman)
        _python_base(podman, _debian(podman, scratch), scratch)
        mounts = [f"--volume={env.spark_home}:/spark/{line}:ro" for line, env in sorted(lines.items())]
        podman(
            "build", "--pull=never", "--format", "docker", "--network", "host", "--jobs", "2", *mounts,
            "--tag", name, str(REPO),
            timeout=BUILD_TIMEOUT,
        )  # fmt: skip
    return Image(podman, name, lines)


def _debian(podman: Podman, scratch: Path) -> str:
    tag = f"localhost/shuffled-test/debian:{hashlib.sha256(' '.join(DEBIAN_RECIPE).encode()).hexdigest()[:12]}"
    if podman("image", "exists", tag, check=False).returncode != 0:
        tar = scratch / "debian.tar"
        made = subprocess.run(["mmdebstrap", *DEBIAN_RECIPE, str(tar)], capture_output=True, text=True, timeout=900)
        if made.returncode != 0:  # the tests' scaffolding, not the product: no Debian mirror is a skip, as no index is
            pytest.skip(f"cannot make the stand-in base image (mmdebstrap): {made.stderr.strip()[-500:]}")
        podman("import", str(tar), tag, timeout=600)
        tar.unlink()
    return tag


def _python_base(podman: Podman, debian: str, scratch: Path) -> None:
    context = scratch / "python-base"
    cas = context / "ca-certificates"
    if HOST_CAS.is_dir():
        shutil.copytree(HOST_CAS, cas)
    else:
        cas.mkdir(parents=True)
    shutil.copy(CONF / "python-base.Containerfile", context / "Containerfile")
    podman(
        "build", "--pull=never", "--format", "docker", "--network", "host", "--build-arg", f"DEBIAN={debian}",
        "--tag", PYTHON_BASE, str(context), timeout=600,
    )  # fmt: skip


def daemon_dir(path: Path) -> Path:
    """A host directory the container's daemon may write (its socket's, its data's)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, DAEMON_UID, DAEMON_UID)
    return path


@dataclass
class Container:
    """A daemon container of the image (`podman run -d`), reached by the tests at `addr` (``unix:/path`` on
    the host, or ``host:port``)."""

    podman: Podman
    name: str
    addr: str

    @classmethod
    def run(cls, image: Image, name: str, addr: str, options: list[str], flags: list[str] | None = None) -> Container:
        """Starts it with these podman ``options`` and ``shuffled serve`` ``flags``; returns once it answers."""
        image.podman("run", "--detach", "--name", name, "--label", run_label(), *options, image.name, *(flags or []))
        container = cls(image.podman, name, addr)
        container.wait_ready()
        return container

    def state(self, field: str) -> str:
        return self.podman("inspect", "--format", f"{{{{.State.{field}}}}}", self.name).stdout.strip()

    def logs(self) -> str:
        done = self.podman("logs", self.name, check=False)
        return done.stdout + done.stderr

    def answers(self) -> bool:
        try:
            with Client(self.addr, timeout=5) as client:
                client.stats()
            return True
        except (OSError, ShuffledError):
            return False

    def wait_ready(self, timeout: float = 60) -> None:
        """Until the daemon in it answers; else an error with the container's state and log."""

        def ready_or_gone() -> bool:
            return self.state("Running") != "true" or self.answers()

        try:
            poll_until(ready_or_gone, timeout, f"container {self.name} answers at {self.addr}")
        except AssertionError as exc:
            raise PodmanError(f"{exc} (state {self.state('Status')}); its log:\n{self.logs()[-4000:]}") from None
        if self.state("Running") != "true":
            raise PodmanError(f"container {self.name} exited ({self.state('ExitCode')}):\n{self.logs()}")

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM (the daemon drains), SIGKILL after ``timeout``; the exit code."""
        self.podman("stop", "--time", str(int(timeout)), self.name, timeout=timeout + 60)
        return int(self.state("ExitCode"))

    def kill(self) -> None:
        """SIGKILL: the daemon's memory, and the map output it held there, are gone."""
        self.podman("kill", self.name)
        self.podman("wait", self.name)

    def start(self) -> None:
        """The same container again (its mounts, so its data dir): a restart after a crash."""
        self.podman("start", self.name)
        self.wait_ready()

    def remove(self) -> None:
        self.podman("rm", "--force", "--time", "0", self.name, check=False)
