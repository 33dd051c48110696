"""Where a chunk's bytes may come from: `file://` under the allowed roots, `http(s)://` to allowed hosts, `s3://`
when enabled; and fetching them into a file, bounded by `data.max_size`."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import requests

from .errors import InvalidRequest, NetworkError, NotFound
from .settings import Settings
from .sources import parse_source
from .storage import CHUNK

Progress = Callable[[int], None]


@dataclass(frozen=True)
class DataSource:
    scheme: str  # file, http, https, s3
    url: str
    path: str | None = None


def parse_data_source(url: Any, settings: Settings, field: str = "source") -> DataSource:
    """Check a chunk source: `file://` under the allowed roots, `http(s)://` to an allowed host, `s3://` when
    enabled; anything else is refused with the field named."""
    if not isinstance(url, str) or not url:
        raise InvalidRequest(f"{field}: a source URL is required", {"field": field})
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme == "file":
        src = parse_source(url, settings.allowed_roots, field)
        return DataSource("file", url, src.path)
    if scheme in ("http", "https"):
        host = (parsed.hostname or "").lower()
        try:
            port = parsed.port
        except ValueError as exc:
            raise InvalidRequest(f"{field}: {url!r} has a bad port", {"field": field, "value": url}) from exc
        allowed = settings.data_allowed_hosts
        if not host or (host not in allowed and f"{host}:{port}" not in allowed):
            raise InvalidRequest(
                f"{field}: host {parsed.netloc!r} is not in data.allowed_hosts ({', '.join(allowed) or 'none'})",
                {"field": field, "value": url, "host": parsed.netloc},
            )
        return DataSource(scheme, url)
    if scheme == "s3":
        if not settings.data_s3_enabled:
            raise InvalidRequest(
                f"{field}: s3:// sources are not enabled (set data.s3_enabled and install boto3 on the nodes)",
                {"field": field, "value": url},
            )
        if importlib.util.find_spec("boto3") is None:
            raise InvalidRequest(f"{field}: s3:// sources need boto3, which is not installed", {"field": field})
        if not parsed.netloc or not parsed.path.strip("/"):
            raise InvalidRequest(f"{field}: {url!r} is not s3://bucket/key", {"field": field, "value": url})
        return DataSource("s3", url)
    raise InvalidRequest(
        f"{field}: scheme {parsed.scheme or '(none)'!r} is not allowed for data (file://, http(s)://, s3://)",
        {"field": field, "value": url},
    )


def _fetch_http(url: str, dest: Path, max_size: int, progress: Progress | None) -> None:
    try:
        with requests.get(url, stream=True, timeout=(10, 60), allow_redirects=False) as r:
            if r.status_code in (404, 410):
                raise NotFound(f"source: {url} answered {r.status_code}", {"field": "source", "status": r.status_code})
            if r.status_code != 200:
                raise NetworkError(f"source: {url} answered {r.status_code}", {"status": r.status_code})
            declared = int(r.headers.get("Content-Length") or 0)
            if declared > max_size:
                raise InvalidRequest(
                    f"source: {declared} bytes is over data.max_size ({max_size})", {"field": "source"}
                )
            got = 0
            with open(dest, "wb") as f:
                for block in r.iter_content(CHUNK):
                    got += len(block)
                    if got > max_size:
                        raise InvalidRequest(f"source: more than data.max_size ({max_size}) bytes", {"field": "source"})
                    f.write(block)
                    if progress:
                        progress(len(block))
                f.flush()
                os.fsync(f.fileno())
    except requests.RequestException as exc:
        raise NetworkError(f"source: fetching {url} failed: {type(exc).__name__}: {exc}"[:500]) from exc


def _fetch_s3(url: str, dest: Path, settings: Settings) -> None:
    import boto3  # an optional dependency: parse_data_source refused s3:// without it

    parsed = urlparse(url)
    client = boto3.client("s3", endpoint_url=settings.data_s3_endpoint)
    head = client.head_object(Bucket=parsed.netloc, Key=parsed.path.lstrip("/"))
    if int(head.get("ContentLength", 0)) > settings.data_max_size:
        raise InvalidRequest(f"source: object is over data.max_size ({settings.data_max_size})", {"field": "source"})
    client.download_file(parsed.netloc, parsed.path.lstrip("/"), str(dest))


def fetch_into(url: str | None, dest: Path, settings: Settings, progress: Progress | None = None) -> None:
    """Fetch a checked source's bytes into `dest` (a file the caller renames into place)."""
    src = parse_data_source(url, settings)
    if src.scheme == "file":
        assert src.path is not None
        if not Path(src.path).is_file():
            raise NotFound(f"source: {src.path} is not a file", {"field": "source"})
        shutil.copyfile(src.path, dest)
    elif src.scheme == "s3":
        _fetch_s3(src.url, dest, settings)
    else:
        _fetch_http(src.url, dest, settings.data_max_size, progress)
