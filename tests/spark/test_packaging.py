"""The package as users get it: a wheel built from this tree (`pip wheel .`) and installed into a fresh
virtual environment, run from outside the source tree. It carries the version of shuffled/__init__.py, the
license files, the type-hint markers (py.typed) and the plugin's Java sources, so
`shuffled demo --spark` builds the jar for the installed pyspark (into the user's cache, since
site-packages may not be writable) and runs a PySpark job through two daemons; also with Spark 3.5.
The first wheel is built with the hot path compiled (SHUFFLED_COMPILE=1, setup.py), the second (with Spark
3.5, in the `full` matrix) pure Python, so both forms run a real job; the rest of the suite runs the
pure-Python tree."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from shuffled import __version__
from tests.jvm import needs_jdk
from tests.spark_support import needs_spark
from tests.wheel import build_wheel

pytestmark = [needs_spark, needs_jdk, pytest.mark.timeout(600)]


def _venv_seeing_these_packages(venv: Path) -> Path:
    """A new virtual environment whose Python finds the packages of the one running the tests after its own.

    The dependencies (and pyspark) come from there, shuffled from the wheel. `venv --system-site-packages` is not
    that when the tests run in a virtual environment themselves: it shows the base interpreter's site-packages,
    not this environment's. So the new one gets a path file naming this interpreter's site directories; its own
    site-packages stay first on sys.path, so the wheel's shuffled, and a pyspark installed into it, win. Path lines
    only: the path files in those directories (such as the editable install of this tree) do not run."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    user = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
    ours = [d for d in [*site.getsitepackages(), *user] if d in sys.path]
    assert ours, f"no site directory of {sys.executable} on sys.path: {sys.path}"
    (Path(purelib) / "outer-site-packages.pth").write_text("".join(f"{d}\n" for d in ours))
    return python


@pytest.mark.parametrize(
    ("pyspark", "compiled"),
    # Spark 3.5 (a pyspark to install: a minute) is another line, so it is part of the `full` matrix
    [("installed", True), pytest.param("pyspark>=3.5,<3.6", False, marks=pytest.mark.full)],
)
def test_a_wheel_installed_elsewhere_runs_the_spark_demo(tmp_path: Path, pyspark: str, compiled: bool) -> None:
    """With the pyspark the test suite runs on (the newest line), and with Spark 3.5 installed beside it."""
    wheel = build_wheel(tmp_path, compiled)
    assert wheel.name.startswith(f"shuffled-{__version__}-"), wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert "shuffled/jvm/main/java/io/shuffled/spark/ShuffledShuffleManager.java" in names
    assert any(n.startswith("shuffled/jvm/compat/checksums-rows/") for n in names)
    assert {"shuffled/py.typed", "shuffled_client/py.typed"} <= set(names)
    for license_file in ("LICENSE", "NOTICE"):
        assert f"shuffled-{__version__}.dist-info/licenses/{license_file}" in names
    # Away from the source tree: on a PYTHONPATH naming it, pip would take an egg-info an editable install left
    # there for shuffled already installed, at the wheel's version, and skip the wheel.
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("PYTHONPATH", None)
    venv = tmp_path / "venv"
    python = _venv_seeing_these_packages(venv)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--no-deps", str(wheel)], env=env, check=True, timeout=300)
    if pyspark != "installed":
        install = subprocess.run([*pip, pyspark], env=env, capture_output=True, text=True, timeout=900)
        if install.returncode != 0:
            pytest.skip(f"cannot install {pyspark}: {install.stderr.strip()[-500:]}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def probe(expression: str) -> str:
        code = f"import shuffled, pyspark; print({expression})"
        run = subprocess.run(
            [str(python), "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    assert probe("shuffled.__file__").startswith(str(venv))
    for module in ("shuffled.protocol.connection", "shuffled.protocol.credit", "shuffled.net.sender"):
        path = probe(f"__import__('importlib').import_module('{module}').__file__")
        assert path.endswith(".so" if compiled else ".py"), path
    demo = subprocess.run(
        [str(venv / "bin" / "shuffled"), "demo", "--spark", "--megabytes", "8"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=480,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "spark demo ok" in demo.stdout, demo.stdout[-3000:]
    version = probe("pyspark.__version__")
    line = ".".join(version.split(".")[:2])
    assert pyspark == "installed" or line == "3.5", version
    assert list((tmp_path / "cache" / "shuffled" / "jars").glob(f"shuffled-spark-{line}_*.jar")), "no jar built"
