"""The object store's settings and credentials, without a server: `object-store-*` values are refused naming
the setting and reach the layer as given; S3 credentials come the usual AWS ways
(shuffled/server/storage/credentials.py: environment first, then the profile in the shared credentials
file, then in the config file; sources the client fetches itself are left to it; nothing found is a clear
error); and no secret shows in a `repr`, the layer's or its errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shuffled import config as settings
from shuffled.protocol.errors import StorageError
from shuffled.server.storage import credentials
from shuffled.server.storage.object_config import ObjectStoreConfig
from shuffled.server.storage.objects import ObjectStore
from shuffled.server.storage.probe import probe
from tests.aio import run


def _files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "credentials").write_text(
        "[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key = default-secret\n"
        "[team]\naws_access_key_id = AKTEAM\naws_secret_access_key = team-secret\naws_session_token = team-token\n"
    )
    (tmp_path / "config").write_text(
        "[default]\nregion = eu-west-1\n"
        "[profile cfgonly]\naws_access_key_id = AKCFG\naws_secret_access_key = cfg-secret\n"
    )
    return {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"), "AWS_CONFIG_FILE": str(tmp_path / "config")}


def test_the_environment_wins_over_the_files(tmp_path: Path) -> None:
    env = {
        **_files(tmp_path),
        "AWS_ACCESS_KEY_ID": "AKENV",
        "AWS_SECRET_ACCESS_KEY": "env-secret",
        "AWS_PROFILE": "team",
    }
    found = credentials.find(env)
    assert found is not None and (found.access_key, found.secret_key, found.source) == (
        "AKENV",
        "env-secret",
        "environment",
    )


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        (None, ("AKDEFAULT", "default-secret", None)),
        ("team", ("AKTEAM", "team-secret", "team-token")),
        ("cfgonly", ("AKCFG", "cfg-secret", None)),
    ],
)
def test_a_profile_from_the_shared_files(
    tmp_path: Path, profile: str | None, expected: tuple[str, str, str | None]
) -> None:
    env = _files(tmp_path) | ({"AWS_PROFILE": profile} if profile else {})
    found = credentials.find(env)
    assert found is not None and (found.access_key, found.secret_key, found.token) == expected
    assert found.secret_key not in repr(found) and found.access_key not in repr(found)


def test_nothing_found_says_where_it_looked_and_client_sources_are_left_to_the_client(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "AWS_PROFILE": "missing"}
    with pytest.raises(credentials.NoCredentials, match=r"AWS_ACCESS_KEY_ID.*'missing'"):
        credentials.find(env)
    assert credentials.find({**env, "AWS_WEB_IDENTITY_TOKEN_FILE": str(tmp_path / "token")}) is None


def test_the_layer_hides_its_secrets_and_fails_without_credentials(tmp_path: Path) -> None:
    """No request leaves without credentials (the instance metadata service is never asked): every call
    fails at once with where the credentials were looked for."""
    config = ObjectStoreConfig("s3://bucket/prefix", endpoint="http://127.0.0.1:9", path_style=True)
    with_keys = ObjectStore(config, environ={"AWS_ACCESS_KEY_ID": "AKVISIBLE", "AWS_SECRET_ACCESS_KEY": "hidden"})
    assert "hidden" not in repr(with_keys) and "AKVISIBLE" not in repr(with_keys)
    without = ObjectStore(config, environ={"HOME": str(tmp_path)})
    with pytest.raises(StorageError, match="no S3 credentials"):
        run(without.list_objects(), 10)
    assert run(probe(without), 10) is not None and without.stats.state == "failed"
    assert without.stats.errors == {"list": 1, "put": 1}


@pytest.mark.parametrize(
    "url", ["s3://", "http://bucket/p", "s3://Bucket/p", "s3://b/p", "s3://bucket/a//b", "s3://bucket/../x"]
)
def test_object_store_urls_are_checked(url: str) -> None:
    with pytest.raises(ValueError):
        ObjectStoreConfig(url)


@pytest.mark.parametrize(
    ("env", "refusal"),
    [
        ({"SHUFFLED_OBJECT_STORE": "s3://Not_A_Bucket/p"}, "object-store"),
        ({"SHUFFLED_OBJECT_STORE_PART_SIZE": "1M"}, "object-store-part-size must be 5M..5G"),
        ({"SHUFFLED_OBJECT_STORE_ENDPOINT": "ftp://store:21"}, "is not an http:// or https:// URL"),
        ({"SHUFFLED_OBJECT_STORE_TIMEOUT": "0"}, "object-store-timeout must be > 0"),
        ({"SHUFFLED_OBJECT_STORE_PATH_STYLE": "yes"}, "object-store-path-style"),
    ],
)
def test_object_store_settings_are_refused_naming_the_setting(env: dict[str, str], refusal: str) -> None:
    with pytest.raises(settings.ConfigError, match=re.escape(refusal)):
        settings.load(None, env)


def test_object_store_settings_reach_the_layer() -> None:
    env = {
        "SHUFFLED_OBJECT_STORE": "s3://my-bucket/shuffle/data/",
        "SHUFFLED_OBJECT_STORE_ENDPOINT": "http://127.0.0.1:8333",
        "SHUFFLED_OBJECT_STORE_PATH_STYLE": "on",
        "SHUFFLED_OBJECT_STORE_PART_SIZE": "32M",
    }
    config = ObjectStoreConfig.of(settings.load(None, env)[0])
    assert (config.bucket, config.prefix, config.path_style, config.part_size) == (
        "my-bucket",
        "shuffle/data",
        True,
        32 << 20,
    )
    assert settings.load(None, {})[0].object_store is None
