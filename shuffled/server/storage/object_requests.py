"""How the object store's requests went (objects.py): each one counted and timed, and a failure put in a
line an operator can act on (wrong credentials, no such bucket, access denied, unreachable endpoint,
server errors, timeouts), with the credentials' secrets blanked out.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from obstore.exceptions import NotFoundError

from ...ops.stats import ObjectStoreStats
from ...protocol.errors import StorageError
from .object_config import ObjectStoreConfig

_S3_CODE = re.compile(r"<Code>([A-Za-z0-9.]+)</Code>")
_STATUS = re.compile(r"status(?: code)?: (\d{3})")
_HTTP_KIND = re.compile(r"HttpError \{ kind: (\w+)")
_OS_MESSAGE = re.compile(r'message: "([^"]+)"')

_CREDENTIAL_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "TokenRefreshRequired",
        "AuthorizationHeaderMalformed",
        "InvalidClientTokenId",
    }
)


class Requests:
    """The object store's requests counted, timed and explained (see the module)."""

    def __init__(
        self, config: ObjectStoreConfig, stats: ObjectStoreStats, observe: Callable[[str, float], None] | None
    ) -> None:
        self.config = config
        self.stats = stats
        #: takes each request's operation and seconds (the metrics' histogram)
        self.observe = observe
        #: what must not appear in an error: the credentials' secrets
        self.secrets: tuple[str, ...] = ()

    def done(self, op: str, started: float) -> None:
        """A request of `op` ended (well or not): counted, and its seconds observed."""
        requests = self.stats.requests
        requests[op] = requests.get(op, 0) + 1
        if self.observe is not None:
            self.observe(op, time.monotonic() - started)

    def failed(self, op: str, key: str, started: float, reason: str) -> StorageError:
        """A request of `op` about `key` failed: counted, and the error its caller raises."""
        self.done(op, started)
        errors = self.stats.errors
        errors[op] = errors.get(op, 0) + 1
        return StorageError(f"object store {op} {self.config.url}/{key}: {self.scrub(reason)}")

    def scrub(self, text: str) -> str:
        """`text` with the credentials' secrets blanked out: they appear in no error."""
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    @staticmethod
    def missing(exc: BaseException) -> bool:
        """The store said the object is not there: obstore's NotFoundError, or NoSuchKey in an error of another
        kind (what it makes of a ranged GET's 404 from some servers)."""
        if isinstance(exc, NotFoundError):
            return True
        code = _S3_CODE.search(" ".join(str(exc).split()))
        return code is not None and code.group(1) == "NoSuchKey"

    def reason(self, exc: BaseException) -> str:
        """What went wrong, in a line: the S3 error code or HTTP status, or the connection's trouble."""
        text = " ".join(str(exc).split())
        cfg = self.config
        if isinstance(exc, TimeoutError):
            return text or "timed out"
        code = _S3_CODE.search(text)
        status = _STATUS.search(text)
        if code is not None:
            name = code.group(1)
            http = f"HTTP {status.group(1)} " if status else ""
            if name in _CREDENTIAL_CODES:
                return f"wrong credentials ({http}{name}: the store does not accept these keys)"
            if name == "NoSuchBucket":
                return f"no such bucket {cfg.bucket!r} ({http}{name})"
            if name in ("AccessDenied", "AllAccessDisabled"):
                return f"access denied ({http}{name}): these credentials may not do this in the bucket"
            if name == "NoSuchKey":
                return f"no such object ({http}{name})"
            return f"the store answered {http}{name}"
        kind = _HTTP_KIND.search(text)
        endpoint = cfg.endpoint or f"S3 in {cfg.region or 'the default region'}"
        if kind is not None and kind.group(1) == "Connect":
            detail = _OS_MESSAGE.search(text)
            return f"endpoint {endpoint} unreachable ({detail.group(1) if detail else 'cannot connect'})"
        if kind is not None and kind.group(1) == "Timeout":
            return f"endpoint {endpoint} did not answer within {cfg.timeout:g}s (tried {cfg.retries + 1} times)"
        if status is not None:
            return f"the store answered HTTP {status.group(1)}"
        if kind is not None:
            return f"endpoint {endpoint}: the connection failed ({kind.group(1)})"
        first = text.split(" Debug source:")[0]
        return first[:300] or type(exc).__name__
