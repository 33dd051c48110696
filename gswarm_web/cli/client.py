"""A small HTTP client for the CLI: bearer token, JSON, and the server's error message on failure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import requests

from gswarm_tasks.errors import ApiError, NetworkError
from gswarm_tasks.settings import Settings


class ApiClient:
    def __init__(self, base_url: str, token: str | None, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        self.timeout = timeout

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiClient:
        """The API GSWARM_API_URL (cluster.api_url) names, else that of the gswarm running under GSWARM_HOME (its
        ports as it was started with them), else cluster.host and cluster.http_port."""
        from .local import running_api

        url = settings.api_url or running_api(Path(settings.home)) or settings.effective_api_url
        return cls(url, settings.read_token())

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        url = f"{self.base_url}/api/v1/{path.lstrip('/')}"
        kwargs.setdefault("timeout", self.timeout)
        try:
            resp = self.session.request(method, url, **kwargs)
        except requests.RequestException as exc:
            raise NetworkError(
                f"cannot reach the gswarm API at {self.base_url}: {type(exc).__name__}"
            ) from exc
        if resp.status_code == 204:
            return None
        try:
            body = resp.json()
        except ValueError:
            body = {}
        if resp.status_code >= 400 and not (
            path.startswith("health") and isinstance(body, dict) and "status" in body
        ):
            raise ApiError(resp.status_code, body if isinstance(body, dict) else {})
        return body

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, json: Any = None) -> Any:
        return self.request("POST", path, json=json)

    def delete(self, path: str, **params: Any) -> Any:
        return self.request("DELETE", path, params=params)

    def stream(self, path: str, headers: dict[str, str] | None = None, **params: Any) -> requests.Response:
        """A GET whose body is bytes, streamed: the caller reads `iter_content` and closes the response (use it
        in a `with`). Errors raise as in `request`."""
        try:
            resp = self.session.get(
                f"{self.base_url}/api/v1/{path.lstrip('/')}",
                params={k: v for k, v in params.items() if v is not None},
                headers=headers,
                stream=True,
                timeout=self.timeout,
            )
        except requests.RequestException as exc:
            raise NetworkError(
                f"cannot reach the gswarm API at {self.base_url}: {type(exc).__name__}"
            ) from exc
        if resp.status_code >= 400:
            try:
                body = resp.json()
            except ValueError:
                body = {}
            finally:
                resp.close()
            raise ApiError(resp.status_code, body if isinstance(body, dict) else {})
        return resp
