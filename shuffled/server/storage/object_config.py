"""Where the object store is and how long each request to it may take: the `object-store-*` settings as
the object-store layer (objects.py) uses them."""

from __future__ import annotations

from dataclasses import dataclass

from ...config import S3_MAX_PART, S3_MIN_PART, DaemonConfig, MiB, parse_s3_url


@dataclass(frozen=True)
class ObjectStoreConfig:
    """Where objects go and how long each request may take; see the `object-store-*` settings."""

    url: str
    endpoint: str | None = None
    region: str | None = None
    path_style: bool = False
    #: most seconds one HTTP request may take (connecting, sending, answering)
    timeout: float = 30.0
    connect_timeout: float = 5.0
    #: retries of a request that failed in a way worth retrying (5xx, dropped or refused connections)
    retries: int = 3
    part_size: int = 16 * MiB
    #: parts of one object in flight at once
    concurrency: int = 4

    def __post_init__(self) -> None:
        parse_s3_url(self.url)
        if not S3_MIN_PART <= self.part_size <= S3_MAX_PART:
            raise ValueError("object-store part size must be 5 MiB..5 GiB (S3's limits)")

    @classmethod
    def of(cls, config: DaemonConfig) -> ObjectStoreConfig:
        """The daemon's `object-store-*` settings (`object-store` must be set)."""
        assert config.object_store is not None
        return cls(
            config.object_store,
            endpoint=config.object_store_endpoint,
            region=config.object_store_region,
            path_style=config.object_store_path_style == "on",
            timeout=config.object_store_timeout,
            connect_timeout=config.object_store_connect_timeout,
            retries=config.object_store_retries,
            part_size=config.object_store_part_size,
        )

    @property
    def bucket(self) -> str:
        return parse_s3_url(self.url)[0]

    @property
    def prefix(self) -> str:
        return parse_s3_url(self.url)[1]

    def request_bound(self) -> float:
        """Most seconds one request takes, retries and their back-off included (the client stops retrying
        after `retry_window` but lets a try that began before finish)."""
        return self.retry_window() + self.timeout

    def retry_window(self) -> float:
        return self.timeout * (self.retries + 1)
