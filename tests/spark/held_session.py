"""A Spark test session that holds its job mid-run until it is killed: what tests/spark/test_no_orphans.py runs
(``python -m pytest tests/spark/held_session.py``) and kills with SIGKILL. The suite does not collect it (its
name is not ``test_*.py``).

Two simulated hosts (tests/hosts.py) with a daemon and a standalone worker each, and a session through the
plugin whose tasks block opening a FIFO nobody writes: at that moment the session has everything a Spark test
can have running at once (daemons, a master, workers, executors and their Python workers, namespaces, links),
which its reaper must remove when it is killed. It says so on its standard output (``holding``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import spark_standalone
from tests.hosts import Hosts, netns_unavailable
from tests.spark_support import needs_spark

pytestmark = [needs_spark, pytest.mark.skipif(netns_unavailable() is not None, reason=str(netns_unavailable()))]


def _hold(fifo: str) -> str:
    with open(fifo) as blocked:  # blocks until a writer opens it: none ever does
        return blocked.read()


def test_a_session_holds_its_job(plugin_jar: Path, tmp_path: Path) -> None:
    fifo = str(tmp_path / "hold")
    os.mkfifo(fifo)
    with Hosts(2) as hosts:
        daemons = [hosts.start_daemon(host) for host in hosts.hosts]
        with hosts.spark_cluster() as master:
            spark = spark_standalone.session(master, hosts.spark_conf(plugin_jar, admin=daemons[0].addr))
            print("holding", flush=True)
            spark.sparkContext.parallelize(range(2), 2).map(lambda _: _hold(fifo)).collect()
    pytest.fail("the job ended: nothing should have opened the FIFO for writing")
