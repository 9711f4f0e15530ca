"""The daemon's settings: one table, read from a TOML file, then `SHUFFLED_…` variables, then flags.

Every setting is one field of `DaemonConfig` with `setting(...)` metadata (help,
unit, parser). The TOML key (`pool_size`), the environment variable
(`SHUFFLED_POOL_SIZE`), the command-line flag (`--pool-size`), `shuffled config
show` and the reference table in docs/configuration.md are all derived from that field, so a new
setting is one field and cannot be half documented. Values are refused at start
with a message naming the setting and where its value came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .protocol.credit import DEFAULT_EXCLUSIVE, DEFAULT_FLOATING
from .protocol.frames import MAX_CONTROL_BODY, MAX_REPLICAS, MAX_STREAMS_PER_CONNECTION, U32

#: a CommitAck body is a u32 count and a u64 per partition, within the control body limit
MAX_COMMIT_PARTITIONS = (MAX_CONTROL_BODY - U32.size) // 8

MiB = 1 << 20
ENV_PREFIX = "SHUFFLED_"
#: the file to read when no --config flag is given
CONFIG_ENV = ENV_PREFIX + "CONFIG"
#: the cluster secret itself, for deployments that hand secrets over in the environment; it is never a
#: setting, so `config show` and logs cannot print it (secret-file is the alternative)
SECRET_ENV = ENV_PREFIX + "SECRET"
PEER_SECRET_ENV = ENV_PREFIX + "PEER_SECRET"

#: data-dir values that name no directory: derive one from the address, or keep everything in memory
DATA_DIR_AUTO = "auto"
DATA_DIR_NONE = "none"
#: where `data-dir = auto` puts a daemon run as root (systemd's StateDirectory=shuffled is the same place)
SYSTEM_STATE_ROOT = "/var/lib/shuffled"

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}


class ConfigError(ValueError):
    """A setting with a value the daemon refuses; the message names the setting."""


def parse_size(text: str) -> int:
    """'256M', '32KiB', '1g', '4096' → bytes (binary units)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size such as 4096, 32K, 256M or 2G")
    return int(m.group(1)) << _UNITS[m.group(2).lower()]


def format_size(n: int) -> str:
    for suffix, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{suffix}"
    return str(n)


def _parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None


