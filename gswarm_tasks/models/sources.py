"""Model sources: `hf://org/repo[@rev]`, `https://huggingface.co/org/repo`, `file:///path` under allowed roots."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ..devices import open_under
from ..errors import InvalidRequest, NetworkError, NotFound, VerificationError
from ..storage import iter_files, verified_copy
from ..urls import parse_url

_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_REV_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
HF_HOSTS = ("huggingface.co", "www.huggingface.co", "hf.co")


@dataclass(frozen=True)
class Source:
    scheme: str  # "hf" or "file"
    repo_id: str | None = None
    revision: str | None = None
    path: str | None = None

    def __str__(self) -> str:
        if self.scheme == "hf":
            return f"hf://{self.repo_id}" + (f"@{self.revision}" if self.revision else "")
        return f"file://{self.path}"


def parse_source(url: str, allowed_roots: Sequence[str], field: str = "source_url") -> Source:
    """Parse and check a model source; anything else (other schemes, paths outside the roots) is refused."""
    if not isinstance(url, str) or not url:
        raise InvalidRequest(f"{field}: a source URL is required", {"field": field})
    if url.startswith("hf://"):
        rest = url[5:]
        repo, _, at = rest.partition("@")
        return _hf(repo, at or None, url, field)
    if url.split(":", 1)[0].lower() in ("http", "https"):
        return _hf_url(url, field)
    parsed = urlparse(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise InvalidRequest(
                f"{field}: file URLs must be local (file:///path)", {"field": field, "value": url}
            )
        path = Path(unquote(parsed.path)).resolve()
        roots = [Path(r).resolve() for r in allowed_roots]
        if not any(path == r or r in path.parents for r in roots):
            allowed = ", ".join(map(str, roots)) or "none"
            raise InvalidRequest(
                f"{field}: {path} is not under an allowed root (models.allowed_roots: {allowed})",
                {"field": field, "value": url},
            )
        return Source("file", path=str(path))
    raise InvalidRequest(
        f"{field}: scheme of {url!r} is not allowed (hf://, https://huggingface.co/..., file:///...)",
        {"field": field, "value": url},
    )


def hub_origins() -> tuple[str, ...]:
    """The origins a repository URL may name: the hub's (https), and the configured HF_ENDPOINT's."""
    hub = tuple(f"https://{h}:443" for h in HF_HOSTS)
    endpoint = os.environ.get("HF_ENDPOINT")
    return (*hub, parse_url(endpoint, "HF_ENDPOINT").origin) if endpoint else hub


def _hf_url(url: str, field: str) -> Source:
    """`https://huggingface.co/org/repo[/tree/rev]` (or on the HF_ENDPOINT's host): names a repository, which the
    nodes download from the configured endpoint; the URL itself is never fetched."""
    parsed = parse_url(url, field)
    origins = hub_origins()
    if parsed.origin not in origins:
        shown = ", ".join(o.removesuffix(":443") for o in origins)
        raise InvalidRequest(
            f"{field}: {parsed.origin!r} is not the Hugging Face hub ({shown})",
            {"field": field, "value": url},
        )
    parts = [p for p in parsed.target.split("?", 1)[0].split("/") if p]
    if len(parts) < 2:
        raise InvalidRequest(f"{field}: {url!r} does not name a repository", {"field": field, "value": url})
    rev: str | None = None
    if len(parts) >= 4 and parts[2] in ("tree", "resolve"):
        rev = "/".join(parts[3:])
    return _hf(f"{parts[0]}/{parts[1]}", rev, url, field)


def _hf(repo: str, rev: str | None, url: str, field: str) -> Source:
    if not _REPO_RE.match(repo) or ".." in repo:
        raise InvalidRequest(
            f"{field}: {repo!r} is not a Hugging Face repository id", {"field": field, "value": url}
        )
    if rev is not None and (not _REV_RE.match(rev) or ".." in rev):
        raise InvalidRequest(f"{field}: {rev!r} is not a revision", {"field": field, "value": url})
    return Source("hf", repo_id=repo, revision=rev)


def _progress_tqdm(progress: Callable[[int], None]) -> Any:
    from tqdm.auto import tqdm

    class ProgressTqdm(tqdm):
        """Forwards byte counts of huggingface_hub's download bars to gswarm's progress."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self._bytes = kwargs.get("unit") == "B"

        def update(self, n: float | None = 1) -> bool | None:
            if self._bytes and n:
                progress(int(n))
            return None

    return ProgressTqdm


def _git_blob_sha1(path: Path) -> str:
    h = hashlib.sha1(usedforsecurity=False)
    h.update(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def download_hf(
    source: Source, dest: Path, progress: Callable[[int], None], on_total: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """Download a snapshot into `dest` with huggingface_hub, then check every file against the hub's tree.

    LFS files are checked by sha256, the others by their git blob id. Honors HF_ENDPOINT and HF_TOKEN.
    """
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    endpoint = os.environ.get("HF_ENDPOINT") or None
    token = os.environ.get("HF_TOKEN") or None
    assert source.repo_id is not None
    try:
        api = HfApi(endpoint=endpoint, token=token)
        info = api.repo_info(source.repo_id, revision=source.revision)
        commit = info.sha
        tree: dict[str, Any] = {
            f.path: f
            for f in api.list_repo_tree(source.repo_id, revision=commit, recursive=True)
            if hasattr(f, "size") and hasattr(f, "blob_id")
        }
        if on_total is not None:
            on_total(sum(int(f.size or 0) for f in tree.values()))
        # A private cache inside the staging directory: the shared one could satisfy files without a download.
        snapshot_download(
            source.repo_id,
            revision=commit,
            local_dir=str(dest),
            cache_dir=str(dest / ".cache" / "hub"),
            endpoint=endpoint,
            token=token,
            tqdm_class=_progress_tqdm(progress),
            max_workers=4,
        )
    except RepositoryNotFoundError as exc:
        raise NotFound(f"repository {source.repo_id} not found at {endpoint or 'huggingface.co'}") from exc
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        raise NetworkError(f"download of {source} failed: {type(exc).__name__}: {exc}"[:500]) from exc
    shutil.rmtree(dest / ".cache", ignore_errors=True)
    expected: dict[str, dict[str, Any]] = {}
    for rel, e in tree.items():
        lfs: Any = getattr(e, "lfs", None)
        expected[rel] = {"size": e.size, "sha256": lfs.sha256 if lfs else None, "git_sha1": e.blob_id}
    return {"repo_id": source.repo_id, "revision": source.revision, "commit": commit, "expected": expected}


def verify_against_hub(dest: Path, manifest: dict[str, Any], expected: dict[str, dict[str, Any]]) -> None:
    """Every file the hub lists is here with its size and hash: sha256 for LFS files, the git blob id otherwise."""
    have = {f["path"]: f for f in manifest["files"]}
    for rel, exp in expected.items():
        got = have.get(rel)
        if got is None:
            raise VerificationError(f"{rel}: listed by the hub but not downloaded", {"file": rel})
        if exp.get("size") is not None and got["size"] != exp["size"]:
            raise VerificationError(
                f"{rel}: size {got['size']} differs from the hub's {exp['size']}", {"file": rel}
            )
        if exp.get("sha256"):
            if got["sha256"] != exp["sha256"]:
                raise VerificationError(f"{rel}: sha256 differs from the hub's", {"file": rel})
        elif exp.get("git_sha1") and _git_blob_sha1(dest / rel) != exp["git_sha1"]:
            raise VerificationError(f"{rel}: git blob id differs from the hub's", {"file": rel})


def copy_local(
    source: Source, dest: Path, progress: Callable[[int], None], allowed_roots: Sequence[str]
) -> dict[str, Any]:
    """Copy a local directory (or one file) that lies under an allowed root: each file is checked as it is opened,
    so nothing outside the roots is read, whatever links the tree holds or gains meanwhile."""
    assert source.path is not None
    src = Path(source.path)
    roots = list(allowed_roots)
    if src.is_file():
        verified_copy(src, dest / src.name, None, progress, open_under(src, roots, "source_url"))
    elif src.is_dir():
        for rel, p in iter_files(src):
            verified_copy(p, dest / rel, None, progress, open_under(p, roots, "source_url"))
    else:
        raise NotFound(f"{src} does not exist on this node", {"path": str(src)})
    return {"path": str(src)}
