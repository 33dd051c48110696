"""Default constants; settings.py reads these when neither config nor environment says otherwise."""

from __future__ import annotations

API_HOST = "127.0.0.1"
API_PORT = 8091
REDIS_URL = "redis://127.0.0.1:6379/0"
HEARTBEAT_INTERVAL_S = 5.0
HEARTBEAT_TIMEOUT_S = 30.0
OFFLINE_AFTER_S = 120.0
TASK_TIMEOUT_S = 3600
VISIBILITY_TIMEOUT_S = 12 * 3600
RETRY_COUNT = 3
TASK_EVENTS = False
MAX_CONCURRENT_TASKS = 4
PROFILING_FREQUENCY_MS = 1000
DATA_INLINE_MAX_BYTES = 64 * 1024
DATA_BATCH_MAX_COUNT = 1000
