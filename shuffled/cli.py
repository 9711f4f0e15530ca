"""Command line: `shuffled serve`, `shuffled demo`, `shuffled stats`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import signal
import sys
from typing import Any

from .server.daemon import Daemon, DaemonConfig

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'256M', '32KiB', '1g', '4096' → bytes (binary units)."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 4096, 32K, 256M or 2G")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m.group(2).lower()]


class _KeyValueFormatter(logging.Formatter):
    """One line per event: time, level, logger, then the message's own key=value pairs."""

    def format(self, record: logging.LogRecord) -> str:
        ts = self.formatTime(record, "%Y-%m-%dT%H:%M:%S")
        line = f"ts={ts} level={record.levelname.lower()} logger={record.name} msg={record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shuffled",
        description=(
            "shuffled: a shuffle service for Apache Spark. One daemon per host takes map output "
            "pushed by executors, keeps it in a fixed off-heap pool, and serves reduce partitions; "
            "daemons share one TCP connection per host pair with credit-based flow control."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the daemon in the foreground",
        description="Run the daemon until SIGTERM or SIGINT. Clients and peer daemons use the same TCP port.",
    )
    d = DaemonConfig()
    serve.add_argument("--host", default=d.host, help=f"address to listen on for clients and peers (default {d.host})")
    serve.add_argument("--port", type=int, default=d.port, help=f"TCP port; 0 picks a free one (default {d.port})")
    serve.add_argument("--unix-socket", metavar="PATH", help="also accept local clients on this Unix socket")
    serve.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        help="address other daemons and readers use for this daemon (default: HOST:PORT as bound)",
    )
    serve.add_argument(
        "--pool-size",
        type=parse_size,
        default=d.pool_size,
        metavar="SIZE",
        help="off-heap memory reserved at start, e.g. 256M or 4G; never grows (default 256M)",
    )
    serve.add_argument(
        "--segment-size",
        type=parse_size,
        default=d.segment_size,
        metavar="SIZE",
        help="size of one buffer and the largest data frame payload (default 32K)",
    )
    serve.add_argument(
        "--data-dir",
        metavar="DIR",
        help="directory for spill files and their journals (created if missing); without it nothing is "
        "spilled or kept across restarts",
    )
    serve.add_argument(
        "--spill-high",
        type=float,
        default=d.spill_high,
        metavar="SHARE",
        help=f"share of pool segments in use at which data spills to --data-dir (default {d.spill_high})",
    )
    serve.add_argument(
        "--spill-low",
        type=float,
        default=d.spill_low,
        metavar="SHARE",
        help=f"share of pool segments in use at which spilling stops and pushes resume (default {d.spill_low})",
    )
    serve.add_argument(
        "--app-memory-quota",
        type=parse_size,
        default=d.app_memory_quota,
        metavar="SIZE",
        help="pool memory one application's data may hold; beyond it the data spills, or pushes are refused "
        "without --data-dir (default 0: no cap)",
    )
    serve.add_argument(
        "--app-disk-quota",
        type=parse_size,
        default=d.app_disk_quota,
        metavar="SIZE",
        help="spill file bytes one application may hold; beyond it pushes are refused (default 0: no cap)",
    )
    serve.add_argument(
        "--app-ttl",
        type=float,
        default=d.app_ttl,
        metavar="SECONDS",
        help=f"drop an application's data after this long without pushes, commits or reads (default "
        f"{d.app_ttl:.0f}; 0: never)",
    )
    serve.add_argument(
        "--flush-after",
        type=float,
        default=d.flush_after,
        metavar="SECONDS",
        help="write a shuffle's committed data to disk once it had no commit for this long "
        "(default 0: only under memory pressure)",
    )
    serve.add_argument(
        "--peers",
        default="",
        metavar="HOST:PORT,...",
        help="other daemons of the cluster, told when a shuffle or application is removed",
    )
    serve.add_argument(
        "--exclusive-buffers",
        type=int,
        default=d.exclusive,
        metavar="N",
        help=f"buffers per remote channel of a read, its initial credit (default {d.exclusive}, as in Flink)",
    )
    serve.add_argument(
        "--floating-buffers",
        type=int,
        default=d.floating,
        metavar="N",
        help=f"buffers per read shared by its channels, taken as backlog grows (default {d.floating}, as in Flink)",
    )
    serve.add_argument(
        "--push-window",
        type=int,
        default=d.push_max,
        metavar="N",
        help=f"most push credit (buffers) one map output may hold when memory allows (default {d.push_max})",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])

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

    stats = sub.add_parser("stats", help="print a running daemon's pool, store and stream counters as JSON")
    stats.add_argument("address", help="daemon address, host:port or unix:/path")
    return parser


def _config_from(args: argparse.Namespace) -> DaemonConfig:
    return DaemonConfig(
        host=args.host,
        port=args.port,
        unix_socket=args.unix_socket,
        advertise=args.advertise,
        pool_size=args.pool_size,
        segment_size=args.segment_size,
        data_dir=args.data_dir,
        peers=[p.strip() for p in args.peers.split(",") if p.strip()],
        exclusive=args.exclusive_buffers,
        floating=args.floating_buffers,
        push_max=args.push_window,
        spill_high=args.spill_high,
        spill_low=args.spill_low,
        app_memory_quota=args.app_memory_quota,
        app_disk_quota=args.app_disk_quota,
        app_ttl=args.app_ttl,
        flush_after=args.flush_after,
    )


async def _serve(config: DaemonConfig) -> None:
    daemon = Daemon(config)
    await daemon.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logging.getLogger("shuffled.daemon").info("stopping reason=signal")
    await daemon.stop()


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "serve":
        setup_logging(args.log_level)
        try:
            config = _config_from(args)
            config.validate()
        except ValueError as exc:
            print(f"shuffled serve: invalid configuration: {exc}", file=sys.stderr)
            return 2
        import uvloop

        try:
            uvloop.run(_serve(config))
        except OSError as exc:
            print(f"shuffled serve: cannot start: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "demo":
        from .demo import run_demo

        return run_demo(args.maps, args.partitions, args.megabytes)
    if args.command == "stats":
        from shuffled_client import Client

        with Client(args.address) as client:
            result: dict[str, Any] = client.stats()
        print(json.dumps(result, indent=2, sort_keys=True))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
