"""Command line: `shuffled serve`, `drain`, `health`, `demo`, `stats`, `config`, `metrics-reference`,
`spark-jar`, `spark-conf`."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from . import __version__
from . import config as settings
from .logs import event, setup_logging

log = logging.getLogger(__name__)

#: seconds between looks at a draining daemon (`shuffled drain --wait`)
DRAIN_POLL = 0.5
#: exit status of `shuffled drain --wait` when attempts were left on the drained daemon only
INCOMPLETE = 3


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shuffled",
        description=(
            "shuffled: a shuffle service for Apache Spark. One daemon per host takes map output "
            "pushed by executors, keeps it in a fixed off-heap pool, and serves reduce partitions; "
            "daemons share one TCP connection per host pair with credit-based flow control."
        ),
    )
    parser.add_argument("--version", action="version", version=f"shuffled {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the daemon in the foreground",
        description="Run the daemon until SIGTERM or SIGINT. Clients and peer daemons use the same TCP port.",
    )
    settings.add_flags(serve)

    demo = sub.add_parser(
        "demo",
        help="start two daemons, push and read data through them, print what happened",
        description="Starts two daemons on loopback (127.0.0.1 and 127.0.0.2), pushes map output into both, "
        "reads every reduce partition through the first one (so half the data crosses the daemon-to-daemon "
        "connection), checks every byte, and stops them.",
    )
    demo.add_argument("--maps", type=int, default=4, help="map tasks per daemon (default 4)")
    demo.add_argument("--partitions", type=int, default=8, help="reduce partitions (default 8)")
    demo.add_argument("--megabytes", type=int, default=64, help="total data to shuffle (default 64)")
    demo.add_argument(
        "--spark",
        action="store_true",
        help="then build the Spark plugin and run a PySpark job (groupBy, join, orderBy) through both daemons",
    )

    jar = sub.add_parser(
        "spark-jar",
        help="build the Spark plugin jar (javac against a Spark's jars) and print its path",
        description="Compiles client/jvm with javac --release 17 against the jars of the installed pyspark (or "
        "of --spark-home) with the version layer of its Spark line, and packages "
        "client/jvm/build/shuffled-spark-<line>_<scala>.jar; skipped when the jar is newer than every source.",
    )
    jar.add_argument("--force", action="store_true", help="rebuild even if the jar is up to date")

    conf = sub.add_parser(
        "spark-conf",
        help="build the plugin jar if needed and print the Spark settings that use shuffled",
        description="Prints spark-defaults.conf lines (or spark-submit --conf flags) that switch Spark's "
        "shuffle to shuffled, with the jar's absolute path.",
    )
    conf.add_argument(
        "--address",
        default="127.0.0.1:7337",
        metavar="ADDR",
        help="the executors' daemon: host:port or unix:/path (default 127.0.0.1:7337)",
    )
    conf.add_argument("--submit", action="store_true", help="print --conf flags for spark-submit/pyspark")
    for p in (jar, conf):
        p.add_argument(
            "--spark-home",
            type=Path,
            default=None,
            metavar="DIR",
            help="build for this Spark distribution (its jars/) instead of the installed pyspark",
        )

    stats = sub.add_parser("stats", help="print a running daemon's pool, store and stream counters as JSON")
    stats.add_argument("address", help="daemon address, host:port or unix:/path")

    drain = sub.add_parser(
        "drain",
        help="make a running daemon hand its data over to other daemons and exit",
        description="The daemon refuses new pushes (its /readyz fails), lets open pushes finish, copies every "
        "committed attempt with fewer copies on other daemons than its replica count to one of them, refuses new "
        "reads from its clients, lets open reads finish and exits; answered at once (stats `drain` shows the "
        "progress). With a peer secret configured, the daemon first proves it has the peer secret, then the "
        "request carries a proof made with it.",
    )
    drain.add_argument("address", help="daemon address, host:port or unix:/path")
    drain.add_argument(
        "--wait",
        action="store_true",
        help="print the progress and how the drain ended, and return when the daemon has stopped; exit status "
        f"{INCOMPLETE} when the hand-over left attempts that no other daemon holds",
    )
    drain.add_argument(
        "--timeout",
        type=int,
        default=None,
        metavar="S",
        help="how long pushes, copies and reads may take before the daemon exits anyway (default: its drain-timeout)",
    )
    drain.add_argument("--no-handoff", action="store_true", help="exit without copying data to other daemons")
    drain.add_argument(
        "--peer-secret-file",
        default=os.environ.get("SHUFFLED_PEER_SECRET_FILE"),
        metavar="PATH",
        help=f"the daemons' peer secret (default: $SHUFFLED_PEER_SECRET_FILE, else ${settings.PEER_SECRET_ENV})",
    )
    for p in (stats, drain):
        p.add_argument(
            "--secret-file",
            default=os.environ.get("SHUFFLED_SECRET_FILE"),
            metavar="PATH",
            help="the cluster secret, for a daemon that requires one (default: $SHUFFLED_SECRET_FILE)",
        )

    health = sub.add_parser(
        "health",
        help="exit 0 if the daemon these settings describe answers /healthz (a container's health check)",
        description="Reads the settings as `serve` does (flags, --config or $SHUFFLED_CONFIG, SHUFFLED_* variables) "
        "and asks /healthz on the metrics host and port they give (loopback when that is every address). The "
        "image's HEALTHCHECK runs it, so it follows a metrics port set in the container's environment.",
    )
    settings.add_flags(health)

    config = sub.add_parser("config", help="print the effective configuration or the settings reference")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    show = config_sub.add_parser(
        "show",
        help="print the configuration `serve` would run with (same flags, file and environment) as TOML",
        description="Prints every setting as TOML with where its value came from; the output is a valid --config file.",
    )
    settings.add_flags(show)
    config_sub.add_parser("reference", help="print the settings table (Markdown, as in docs/configuration.md)")
    sub.add_parser("metrics-reference", help="print the metrics table (Markdown, as in docs/operations.md)")
    return parser


def metrics_reference() -> str:
    """The metrics table of docs/operations.md, from the stats of a daemon built (not started) with a data dir."""
    import tempfile

    from .ops.metrics import render_markdown
    from .ops.stats import DaemonStats
    from .server.daemon import Daemon

    async def snapshot() -> DaemonStats:
        with tempfile.TemporaryDirectory(prefix="shuffled-metrics-") as data_dir:
            config = settings.DaemonConfig(port=0, metrics_port=-1, pool_size=4 << 20, data_dir=data_dir)
            daemon = Daemon(config)
            try:
                return daemon.stats()
            finally:
                daemon.storage.release()

    return render_markdown(asyncio.run(snapshot()))


def _load_config(args: argparse.Namespace, command: str) -> tuple[settings.DaemonConfig, dict[str, str]] | None:
    try:
        return settings.load(args)
    except settings.ConfigError as exc:
        print(f"shuffled {command}: invalid configuration: {exc}", file=sys.stderr)
        return None


async def _serve(config: settings.DaemonConfig) -> int:
    """Run until a signal or the admin `drain`; drain on the first, stop at once on a second signal.

    After `shuffled drain` the first signal lets the drain go on: Kubernetes sends SIGTERM once the
    preStop hook (which runs `shuffled drain --wait`) has returned or timed out.
    """
    from .server.daemon import Daemon

    daemon = Daemon(config)
    # Before the ready line: a signal that comes as soon as the daemon says it is ready stops it in order.
    signals: asyncio.Queue[str] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signals.put_nowait, sig.name)
    await daemon.start()
    # What exists now lives as long as the daemon: the cyclic collector need not scan it again. Per buffer
    # the hot path allocates small, acyclic objects (frames, tuples), which made young collections about
    # 3 % of a relaying daemon's time (py-spy); collecting them less often costs a little memory.
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    first = asyncio.create_task(signals.get())
    requested = asyncio.create_task(daemon.drain.started.wait())
    await asyncio.wait({first, requested}, return_when=asyncio.FIRST_COMPLETED)
    requested.cancel()
    if first.done():
        handoff = config.drain_handoff == "on"
        event(log, "stopping", signal=first.result(), drain_timeout_s=config.drain_timeout, handoff=handoff)
        drain = daemon.drain.start(config.drain_timeout, handoff)
        second = asyncio.create_task(signals.get())
    else:
        drain = daemon.drain.start(config.drain_timeout, True)  # the running one
        second = asyncio.create_task(_another(first, signals))
    await asyncio.wait({drain, second}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if not drain.done():
        drain.cancel()
        event(log, "stopping now", logging.WARNING, signal=second.result())
        code = 1
    else:
        try:
            drain.result()
        except Exception:  # a bug: logged, and the daemon still stops (its data dir keeps what it holds)
            event(log, "drain failed", logging.ERROR, exc_info=True)
            code = 1
    second.cancel()
    await daemon.stop()
    event(log, "stopped", exit_code=code)
    return code


async def _another(first: asyncio.Task[str], signals: asyncio.Queue[str]) -> str:
    """The signal after `first`."""
    await first
    return await signals.get()


def _peer_secret(path: str | None) -> bytes | None:
    from .protocol.auth import read_secret_file, secret_bytes

    if path:
        return read_secret_file(path)
    from_env = os.environ.get(settings.PEER_SECRET_ENV)
    return secret_bytes(from_env) if from_env is not None else None


async def _drain(args: argparse.Namespace) -> int:
    """Ask for the drain (with a proof when there is a peer secret); with --wait, follow it, print how it
    ended, and return once the daemon closed the connection and refuses new ones, or a daemon that is not
    draining answers on its address (a supervisor restarted it). Exit status: 0, or INCOMPLETE when the
    hand-over left attempts that no other daemon holds (a rolling restart should stop there)."""
    from shuffled_client import AsyncClient, ConnectionLost

    from .protocol.auth import read_secret_file

    secret = read_secret_file(args.secret_file) if args.secret_file else None
    peer_secret = _peer_secret(args.peer_secret_file)
    client = await AsyncClient.connect(args.address, secret=secret)
    try:
        handoff, timeout = not args.no_handoff, args.timeout
        node, proof = client.daemon_node, None
        if peer_secret is not None:
            node, proof = await _drain_proof(client, args.address, peer_secret, handoff, timeout)
        stats = await client.stats()
        if not args.wait:
            answer = await client.drain(handoff, timeout, proof)
            print(f"{node}: draining ({answer['state']})", flush=True)
            return 0
        result = await _follow(client, node, client.drain(handoff, timeout, proof, wait=True))
    finally:
        await client.close()
    while True:  # the connection is closed when the daemon stops; its listeners close right after
        try:
            async with await AsyncClient.connect(args.address, secret=secret, timeout=DRAIN_POLL * 10) as probe:
                now = await probe.stats()
        except ConnectionLost:
            break
        if not now["draining"] or (now["node"], now["start_time"]) != (stats["node"], stats["start_time"]):
            break  # another life of the daemon (a supervisor restarted it): the drained one has stopped
        await asyncio.sleep(DRAIN_POLL)
    print(f"{node}: stopped", flush=True)
    return _verdict(node, result)


async def _drain_proof(
    client: Any, address: str, peer_secret: bytes, handoff: bool, timeout: int | None
) -> tuple[str, str]:
    """The daemon's node and the proof for a drain with these arguments (PROTOCOL.md §13). The daemon
    proves the peer secret over a fresh nonce of ours first, and names the address it sees us at:
    whoever merely answers at `address` (with the cluster secret every application has), or relays to
    another daemon, gets no proof, so it has nothing to replay against a daemon it wants stopped."""
    from .protocol.auth import check_nonce, drain_challenge_proof, drain_proof, new_nonce, proof_matches
    from .protocol.errors import AuthFailed

    nonce = new_nonce()
    answer = await client.drain_challenge(nonce)
    theirs, node, seen, proof = (answer.get(k) for k in ("nonce", "node", "client", "proof"))
    if not all(isinstance(v, str) for v in (theirs, node, seen, proof)):
        raise AuthFailed(f"the daemon at {address} answered drain_challenge without a proof: not draining it")
    check_nonce(theirs, f"the daemon at {address}")
    if not proof_matches(drain_challenge_proof(peer_secret, nonce, theirs, node, seen), proof):
        raise AuthFailed(
            f"whoever answers at {address} could not prove it has the peer secret: not draining it (a wrong "
            "--peer-secret-file, or not a daemon of this cluster)"
        )
    if seen != client.local_address:
        raise AuthFailed(
            f"{node} sees this command connect from {seen}, but it connected from {client.local_address}: "
            f"whoever answers at {address} relays to it (or NAT does); not draining. Drain a daemon over an "
            "address it sees you at, such as its Unix socket"
        )
    return node, drain_proof(peer_secret, nonce, theirs, handoff, timeout)


async def _follow(client: Any, node: str, ending: asyncio.Future[dict[str, Any]]) -> dict[str, Any] | None:
    """Print the drain's progress as it changes until the daemon answers the drain asked for with `wait`
    (`ending`) with how it ended (before it closes the connection); None if the daemon stopped first."""
    from shuffled_client import ConnectionLost, ShuffledError, ShuttingDown

    shown: dict[str, Any] | None = None
    while True:
        try:
            progress = (await client.stats())["drain"]  # answered after the drain request: it is under way
        except ShuffledError:  # stopping: the answer is on its way, or the connection is gone
            break
        if ending.done() and ending.exception() is not None:  # refused
            break
        if shown is None:
            print(f"{node}: draining ({progress['state']})", flush=True)
        elif progress != shown:
            print(_progress(progress), flush=True)
        shown = progress
        if ending.done():
            break
        await asyncio.wait({ending}, timeout=DRAIN_POLL)
    try:
        result: dict[str, Any] = await ending
    except (ConnectionLost, ShuttingDown):
        return None
    print(_progress(result), flush=True)
    return result


def _progress(drain: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(drain.items()))


def _verdict(node: str, result: dict[str, Any] | None) -> int:
    """The exit status of `drain --wait`, and what it means on stderr."""
    if result is None:
        print(f"shuffled drain: {node} stopped before it said how its drain ended", file=sys.stderr)
        return INCOMPLETE
    if result.get("failed"):
        print(
            f"shuffled drain: hand-over incomplete: {result['failed']} copies of attempts no other daemon holds "
            f"could not be made; they are lost with {node} unless it comes back on its data dir",
            file=sys.stderr,
        )
        return INCOMPLETE
    if result.get("short"):
        print(
            f"shuffled drain: {result['short']} copies could not be placed (fewer daemons took them than the "
            "replica count wants); every attempt has a copy on another daemon",
            file=sys.stderr,
        )
    return 0


#: bound of the health check's request: below the image's HEALTHCHECK --timeout
HEALTH_TIMEOUT = 2.0


def _health(args: argparse.Namespace) -> int:
    """Only the endpoint's settings matter here: the rest (an advertise given as a flag to `serve`, which
    this process does not see) is not checked, or a running daemon would be reported unhealthy."""
    import urllib.error
    import urllib.request

    try:
        config, _ = settings.load(args, validate=False)
    except settings.ConfigError as exc:
        print(f"shuffled health: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if config.metrics_port <= 0:
        print(f"shuffled health: no fixed metrics port (metrics-port {config.metrics_port})", file=sys.stderr)
        return 2
    host = config.metrics_host or config.host
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    url = f"http://{f'[{host}]' if ':' in host else host}:{config.metrics_port}/healthz"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the daemon is never behind a proxy
    try:
        with opener.open(url, timeout=HEALTH_TIMEOUT) as answer:
            print(f"{url}: {answer.status} {answer.read().decode().strip()}")
            return 0
    except urllib.error.HTTPError as exc:
        print(f"{url}: {exc.code} {exc.read().decode().strip()}", file=sys.stderr)
    except OSError as exc:
        print(f"{url}: {exc}", file=sys.stderr)
    return 1


def _spark_command(args: argparse.Namespace) -> int:
    from . import spark_jar

    try:
        jar = spark_jar.build_jar(force=getattr(args, "force", False), spark_home=args.spark_home)
    except spark_jar.JvmBuildError as exc:
        print(f"shuffled {args.command}: {exc}", file=sys.stderr)
        return 1
    if args.command == "spark-jar":
        print(jar)
        return 0
    for key, value in spark_jar.spark_conf(jar, [args.address]).items():
        print(f"--conf {key}={value}" if args.submit else f"{key} {value}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "serve":
        loaded = _load_config(args, "serve")
        if loaded is None:
            return 2
        config = loaded[0]
        setup_logging(config.log_level, config.log_format)
        for name in settings.unknown_env():
            event(log, "unknown environment variable ignored", logging.WARNING, name=name)
        import uvloop

        try:
            return uvloop.run(_serve(config))
        except OSError as exc:
            print(f"shuffled serve: cannot start: {exc}", file=sys.stderr)
            return 1
        except settings.ConfigError as exc:
            print(f"shuffled serve: invalid configuration: {exc}", file=sys.stderr)
            return 2
    if args.command == "config":
        if args.config_command == "reference":
            print(settings.render_markdown(), end="")
            return 0
        loaded = _load_config(args, "config show")
        if loaded is None:
            return 2
        print(settings.render_toml(*loaded), end="")
        return 0
    if args.command == "health":
        return _health(args)
    if args.command == "metrics-reference":
        print(metrics_reference(), end="")
        return 0
    if args.command == "demo":
        from .demo import run_demo

        return run_demo(args.maps, args.partitions, args.megabytes, spark=args.spark)
    if args.command in ("spark-jar", "spark-conf"):
        return _spark_command(args)
    if args.command == "drain":
        from .protocol.errors import ShuffledError

        try:
            return asyncio.run(_drain(args))
        except (OSError, ValueError, ShuffledError) as exc:
            print(f"shuffled drain: {exc}", file=sys.stderr)
            return 1
    if args.command == "stats":
        from shuffled_client import Client

        from .protocol.auth import read_secret_file
        from .protocol.errors import ShuffledError

        try:
            secret = read_secret_file(args.secret_file) if args.secret_file else None
            with Client(args.address, secret=secret) as client:
                result: dict[str, Any] = client.stats()
        except (OSError, ValueError, ShuffledError) as exc:
            print(f"shuffled stats: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(result, indent=2, sort_keys=True))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