def _parse_float(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    return value


def _parse_list(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


@dataclass(frozen=True)
class Setting:
    """What the outside world knows about one field of DaemonConfig."""

    help: str
    unit: str
    parse: Callable[[str], Any]
    #: shown instead of the raw default in docs (e.g. "HOST:PORT as bound")
    default_text: str | None
    choices: tuple[str, ...]
    metavar: str | None

    def convert(self, value: Any) -> Any:
        """A value from TOML (native type or string) or from text (env, flag) → the field's value."""
        if isinstance(value, bool):
            raise ValueError(f"{value!r} is not allowed here")
        if self.parse is _parse_list and isinstance(value, list):
            if not all(isinstance(v, str) for v in value):
                raise ValueError("expected a list of strings")
            return [v.strip() for v in value if v.strip()]
        if isinstance(value, int | float) and self.parse in (parse_size, _parse_int, _parse_float, _parse_mode):
            if self.parse is not _parse_float and not isinstance(value, int):
                raise ValueError(f"{value!r} is not a whole number")
            return float(value) if self.parse is _parse_float else value
        if not isinstance(value, str):
            raise ValueError(f"{value!r} has the wrong type")
        result = self.parse(value)
        if self.choices and result not in self.choices:
            raise ValueError(f"{value!r} is not one of {', '.join(self.choices)}")
        return result


def setting(
    default: Any,
    help: str,
    *,
    unit: str = "",
    parse: Callable[[str], Any] | None = None,
    default_text: str | None = None,
    choices: tuple[str, ...] = (),
    metavar: str | None = None,
) -> Any:
    """A DaemonConfig field that is also a documented, overridable setting."""
    parsers: dict[type, Callable[[str], Any]] = {int: _parse_int, float: _parse_float}
    meta = {"setting": Setting(help, unit, parse or parsers.get(type(default), str), default_text, choices, metavar)}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def _optional(text: str) -> str | None:
    return text or None


def _optional_none(text: str) -> str | None:
    return None if text.strip().lower() in ("", "none") else text


def _parse_data_dir(text: str) -> str:
    text = text.strip()
    return text if text and text.lower() not in (DATA_DIR_AUTO, DATA_DIR_NONE) else (text.lower() or DATA_DIR_NONE)


#: S3's smallest part of a multipart upload (the last aside) and its largest
S3_MIN_PART = 5 * MiB
S3_MAX_PART = 5 << 30
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` → ("bucket", "some/prefix"); the prefix may be empty."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"{url!r} is not an s3://BUCKET/PREFIX URL")
    if not _S3_BUCKET.match(parts.netloc):
        raise ValueError(f"{parts.netloc!r} is not an S3 bucket name (3-63 of a-z, 0-9, '.', '-')")
    prefix = parts.path.strip("/")
    if prefix and any(seg in ("", ".", "..") for seg in prefix.split("/")):
        raise ValueError(f"{url!r}: the prefix has an empty, '.' or '..' segment")
    return parts.netloc, prefix


def _parse_s3_url(text: str) -> str | None:
    url = _optional_none(text.strip())
    if url is not None:
        parse_s3_url(url)
    return url


def _parse_mode(text: str) -> int:
    try:
        mode = int(text.strip(), 8)
    except ValueError:
        raise ValueError(f"{text!r} is not an octal file mode such as 0660") from None
    if not 0 <= mode <= 0o777:
        raise ValueError(f"{text!r} is not a file mode (0000..0777)")
    return mode


@dataclass
class DaemonConfig:
    host: str = setting("127.0.0.1", "address to listen on, for local clients and peer daemons (one TCP port)")
    port: int = setting(7337, "TCP port for clients and peers; 0 picks a free one (the `ready` log line says which)")
    unix_socket: str | None = setting(
        None, "also accept local clients on this Unix socket", parse=_optional, default_text="off", metavar="PATH"
    )
    unix_socket_mode: int = setting(
        0o660,
        "permissions of the Unix socket (octal); clients need write permission to connect",
        parse=_parse_mode,
        metavar="MODE",
    )
    shm_dir: str | None = setting(
        "/dev/shm",
        "where clients of the Unix socket get their regions of shared memory to push and read through: a tmpfs at "
        "least the pool's size (else they push through the socket), at the same path for the daemon and its clients "
        "(the pod's emptyDir of medium Memory); its files are for the users the socket is for. `none`: off",
        parse=_optional_none,
        metavar="DIR",
    )
    shm_read_slots: int = setting(
        512,
        "slots of a local client's region the daemon may put served buffers in for it to read in place (each one "
        "segment of tmpfs while the client holds it; free ones keep theirs for the next reads, 128 of them once the "
        "client has held none and been lent none for 5 s); past them, or with 0, reads come through the socket",
        metavar="N",
    )
    advertise: str | None = setting(
        None,
        "the name other daemons and readers use for this daemon; must be the same string everywhere",
        parse=_optional,
        default_text="HOST:PORT as bound",
        metavar="HOST:PORT",
    )
    pool_size: int = setting(
        256 * MiB,
        "off-heap memory reserved at start (`4096`, `32K`, `256M`, `4G`); never grows",
        unit="bytes",
        parse=parse_size,
        metavar="SIZE",
    )
    segment_size: int = setting(
        32 << 10,
        "one buffer, and the largest data frame payload; every daemon of a cluster needs the same value",
        unit="bytes",
        parse=parse_size,
        metavar="SIZE",
    )
    data_dir: str = setting(
        DATA_DIR_AUTO,
        "directory for spill files and their journals (created if missing): the pool is a cache in front of it, "
        "so a full pool spills instead of stopping pushes, and committed data survives a restart. `auto`: "
        f"`{SYSTEM_STATE_ROOT}/HOST-PORT` as root, else `$XDG_STATE_HOME/shuffled/HOST-PORT` "
        "(`~/.local/state/...`); `none`: no files: with an `object-store` spills go to objects, without one memory "
        "only, and a push that finds the pool full of stored data fails at once with STORAGE_ERROR",
        parse=_parse_data_dir,
        metavar="DIR|auto|none",
    )
    spill_high: float = setting(
        0.85,
        "share of pool segments in use above which pushes get no new memory until enough is being spilled "
        "(spilling starts half way from spill-low)",
        unit="ratio",
    )
    spill_low: float = setting(
        0.70,
        "share of pool segments in use that spilling brings usage down to (counting the writes under way)",
        unit="ratio",
    )
    push_share_per_connection: float = setting(
        0.25,
        "share of the pool's push memory one connection's open map outputs may hold: a map output whose "
        "guaranteed window (2 buffers) would not fit is refused with LIMIT_EXCEEDED, and windows grow beyond "
        "their guarantee only while the connection holds less",
        unit="ratio",
    )
    push_share_per_application: float = setting(
        0.25,
        "the same for one application's map outputs over all its connections, so a tenant cannot take every "
        "push window by opening more connections",
        unit="ratio",
    )
    app_memory_quota: int = setting(
        0,
        "pool memory one application's data may hold; beyond it the data spills, or pushes are refused without a "
        "data directory (0: no cap)",
        unit="bytes",
        parse=parse_size,
        metavar="SIZE",
    )
    app_disk_quota: int = setting(
        0,
        "spill file bytes one application may hold; beyond it pushes are refused with QUOTA_EXCEEDED (0: no cap)",
        unit="bytes",
        parse=parse_size,
        metavar="SIZE",
    )
    app_ttl: float = setting(
        24 * 3600.0,
        "an application without pushes, commits or reads for this long is dropped, memory and files (0: never)",
        unit="s",
    )
    flush_after: float = setting(
        0.0,
        "a shuffle without a commit for this long has its committed data written to disk (0: only under memory "
        "pressure)",
        unit="s",
    )
    object_store: str | None = setting(
        None,
        "an S3-compatible bucket and prefix for data below memory and disk (`s3://BUCKET/PREFIX`); credentials "
        "come the usual AWS ways (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or AWS_PROFILE in the shared "
        "credentials and config files). At start the daemon writes, reads back and deletes a small object "
        "there, and is not ready (/readyz says why) until that worked",
        parse=_parse_s3_url,
        default_text="off",
        metavar="s3://BUCKET/PREFIX",
    )
    object_store_endpoint: str | None = setting(
        None,
        "the S3 API's URL for a store other than AWS (`http://127.0.0.1:8333`, `https://minio.example:9000`)",
        parse=_optional,
        default_text="AWS's, for the region",
        metavar="URL",
    )
    object_store_region: str | None = setting(
        None,
        "the bucket's region, which requests are signed for",
        parse=_optional,
        default_text="AWS_REGION, else us-east-1",
        metavar="REGION",
    )
    object_store_path_style: str = setting(
        "off",
        "address the bucket in the path (`ENDPOINT/BUCKET/KEY`, as most stores other than AWS want) instead "
        "of the host name (`BUCKET.ENDPOINT/KEY`)",
        choices=("off", "on"),
    )
    object_store_timeout: float = setting(
        30.0,
        "most time one request to the object store may take, connecting, sending and answering (a part of an "
        "upload is one request); one that takes longer fails and is retried",
        unit="s",
    )
    object_store_connect_timeout: float = setting(5.0, "most time connecting to the object store may take", unit="s")
    object_store_retries: int = setting(
        3,
        "times a request that failed in a way worth retrying (a 5xx answer, a refused, dropped or timed-out "
        "connection) is tried again, with exponential back-off",
        unit="retries",
        metavar="N",
    )
    object_store_part_size: int = setting(
        16 * MiB,
        "size of each part of a multipart upload (S3 allows 5 MiB to 5 GiB); larger objects go up in parts, "
        "so 16 MiB means 64 PUT requests per GiB",
        unit="bytes",
        parse=parse_size,
        metavar="SIZE",
    )
    object_store_durable_delay: float = setting(
        1.0,
        "a shuffle's committed map outputs that are to be made durable are uploaded once their pieces not yet "
        "in the object store fill a part, or this long after the shuffle's last commit (the end of a map stage)",
        unit="s",
    )
    object_store_sweep: float = setting(
        3600.0,
        "how often the daemon lists the object store's prefix and deletes the objects of applications no "
        "reachable daemon holds that are older than app-ttl (what crashed daemons left; 0: never)",
        unit="s",
    )
    object_store_lease: float = setting(
        600.0,
        "a daemon with an object store renews a lease object there every quarter of this; another daemon's sweep "
        "takes a daemon that does not answer for gone (and deletes the objects it wrote of applications nobody "
        "holds) only once neither its lease nor any of its objects is newer than this. The same on every daemon",
        unit="s",
    )
    fsync: str = setting(
        "none",
        "what the data dir's writes survive (docs/durability.md): `commit`: a CommitAck, a flush's answer and a "
        "drain wait until the map output, its journal records and their directories are fsynced (commits share "
        "fsyncs), which survives a power loss; `background`: what was written is fsynced within fsync-interval; "
        "`none`: never, which survives a daemon's crash, not the machine's",
        choices=("none", "background", "commit"),
    )
    at_rest_key_file: str | None = setting(
        None,
        "file of keys (one a line, each at least 32 bytes of secret; the first seals, all open) that seal every "
        "piece written to spill files and objects with AES-256-GCM, a key per application derived from it "
        "(docs/security.md: rotation)",
        parse=_optional,
        default_text="off",
        metavar="PATH",
    )
    fsync_interval: float = setting(1.0, "with fsync background: the longest a write waits for its fsync", unit="s")
    durability: str = setting(
        "none",
        "`object-store`: every committed map output is uploaded to the object store in the background, so any "
        "daemon can serve it once its host is lost (a Spark application may ask for it alone with "
        "spark.shuffled.durability); `none`: only applications that ask",
        choices=("none", "object-store"),
    )
    disk_quota: int = setting(
        0,
        "spill file bytes this daemon keeps on its data dir; with an object store, beyond it the oldest spilled "
        "pieces move to the object store (and an application over app-disk-quota has its pieces moved instead "
        "of its pushes refused) (0: no cap)",
        unit="bytes",
        parse=parse_size,
        metavar="SIZE",
    )
    heal_interval: float = setting(
        10.0,
        "how often the daemon checks that the replicated map outputs it holds still have their copies, and "
        "copies those that lost one (a daemon gone, a drain that could not place a copy) to other daemons "
        "(0: never)",
        unit="s",
    )
    heal_bandwidth: int = setting(
        64 * MiB,
        "most bytes a second healing copies send",
        unit="bytes",
        parse=parse_size,
        metavar="SIZE",
    )
    peers: list[str] = setting(
        [],
        "the other daemons (`HOST:PORT,...`), told when a shuffle or an application is removed; replicas are "
        "placed on them. An entry may name its failure domain (`HOST:PORT@ZONE`): replicas go to another zone first",
        parse=_parse_list,
        default_text="none",
        metavar="LIST",
    )
    peers_dns: str | None = setting(
        None,
        "a DNS name whose A/AAAA records are the daemons (`NAME:PORT`, e.g. a Kubernetes headless Service): "
        "resolved at start and every second, each address joins `peers` as `IP:PORT` (this daemon's "
        "advertise must be the address the name gives for it)",
        parse=_optional,
        default_text="off",
        metavar="NAME:PORT",
    )
    zone: str = setting(
        "",
        "this daemon's failure domain (rack, zone); replicas of its data go to daemons in other zones first "
        "(empty: the zone its own `peers` entry names, if any). Other daemons learn zones only from their "
        "`peers`: give every daemon's zone in its `peers` entry, the same list everywhere (a warning at "
        "start says when this daemon's entry does not match)",
        metavar="ZONE",
    )
    replicas: int = setting(
        1,
        "copies of each committed map output, this daemon's included, kept on distinct daemons (1: no "
        "replication); a Spark application may ask for another count with spark.shuffled.replicas",
        unit="copies",
        metavar="N",
    )
    replica_shortfall: str = setting(
        "degrade",
        "what a push does when fewer daemons than its replica count can take a copy when it opens: `degrade` "
        "(keep fewer copies, counted in stats and /metrics) or `fail` (refuse the push with PEER_UNAVAILABLE)",
        choices=("degrade", "fail"),
    )
    replica_lag: int = setting(
        16,
        "most buffers of one push a replica may be behind before the pusher gets no more credit (a slow "
        "replica slows its pushers instead of growing memory)",
        unit="buffers",
        metavar="N",
    )
    replica_search: int = setting(
        3,
        "how many of an attempt's placement candidates a replica push, a read failover and a drain try",
        unit="daemons",
        metavar="N",
    )
    failover_timeout: float = setting(
        20.0,
        "most time a relayed read spends finding another copy after the daemon holding its data failed",
        unit="s",
    )
    exclusive_buffers: int = setting(
        DEFAULT_EXCLUSIVE,
        "buffers per remote channel of a read: its initial credit (Flink's default)",
        unit="buffers",
        metavar="N",
    )
    floating_buffers: int = setting(
        DEFAULT_FLOATING,
        "most buffers a read shares among its channels, taken as the senders' backlog grows and only while "
        "memory is to spare (nothing waits for memory or is being spilled, and pool use is below where "
        "spilling starts, half way from spill-low to spill-high; without a data dir, more than twice the read "
        "reserve free)",
        unit="buffers",
        metavar="N",
    )
    relay_check: str = setting(
        "none",
        "what a daemon checks of each buffer it relays from another daemon: `none` (the reader checks the "
        "writer's CRC32C end to end, so a corrupt buffer still fails its read with CORRUPT_DATA) or `crc` "
        "(checked here too, which names the link it broke on; about 0.05 CPU s per GiB relayed)",
        choices=("none", "crc"),
    )
    #: push credit window per map output: guaranteed / at most
    push_min: int = 2
    push_window: int = setting(
        16,
        "most push credit one map output holds when memory allows (at least 2 are guaranteed)",
        unit="buffers",
        metavar="N",
    )
    read_reserve: float = setting(
        0.125,
        "share of the pool kept for reads (stored data can always be read back), and all that reads hold "
        "besides floating buffers: frames, loads from disk and the exclusive buffers of relayed reads "
        "(exclusive-buffers per remote daemon per read, in at most three quarters of it); raise it on a "
        "daemon that relays many reads at once (spill-high must stay at most 1 less it)",
        unit="ratio",
    )
    high_watermark: int = 1 * MiB
    low_watermark: int = 256 << 10
    connect_timeout: float = 10.0
    admin_timeout: float = setting(
        30.0,
        "how long a daemon waits for another daemon's answer to an admin request (a propagated drop, the sweep's "
        "`applications`, the drain's `holds`); no answer in time is no answer, never a 'no'",
        unit="s",
    )
    secret_file: str | None = setting(
        None,
        "file holding the cluster's shared secret (trailing whitespace ignored): clients must "
        "prove they know it on connect (HMAC challenge-response); without it anyone who can connect is trusted",
        parse=_optional,
        default_text="off",
        metavar="PATH",
    )
    peer_secret_file: str | None = setting(
        None,
        "file holding the secret only daemons have (not applications): peer daemons prove it on connect, so no "
        "client can pass for a daemon; needed with secret-file unless peers use TLS",
        parse=_optional,
        default_text="off",
        metavar="PATH",
    )
    peer_tls_port: int = setting(
        0,
        "TCP port for TLS connections between daemons, the same on every daemon; with it peers must use TLS "
        "(mutual, certificates below) and the plain port serves clients only (0: peers use the plain port)",
    )
    peer_tls_cert: str | None = setting(
        None,
        "this daemon's certificate chain (PEM), shown to peers on the TLS port both ways; its names must "
        "include the host of this daemon's node name",
        parse=_optional,
        default_text="none",
        metavar="PATH",
    )
    peer_tls_key: str | None = setting(
        None, "the private key of peer-tls-cert (PEM)", parse=_optional, default_text="none", metavar="PATH"
    )
    peer_tls_ca: str | None = setting(
        None,
        "CA certificates (PEM) a peer's certificate must chain to",
        parse=_optional,
        default_text="none",
        metavar="PATH",
    )
    client_tls_port: int = setting(
        0,
        "TCP port for clients over TLS; with it, TCP clients must use it (the plain port serves peers, and the "
        "Unix socket stays plain) (0: clients use the plain port)",
    )
    client_tls_cert: str | None = setting(
        None,
        "this daemon's certificate chain (PEM), shown to clients on the client TLS port; its names must include "
        "the host clients dial",
        parse=_optional,
        default_text="none",
        metavar="PATH",
    )
    client_tls_key: str | None = setting(
        None, "the private key of client-tls-cert (PEM)", parse=_optional, default_text="none", metavar="PATH"
    )
    client_tls_ca: str | None = setting(
        None,
        "CA certificates (PEM) a client's certificate must chain to; with it, clients must show one (mutual "
        "TLS, as between peers), without it the application secrets prove who a client is",
        parse=_optional,
        default_text="none: no client certificate asked for",
        metavar="PATH",
    )
    max_streams_per_connection: int = setting(
        MAX_STREAMS_PER_CONNECTION,
        "read and push streams one party may have open on one connection (a reduce task opens one read per "
        "daemon); the next one gets LIMIT_EXCEEDED",
        unit="streams",
        metavar="N",
    )
    max_pushes_per_connection: int = setting(
        4096,
        "map outputs one client connection may have open at once (one per running map task)",
        unit="streams",
        metavar="N",
    )
    max_partitions: int = setting(
        MAX_COMMIT_PARTITIONS,
        "most reduce partitions a shuffle may have; more are refused with LIMIT_EXCEEDED (the default is the most "
        "a CommitAck, 8 bytes per partition, can carry)",
        unit="partitions",
        metavar="N",
    )
    max_unsent_per_connection: int = setting(
        32 * MiB,
        "bytes of answers (CommitAck, AdminResponse, errors) one connection may have queued unsent; beyond it its "
        "next requests wait, in order, until the other side reads (data stops at the write watermarks anyway)",
        unit="bytes",
        parse=parse_size,
    )
    max_unsent: int = setting(
        64 * MiB,
        "bytes of answers all connections together may have queued unsent; beyond it requests that may answer "
        "at length wait until some connection's other side reads",
        unit="bytes",
        parse=parse_size,
    )
    push_wait_timeout: float = setting(
        120.0,
        "a push waiting this long for memory (held by reads or by other writers, or by stored data that cannot "
        "spill) fails with STORAGE_ERROR saying who holds it",
        unit="s",
    )
    unsent_timeout: float = setting(
        60.0,
        "a connection holding answers unsent beyond the high watermark, none of which its other side reads for "
        "this long, is closed with LIMIT_EXCEEDED (its memory, and the shared budget, come back)",
        unit="s",
    )
    max_admin_per_connection: int = setting(
        64, "admin requests one connection may have in progress at once", unit="requests", metavar="N"
    )
    max_connections_per_client: int = setting(
        1024,
        "client connections from one address (over the Unix socket: from one process); more are refused with "
        "LIMIT_EXCEEDED",
        unit="connections",
        metavar="N",
    )
    max_handshakes_per_address: int = setting(
        128,
        "connections from one address that may be in their handshake at once (connected, not yet through "
        "Hello and authentication); one more is refused with LIMIT_EXCEEDED and closed",
        unit="connections",
        metavar="N",
    )
    max_handshakes: int = setting(
        1024,
        "connections from all addresses that may be in their handshake at once; one more is refused with "
        "LIMIT_EXCEEDED and closed",
        unit="connections",
        metavar="N",
    )
    max_connections_per_peer: int = setting(
        64,
        "peer daemon connections from one address (one per daemon is normal); more are refused with LIMIT_EXCEEDED",
        unit="connections",
        metavar="N",
    )
    handshake_timeout: float = setting(
        10.0, "a connection that has not completed its Hello within this long is closed with TIMEOUT", unit="s"
    )
    idle_timeout: float = setting(
        0.0,
        "a connection with no open stream that sends nothing for this long is closed (0: never; the Python "
        "client does not reconnect by itself)",
        unit="s",
    )
    peer_timeout: float = setting(
        30.0,
        "a peer daemon that sends nothing for this long while streams depend on it (a ping goes out after a "
        "third of it) is declared dead: its streams fail with TIMEOUT and the connection closes (0: off)",
        unit="s",
    )
    tcp_keepalive: float = setting(
        30.0,
        "idle time before TCP keepalive probes on TCP connections (then every third of it, 3 probes), so a "
        "vanished host is noticed by the kernel (0: off)",
        unit="s",
    )
    metrics_host: str | None = setting(
        None,
        "address of the HTTP endpoint serving /metrics, /healthz and /readyz",
        parse=_optional,
        default_text="HOST",
        metavar="HOST",
    )
    metrics_port: int = setting(
        7338,
        "port of the HTTP endpoint; 0 picks a free one (logged), -1 turns the endpoint off; daemons on one "
        "host need one each",
    )
    drain_timeout: float = setting(
        20.0,
        "on SIGTERM/SIGINT or `shuffled drain`, how long open pushes, hand-over copies and reads may take to "
        "finish before the daemon exits",
        unit="s",
    )
    drain_handoff: str = setting(
        "off",
        "whether SIGTERM hands committed data over before exiting (`on`: every attempt with fewer copies on "
        "other daemons than its replica count is copied to a peer first, as `shuffled drain` does)",
        choices=("off", "on"),
    )
    stall_timeout: float = setting(10.0, "/healthz fails when the event loop has not run for this long", unit="s")
    ready_disk_free: float = setting(
        0.05, "/readyz fails when the data directory's file system has less than this share free", unit="ratio"
    )
    log_level: str = setting("info", "least severe log level written", choices=("debug", "info", "warning", "error"))
    log_format: str = setting(
        "kv", "log line format: logfmt `key=value` pairs or one JSON object per line", choices=("kv", "json")
    )

    def data_directory(self, bound_port: int | None = None) -> str | None:
        """The directory `data-dir` names (None: memory only).

        `auto` gives every daemon address its own directory, so daemons sharing a host never share one, and a
        daemon restarted on the same address finds its data again. The address is the one it listens on:
        with port 0 the caller passes the port it bound (`bound_port`), or every such daemon would share
        `HOST-0`.
        """
        if self.data_dir == DATA_DIR_NONE:
            return None
        if self.data_dir != DATA_DIR_AUTO:
            return self.data_dir
        if os.geteuid() == 0:
            root = SYSTEM_STATE_ROOT
        else:
            root = os.path.join(os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "shuffled")
        name = self.advertise or f"{self.host}:{self.port if bound_port is None else bound_port}"
        return os.path.join(root, re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-"))

    def peer_addresses(self) -> list[str]:
        """The `peers` entries without their zones."""
        return [entry.partition("@")[0] for entry in self.peers]

    def zone_mismatch(self, node: str) -> str | None:
        """Why other daemons may compute other placements than this one (each knows another daemon's zone
        only from its `peers` entries), or None: `zone` is set, and `peers` must name it for this daemon
        and name a zone for every other one."""
        if not self.zone:
            return None
        listed = {addr: zone for addr, _, zone in (entry.partition("@") for entry in self.peers)}
        if listed.get(node) != self.zone:
            return f"the peers entry of {node} does not say @{self.zone}"
        unzoned = sorted(addr for addr, zone in listed.items() if not zone)
        return f"peers entries without @zone: {','.join(unzoned)}" if unzoned else None

    def zones(self, node: str) -> dict[str, str]:
        """Each daemon's failure domain as the `peers` entries and `zone` name them (server/cluster/replica_ring.py)."""
        zones = {addr: zone for addr, _, zone in (entry.partition("@") for entry in self.peers) if zone}
        if self.zone:
            zones[node] = self.zone
        return zones

    def validate(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ConfigError(what)

        need(0 <= self.port < 65536, f"port {self.port} is not in 0..65535")
        need(
            self.advertise is not None or self.host not in _WILDCARD_HOSTS,
            f"advertise must be set when host is {self.host!r}: other daemons and Spark's readers find this "
            "daemon by that name, and a wildcard address names every host at once",
        )
        need(0 <= self.unix_socket_mode <= 0o777, "unix-socket-mode must be a file mode (0000..0777)")
        need(-1 <= self.metrics_port < 65536, f"metrics-port {self.metrics_port} is not in -1..65535")
        need(self.segment_size >= 4096 and self.segment_size % 4096 == 0, "segment-size must be a multiple of 4096")
        need(self.pool_size >= 16 * self.segment_size, "pool-size must hold at least 16 segments")
        need(self.exclusive_buffers >= 1, "exclusive-buffers must be >= 1")
        need(self.floating_buffers >= 0, "floating-buffers must be >= 0")
        need(0 <= self.shm_read_slots <= 1 << 20, "shm-read-slots must be in 0..1048576")
        need(1 <= self.push_min <= self.push_window, f"push-window must be >= {self.push_min}")
        need(0.0 < self.read_reserve < 0.5, "read-reserve must be in (0, 0.5)")
        need(0 <= self.low_watermark < self.high_watermark, "low watermark must be below the high watermark")
        need(
            self.max_unsent_per_connection >= MAX_CONTROL_BODY,
            f"max-unsent-per-connection must hold the largest answer ({MAX_CONTROL_BODY} bytes)",
        )
        need(self.max_unsent >= self.max_unsent_per_connection, "max-unsent must be >= max-unsent-per-connection")
        need(self.unsent_timeout > 0, "unsent-timeout must be > 0 seconds")
        need(self.push_wait_timeout > 0, "push-wait-timeout must be > 0 seconds")
        need(self.admin_timeout > 0, "admin-timeout must be > 0 seconds")
        need(self.drain_timeout >= 0, "drain-timeout must be >= 0")
        need(self.stall_timeout > 0, "stall-timeout must be > 0")
        need(0.0 <= self.ready_disk_free < 1.0, "ready-disk-free must be in [0, 1)")
        need(0.0 < self.spill_low < self.spill_high <= 1.0, "need 0 < spill-low < spill-high <= 1")
        need(0.0 < self.push_share_per_connection <= 1.0, "push-share-per-connection must be in (0, 1]")
        need(0.0 < self.push_share_per_application <= 1.0, "push-share-per-application must be in (0, 1]")
        need(
            self.spill_high <= 1.0 - self.read_reserve,
            f"spill-high must be at most {1.0 - self.read_reserve} (pushes never use the read reserve, "
            "so a higher watermark would never be reached)",
        )
        for name in ("streams", "pushes", "admin"):
            limit = getattr(self, f"max_{name}_per_connection")
            need(limit >= 1, f"max-{name}-per-connection must be >= 1")
        need(
            1 <= self.max_partitions <= MAX_COMMIT_PARTITIONS,
            f"max-partitions must be in 1..{MAX_COMMIT_PARTITIONS} (a CommitAck carries no more)",
        )
        need(self.max_connections_per_client >= 1, "max-connections-per-client must be >= 1")
        need(self.max_connections_per_peer >= 1, "max-connections-per-peer must be >= 1")
        need(self.max_handshakes_per_address >= 1, "max-handshakes-per-address must be >= 1")
        need(
            self.max_handshakes >= self.max_handshakes_per_address,
            "max-handshakes must be >= max-handshakes-per-address",
        )
        need(self.handshake_timeout > 0, "handshake-timeout must be > 0 seconds")
        for name in ("idle_timeout", "peer_timeout", "tcp_keepalive"):
            need(getattr(self, name) >= 0, f"{name.replace('_', '-')} must be >= 0 seconds (0: off)")
        need(
            self.tcp_keepalive == 0 or self.tcp_keepalive >= 3,
            "tcp-keepalive must be 0 (off) or >= 3 seconds (probes go every third of it)",
        )
        need(self.app_memory_quota >= 0, "app-memory-quota must be >= 0")
        need(self.app_disk_quota >= 0, "app-disk-quota must be >= 0")
        need(self.app_ttl >= 0, "app-ttl must be >= 0 seconds (0: never expire)")
        need(self.flush_after >= 0, "flush-after must be >= 0 seconds (0: off)")
        need(1 <= self.replicas <= MAX_REPLICAS, f"replicas must be in 1..{MAX_REPLICAS}")
        need(self.object_store_timeout > 0, "object-store-timeout must be > 0 seconds")
        need(self.object_store_connect_timeout > 0, "object-store-connect-timeout must be > 0 seconds")
        need(0 <= self.object_store_retries <= 10, "object-store-retries must be in 0..10")
        need(
            S3_MIN_PART <= self.object_store_part_size <= S3_MAX_PART,
            "object-store-part-size must be 5M..5G (S3's limits for a part)",
        )
        endpoint = self.object_store_endpoint
        need(
            endpoint is None or urlsplit(endpoint).scheme in ("http", "https"),
            f"object-store-endpoint {endpoint!r} is not an http:// or https:// URL",
        )
        need(self.object_store_durable_delay >= 0, "object-store-durable-delay must be >= 0 seconds")
        need(self.object_store_sweep >= 0, "object-store-sweep must be >= 0 seconds (0: never)")
        need(
            self.object_store_lease > 2 * max(self.peer_timeout, self.admin_timeout),
            "object-store-lease must be more than twice peer-timeout and admin-timeout: a daemon only slow to "
            "answer must never look gone",
        )
        need(self.disk_quota >= 0, "disk-quota must be >= 0 (0: no cap)")
        need(self.heal_interval >= 0, "heal-interval must be >= 0 seconds (0: never)")
        need(self.heal_bandwidth > 0, "heal-bandwidth must be > 0 bytes a second")
        need(
            self.durability == "none" or self.object_store is not None,
            "durability object-store needs an object-store to upload to",
        )
        need(self.replica_lag >= 1, "replica-lag must be >= 1 buffer")
        need(self.replica_search >= 1, "replica-search must be >= 1")
        need(self.failover_timeout > 0, "failover-timeout must be > 0 seconds")
        if self.peers_dns is not None:
            name, _, port = self.peers_dns.rpartition(":")
            need(
                bool(name) and port.isdigit() and 0 < int(port) < 65536,
                f"peers-dns {self.peers_dns!r} is not NAME:PORT",
            )
        for entry in self.peers:
            need(entry.count("@") <= 1 and not entry.endswith("@"), f"peers entry {entry!r} is not HOST:PORT[@ZONE]")
        tls = (self.peer_tls_cert, self.peer_tls_key, self.peer_tls_ca)
        need(
            (self.peer_tls_port == 0 and not any(tls)) or (0 < self.peer_tls_port < 65536 and all(tls)),
            "peer TLS needs peer-tls-port, peer-tls-cert, peer-tls-key and peer-tls-ca together",
        )
        need(
            (self.client_tls_port == 0 and not (self.client_tls_cert or self.client_tls_key or self.client_tls_ca))
            or (0 < self.client_tls_port < 65536 and bool(self.client_tls_cert and self.client_tls_key)),
            "client TLS needs client-tls-port, client-tls-cert and client-tls-key together (client-tls-ca optional)",
        )
        need(self.fsync_interval > 0, "fsync-interval must be > 0 seconds")
        need(
            not self.at_rest_key_file or self.data_dir != DATA_DIR_NONE or self.object_store is not None,
            "at-rest-key-file needs a data dir or an object store (with neither nothing is written)",
        )
        need(
            self.fsync == "none" or self.data_dir != DATA_DIR_NONE,
            f"fsync {self.fsync} needs a data dir (data-dir is none: the pool is all there is)",
        )
        need(
            not self.client_tls_port or self.client_tls_port not in (self.port, self.peer_tls_port),
            "client-tls-port must differ from port and peer-tls-port",
        )
        need(
            not self.app_memory_quota or self.app_memory_quota >= 2 * self.push_window * self.segment_size,
            "app-memory-quota must hold at least two push windows",
        )


#: listen addresses that are not a name for this host
_WILDCARD_HOSTS = ("0.0.0.0", "::", "")


@dataclass(frozen=True, eq=False)
class SettingInfo:
    attr: str
    name: str
    meta: Setting
    default: Any

    @property
    def flag(self) -> str:
        return "--" + self.name

    @property
    def key(self) -> str:
        """TOML key."""
        return self.name.replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    def show(self, value: Any) -> str:
        """A value as text, in the units the setting is written in."""
        if value is None:
            return self.meta.default_text or "none"
        if self.meta.parse is parse_size:
            return format_size(value)
        if self.meta.parse is _parse_mode:
            return f"{value:04o}"
        if isinstance(value, list):
            return ",".join(value) if value else (self.meta.default_text or "none")
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)


def settings() -> list[SettingInfo]:
    """The table: every DaemonConfig field that carries setting metadata, in declaration order."""
    out = []
    for f in dataclasses.fields(DaemonConfig):
        meta = f.metadata.get("setting")
        if meta is None:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out.append(SettingInfo(f.name, f.name.replace("_", "-"), meta, default))
    return out


# -- loading


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting (plus --config); defaults stay None so only given flags override."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"TOML file with settings (keys as in `shuffled config show`); default ${CONFIG_ENV}",
    )
    for s in settings():
        unit = f" [{s.meta.unit}]" if s.meta.unit else ""
        parser.add_argument(
            s.flag,
            dest=f"setting_{s.attr}",
            metavar=s.meta.metavar or ("|".join(s.meta.choices) if s.meta.choices else s.key.upper()),
            help=f"{s.meta.help}{unit} (default {s.show(s.default)}; ${s.env})".replace("%", "%%"),
        )


def load(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None, validate: bool = True
) -> tuple[DaemonConfig, dict[str, str]]:
    """The effective configuration and where each setting came from ("default", a file, "env", "flag");
    ``validate=False`` for a caller that reads a few settings of a daemon configured elsewhere too."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    table = settings()
    path = getattr(args, "config", None) or environ.get(CONFIG_ENV)
    if path:
        for s, raw in _read_toml(path, table).items():
            values[s.attr] = _convert(s, raw, path)
            sources[s.attr] = path
    for s in table:
        if s.env in environ:
            values[s.attr] = _convert(s, environ[s.env], s.env)
            sources[s.attr] = "env"
        raw = getattr(args, f"setting_{s.attr}", None)
        if raw is not None:
            values[s.attr] = _convert(s, raw, s.flag)
            sources[s.attr] = "flag"
    config = DaemonConfig(**values)
    if validate:
        config.validate()
    return config, {s.attr: sources.get(s.attr, "default") for s in table}


def unknown_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """`SHUFFLED_…` variables that name no setting (most likely typos)."""
    environ = os.environ if environ is None else environ
    known = {s.env for s in settings()} | {CONFIG_ENV, SECRET_ENV, PEER_SECRET_ENV}
    return sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in known)


def _convert(s: SettingInfo, raw: Any, where: str) -> Any:
    try:
        return s.meta.convert(raw)
    except ValueError as exc:
        raise ConfigError(f"{s.name} (from {where}): {exc}") from None


def _read_toml(path: str, table: list[SettingInfo]) -> dict[SettingInfo, Any]:
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    by_key = {s.key: s for s in table}
    unknown = sorted(k for k in doc if k not in by_key)
    if unknown:
        raise ConfigError(f"config file {path}: unknown setting(s) {', '.join(unknown)}")
    return {by_key[k]: v for k, v in doc.items()}


# -- showing


def _toml_value(s: SettingInfo, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    if s.meta.parse in (parse_size, _parse_mode):
        return f'"{s.show(value)}"'
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return s.show(value)


def render_toml(config: DaemonConfig, sources: Mapping[str, str]) -> str:
    """The effective configuration as a TOML file that `--config` reads back (unset settings commented out)."""
    lines = []
    for s in settings():
        value = getattr(config, s.attr)
        text = _toml_value(s, value)
        origin = sources.get(s.attr, "default")
        if not text:
            lines.append(f"# {s.key} = ...  # {origin}: {s.show(value)}")
        else:
            lines.append(f"{s.key} = {text}  # {origin}")
    return "\n".join(lines) + "\n"


def render_markdown() -> str:
    """The reference table of docs/configuration.md (a test checks that it holds exactly this)."""
    rows = [
        "| setting (flag / `SHUFFLED_…` / TOML key) | default | unit | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for s in settings():
        default = s.show(s.default)
        choices = f" (`{'`, `'.join(s.meta.choices)}`)" if s.meta.choices else ""
        rows.append(
            f"| `{s.flag}` / `{s.env}` / `{s.key}` | `{default}` | {s.meta.unit or '-'} | {s.meta.help}{choices} |"
        )
    return "\n".join(rows) + "\n"
