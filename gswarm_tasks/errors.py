"""Every exception class of gswarm, and the one error shape every HTTP answer and task report uses."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


class GswarmError(Exception):
    """Base error: a stable code, an HTTP status and JSON details."""

    code = "INTERNAL"
    status = 500

    def __init__(
        self, message: str, details: dict[str, Any] | None = None, *, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}
        if code is not None:
            self.code = code

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


class InvalidRequest(GswarmError):
    code = "INVALID_REQUEST"
    status = 422


class NotFound(GswarmError):
    code = "NOT_FOUND"
    status = 404


class ModelNotFound(NotFound):
    code = "MODEL_NOT_FOUND"


class Conflict(GswarmError):
    code = "CONFLICT"
    status = 409


class ResourceUnavailable(GswarmError):
    code = "RESOURCE_UNAVAILABLE"
    status = 409


class TaskFailed(GswarmError):
    code = "TASK_FAILED"
    status = 500


class DependencyFailed(GswarmError):
    code = "DEPENDENCY_FAILED"
    status = 424


class NetworkError(GswarmError):
    code = "NETWORK_ERROR"
    status = 502


class Unauthorized(GswarmError):
    code = "UNAUTHORIZED"
    status = 401


class Forbidden(GswarmError):
    code = "FORBIDDEN"
    status = 403


class ConfigError(GswarmError):
    """A setting is missing or malformed; raised at start-up, never mid-request."""

    code = "INVALID_REQUEST"
    status = 500


class RedeliveryLimitExceeded(TaskFailed):
    """A task message came back more often than the redelivery cap allows."""


class ApiError(GswarmError):
    """An error a gswarm server answered with (seen by a client: the CLI); carries its code, status and request id."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        err: dict[str, Any] = body["error"] if isinstance(body.get("error"), dict) else {}
        super().__init__(str(err.get("message") or f"HTTP {status}"), err.get("details") or {})
        self.code = str(err.get("code") or "INTERNAL")
        self.status = status
        self.request_id = err.get("request_id")


class VerificationError(TaskFailed):
    """A file's size or checksum does not match its manifest: the bytes are wrong, retrying will not help."""


class Cancelled(Exception):
    """A workflow step was cancelled while it waited or ran."""


class LeaseBusy(Exception):
    """Another step holds a device this one needs (only when not waiting for it)."""


ERROR_CODES = (
    "INVALID_REQUEST",
    "MODEL_NOT_FOUND",
    "NOT_FOUND",
    "CONFLICT",
    "RESOURCE_UNAVAILABLE",
    "TASK_FAILED",
    "DEPENDENCY_FAILED",
    "NETWORK_ERROR",
    "UNAUTHORIZED",
    "FORBIDDEN",
    "INTERNAL",
)


def error_dict(exc: BaseException) -> dict[str, Any]:
    """`{code, message, details}` of any exception, as a task reports it."""
    if isinstance(exc, GswarmError):
        return exc.to_dict()
    return {"code": "TASK_FAILED", "message": f"{type(exc).__name__}: {exc}"[:1000], "details": {}}


def error_body(code: str, message: str, details: dict[str, Any] | None, request_id: str) -> dict[str, Any]:
    """The body of every error response: `{"error": {code, message, details, timestamp, request_id}}`."""
    return {
        "error": {
            "code": code,
            "message": message,
            "details": details or {},
            "timestamp": datetime.now(UTC).isoformat(),
            "request_id": request_id,
        }
    }
