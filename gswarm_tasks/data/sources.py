"""Where a chunk's bytes may come from: `file://` under the allowed roots, `http(s)://` to allowed hosts (parsed and
fetched by `urls`), `s3://` when enabled; and fetching them into a file, bounded by `data.max_size`."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import urllib3

from ..devices import open_under
from ..errors import Forbidden, InvalidRequest, NetworkError, NotFound, ResourceUnavailable
from ..models.sources import parse_source
from ..settings import Settings
from ..storage import CHUNK
from ..urls import Allow, Url, fetch, parse_url

Progress = Callable[[int], None]


@dataclass(frozen=True)
class DataSource:
    scheme: str  # file, http, https, s3
    url: str
    path: str | None = None
    parsed: Url | None = None  # an http(s) source as parsed and checked: what is fetched


def data_allow(settings: Settings) -> Allow:
    return Allow.of(settings.data_allowed_hosts, "data.allowed_hosts")


def parse_data_source(url: Any, settings: Settings, field: str = "source") -> DataSource:
    """Check a chunk source: `file://` under the allowed roots, `http(s)://` to an allowed host, `s3://` when
    enabled; anything else is refused with the field named."""
    if not isinstance(url, str) or not url:
        raise InvalidRequest(f"{field}: a source URL is required", {"field": field})
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "file":
        src = parse_source(url, settings.allowed_roots, field)
        return DataSource("file", url, src.path)
    if scheme in ("http", "https"):
        parsed = data_allow(settings).check(parse_url(url, field), field)
        return DataSource(scheme, str(parsed), parsed=parsed)
    if scheme == "s3":
        if not settings.data_s3_enabled:
            raise InvalidRequest(
                f"{field}: s3:// sources are not enabled: set data.s3_enabled (GSWARM_DATA_S3_ENABLED=true) where the "
                "control plane runs, and `pip install gswarm[s3]` on the nodes (credentials: the usual AWS chain)",
                {"field": field, "value": url},
            )
        if importlib.util.find_spec("boto3") is None:
            raise InvalidRequest(
                f"{field}: s3:// sources need boto3, which is not installed here: `pip install gswarm[s3]`",
                {"field": field},
            )
        bucket, key = _s3_parts(url)
        if not bucket or not key:
            raise InvalidRequest(f"{field}: {url!r} is not s3://bucket/key", {"field": field, "value": url})
        return DataSource("s3", url)
    raise InvalidRequest(
        f"{field}: scheme {scheme or '(none)'!r} is not allowed for data (file://, http(s)://, s3://)",
        {"field": field, "value": url},
    )


def _s3_parts(url: str) -> tuple[str, str]:
    parsed = urlparse(url)
    return parsed.netloc, parsed.path.lstrip("/")


def _fetch_http(src: DataSource, dest: Path, settings: Settings, progress: Progress | None) -> None:
    """The checked URL, fetched from the address that was checked; no redirect is followed."""
    assert src.parsed is not None
    max_size = settings.data_max_size
    with fetch(src.parsed, data_allow(settings), "source", timeout=(10, 60)) as r:
        if r.status in (404, 410):
            raise NotFound(f"source: {src.url} answered {r.status}", {"field": "source", "status": r.status})
        if r.status != 200:
            raise NetworkError(f"source: {src.url} answered {r.status}", {"status": r.status})
        declared = int(r.headers.get("Content-Length") or 0)
        if declared > max_size:
            raise InvalidRequest(
                f"source: {declared} bytes is over data.max_size ({max_size})", {"field": "source"}
            )
        got = 0
        try:
            with open(dest, "wb") as f:
                for block in r.stream(CHUNK):
                    got += len(block)
                    if got > max_size:
                        raise InvalidRequest(
                            f"source: more than data.max_size ({max_size}) bytes", {"field": "source"}
                        )
                    f.write(block)
                    if progress:
                        progress(len(block))
                f.flush()
                os.fsync(f.fileno())
        except urllib3.exceptions.HTTPError as exc:
            raise NetworkError(
                f"source: fetching {src.url} failed: {type(exc).__name__}: {exc}"[:500]
            ) from exc


def _fetch_s3(url: str, dest: Path, settings: Settings) -> None:
    """The object, with the node's AWS credentials (the usual chain: environment, profile, role); an endpoint from
    data.s3_endpoint or AWS_ENDPOINT_URL(_S3). What S3 refuses is said in gswarm's words."""
    import boto3  # an optional dependency: parse_data_source refused s3:// without it
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    bucket, key = _s3_parts(url)
    try:
        client = boto3.client("s3", endpoint_url=settings.data_s3_endpoint)
        head = client.head_object(Bucket=bucket, Key=key)
        if int(head.get("ContentLength", 0)) > settings.data_max_size:
            raise InvalidRequest(
                f"source: object is over data.max_size ({settings.data_max_size})", {"field": "source"}
            )
        client.download_file(bucket, key, str(dest))
    except NoCredentialsError as exc:
        raise ResourceUnavailable(
            f"source: no AWS credentials on this node for {url} (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "a profile or a role)",
            {"field": "source"},
        ) from exc
    except ClientError as exc:
        err = exc.response.get("Error", {})
        code, status = (
            str(err.get("Code", "")),
            int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)),
        )
        if status == 404 or code in ("404", "NoSuchKey", "NoSuchBucket", "NotFound"):
            raise NotFound(f"source: {url} does not exist", {"field": "source", "value": url}) from exc
        if status == 403 or code in ("403", "AccessDenied", "Forbidden"):
            raise Forbidden(
                f"source: this node's AWS credentials may not read {url}", {"field": "source"}
            ) from exc
        raise NetworkError(
            f"source: S3 refused {url}: {code or status} {err.get('Message', '')}"[:500]
        ) from exc
    except BotoCoreError as exc:
        raise NetworkError(f"source: fetching {url} failed: {exc}"[:500], {"field": "source"}) from exc


def fetch_into(url: str | None, dest: Path, settings: Settings, progress: Progress | None = None) -> None:
    """Fetch a checked source's bytes into `dest` (a file the caller renames into place)."""
    src = parse_data_source(url, settings)
    if src.scheme == "file":
        assert src.path is not None
        with open_under(src.path, settings.allowed_roots) as fi, open(dest, "wb") as fo:
            shutil.copyfileobj(fi, fo, CHUNK)
    elif src.scheme == "s3":
        _fetch_s3(src.url, dest, settings)
    else:
        _fetch_http(src, dest, settings, progress)
