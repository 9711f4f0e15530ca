"""S3 credentials found the usual AWS ways: the environment, then the shared credentials and config files.

The S3 client (obstore) reads `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` itself but not the shared
files, so this module reads both, in the AWS SDKs' order, and hands the client what it found:
`AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`); else the profile `AWS_PROFILE`
(or `AWS_DEFAULT_PROFILE`, or `default`) in `AWS_SHARED_CREDENTIALS_FILE` (`~/.aws/credentials`), then in
`AWS_CONFIG_FILE` (`~/.aws/config`, where it is `[profile NAME]`). A web identity token file or container
credentials named in the environment are left to the client, which fetches and renews those. The
instance metadata service is never asked: on a host that is not a cloud VM that would be a request to
169.254.169.254 that can only time out.

The secret parts never leave a `Credentials`: its `repr` names only where it came from.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from dataclasses import dataclass

#: variables naming credentials the client fetches itself (web identity, ECS/EKS container credentials)
CLIENT_SOURCES = (
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


class NoCredentials(Exception):
    """No credentials in the environment or the shared files; the message says where it looked."""


@dataclass(frozen=True, repr=False)
class Credentials:
    access_key: str
    secret_key: str
    token: str | None
    #: where they came from, for logs ("environment", "~/.aws/credentials [default]")
    source: str

    def __repr__(self) -> str:
        return f"Credentials(from {self.source})"

    def secrets(self) -> tuple[str, ...]:
        """Every value that must never be shown (the access key id too: it names the account's key)."""
        return tuple(v for v in (self.access_key, self.secret_key, self.token) if v)


def find(environ: Mapping[str, str] | None = None) -> Credentials | None:
    """Static credentials, or None when the environment names a source the client fetches itself."""
    env = os.environ if environ is None else environ
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        return Credentials(key, secret, env.get("AWS_SESSION_TOKEN") or None, "environment")
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    home = env.get("HOME") or os.path.expanduser("~")
    files = (
        (env.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials"), profile),
        (
            env.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config"),
            profile if profile == "default" else f"profile {profile}",
        ),
    )
    for path, section in files:
        found = _from_file(path, section)
        if found is not None:
            return found
    if any(env.get(name) for name in CLIENT_SOURCES):
        return None
    raise NoCredentials(
        "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give profile "
        f"{profile!r} keys in {files[0][0]} or {files[1][0]}"
    )


def _from_file(path: str, section: str) -> Credentials | None:
    parser = configparser.RawConfigParser()
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except (OSError, configparser.Error):
        return None
    if not parser.has_section(section):
        return None
    key = parser.get(section, "aws_access_key_id", fallback="").strip()
    secret = parser.get(section, "aws_secret_access_key", fallback="").strip()
    if not key or not secret:
        return None
    token = parser.get(section, "aws_session_token", fallback="").strip() or None
    return Credentials(key, secret, token, f"{path} [{section}]")
