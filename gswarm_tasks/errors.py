"""The exception hierarchy shared by node tasks, control tasks and the API."""

from __future__ import annotations

from typing import Any


class GswarmError(Exception):
    """Base error: a stable code, an HTTP status and JSON details."""

    code = "INTERNAL"
    status = 500

    def __init__(self, message: str, details: dict[str, Any] | None = None, *, code: str | None = None) -> None:
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
