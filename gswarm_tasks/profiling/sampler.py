"""The node's sampler: GPUs (through nvml.py) and host metrics at the asked frequency, into a Redis stream.

It runs on its own thread in the node worker's main process, so a long task never delays a frame. The
period is the shortest among active sessions that include this node (default: `profiling.default_frequency`);
a session's start or stop is published on a channel, so the new rate begins at once, not a default period later.
Frames go out pipelined, each with the stream id of its sample time on Redis' clock. While Redis is unreachable
they go to the spill file (`spill.py`), which outlives the worker and is replayed, in order, once Redis answers;
without one they wait in a bounded buffer. A frame lost to a bound is counted, never silently.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from typing import Any

import psutil
import redis

from .. import names
from .nvml import GpuSource, default_source
from .spill import FrameSpill

log = logging.getLogger(__name__)

MIN_PERIOD_S = 0.1
SESSIONS_CHECK_S = 0.1


class HostCounters:
    """CPU, DRAM, disk and network; throughputs are deltas between two readings, in bytes/s."""

    def __init__(self) -> None:
        self.last: tuple[float, Any, Any] | None = None
        psutil.cpu_percent(interval=None)

    def read(self) -> dict[str, Any]:
        now = time.monotonic()
        disk, net = psutil.disk_io_counters(), psutil.net_io_counters()
        vm = psutil.virtual_memory()
        out: dict[str, Any] = {
            "cpu_percent": psutil.cpu_percent(interval=None),
            "dram_used_bytes": vm.used,
            "dram_percent": vm.percent,
        }
        if self.last is not None and disk is not None and net is not None:
            t0, d0, n0 = self.last
            dt = max(1e-6, now - t0)
            out.update(
                disk_read_bytes_per_s=round((disk.read_bytes - d0.read_bytes) / dt),
                disk_write_bytes_per_s=round((disk.write_bytes - d0.write_bytes) / dt),
                net_rx_bytes_per_s=round((net.bytes_recv - n0.bytes_recv) / dt),
                net_tx_bytes_per_s=round((net.bytes_sent - n0.bytes_sent) / dt),
            )
        self.last = (now, disk, net)
        return out


class Sampler:
    def __init__(
        self,
        client: redis.Redis,
        node: str,
        default_period_s: float,
        source: GpuSource | None = None,
        buffer_size: int = 10_000,
        bandwidth: bool = True,
        nvlink: bool = False,
        spill: FrameSpill | None = None,
        maxlen: int = names.FRAMES_MAXLEN,
    ) -> None:
        self.client = client
        self.maxlen = max(1, maxlen)  # profiling.stream_max_frames
        self.spill = spill
        # Redis' clock minus ours, measured with every flush; a worker that starts while Redis is down goes on
        # with what its predecessor measured.
        self.skew_s = (spill.last_skew() if spill is not None else None) or 0.0
        self._last_ms = 0
        self.node = node
        self.default_period_s = max(MIN_PERIOD_S, default_period_s)
        self.source = source or default_source()
        self.buffer: collections.deque[dict[str, Any]] = collections.deque(maxlen=buffer_size)
        self.bandwidth, self.nvlink = bandwidth, nvlink
        self.period_s = self.default_period_s
        self.host = HostCounters()
        self.seq = 0
        self.dropped = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self._next_sessions_check = 0.0
        self._wake = threading.Event()
        self._kick = threading.Event()
        self._flush_lock = threading.Lock()
        self.listening = threading.Event()  # set while subscribed to the sessions' announcements
        self._sessions_lock = (
            threading.Lock()
        )  # one read-and-set of the sessions at a time (two threads follow)

    def frame(self) -> dict[str, Any]:
        self.seq += 1
        return {
            "node": self.node,
            "seq": self.seq,
            "time": time.time(),
            "gpus": self.source.sample(self.bandwidth, self.nvlink),
            "host": self.host.read(),
        }

    def _listen_loop(self) -> None:
        """Follow the sessions as soon as the control plane publishes a change (reconnecting while Redis is down)."""
        while not self._stop.is_set():
            pubsub = self.client.pubsub()
            try:
                pubsub.subscribe(names.channel(names.PROFILER_SESSIONS_CHANNEL, self.client))
                # Redis confirms the subscription: from then on no announcement is missed
                while not self._stop.is_set():
                    confirmed = pubsub.get_message(timeout=1.0)
                    if confirmed is not None and confirmed["type"] == "subscribe":
                        break
                self._follow_sessions()  # what changed before the subscription
                self.listening.set()
                while not self._stop.is_set():
                    told = pubsub.get_message(timeout=1.0)
                    if told is not None and told["type"] == "message":
                        self._follow_sessions()
            except (redis.RedisError, OSError):
                self.listening.clear()
                self._stop.wait(0.5)
            finally:
                pubsub.close()

    def _follow_sessions(self) -> None:
        """Shortest period among active sessions that include this node; bandwidth/NVLink as they ask. The read and
        the set are one step: a slower, older read by the other thread must not undo a newer one."""
        with self._sessions_lock:
            raw: dict[bytes, bytes] = self.client.hgetall(names.PROFILER_SESSIONS_KEY)  # type: ignore[assignment]
            period, bw, nv = self.default_period_s, self.bandwidth, self.nvlink
            for value in raw.values():
                try:
                    s = json.loads(value)
                except ValueError:
                    continue
                if s.get("nodes") and self.node not in s["nodes"]:
                    continue
                period = min(period, max(MIN_PERIOD_S, float(s.get("freq_ms", 1000)) / 1000))
                bw = bw or bool(s.get("enable_bandwidth"))
                nv = nv or bool(s.get("enable_nvlink"))
            if period != self.period_s:
                self._kick.set()  # a new rate starts now, not after the old period runs out
            self.period_s, self.bandwidth, self.nvlink = period, bw, nv

    def flush(self) -> bool:
        """Send buffered frames in order; on failure keep them (the oldest go first when the buffer is full)."""
        with self._flush_lock:
            return self._flush()

    @property
    def frames_dropped(self) -> int:
        """Frames lost to a bound (the buffer's, or the spill file's), since the spill file began counting."""
        return self.dropped + (self.spill.dropped if self.spill is not None else 0)

    def _id(self, frame: dict[str, Any]) -> str:
        ms = max(int((float(frame["time"]) + self.skew_s) * 1000), self._last_ms + 1)
        self._last_ms = ms
        return f"{ms}-0"

    def _send(self, frames: list[dict[str, Any]]) -> None:
        stream = names.frames_stream(self.node)
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        for f in frames:
            pipe.xadd(stream, {"data": json.dumps(f)}, id=self._id(f), maxlen=self.maxlen, approximate=True)
        sent_at = time.time()
        results = pipe.execute(raise_on_error=False)
        for r in results:
            if isinstance(r, redis.ConnectionError | redis.TimeoutError):
                raise r
        seconds, micros = results[0]
        self.skew_s = seconds + micros / 1e6 - sent_at
        refused = [f for f, r in zip(frames, results[1:], strict=True) if isinstance(r, Exception)]
        if refused:  # ids below the stream's last one (the clock moved back): these take Redis' own ids
            pipe = self.client.pipeline(transaction=False)
            for f in refused:
                pipe.xadd(stream, {"data": json.dumps(f)}, maxlen=self.maxlen, approximate=True)
            pipe.execute()

    def _flush(self) -> bool:
        frames = list(self.buffer)
        try:
            if self.spill is not None and self.spill.pending():
                self.spill.replay(self.client, self.node)  # older than anything buffered: it goes first
            if frames:
                self._send(frames)
        except redis.RedisError as exc:
            if not self._failing:
                log.warning("frames of %s wait until Redis answers: %s", self.node, exc)
            self._failing = True
            if self.spill is not None and frames:  # on disk, they outlive this worker
                self.spill.append(frames, self.skew_s)
                for _ in frames:
                    self.buffer.popleft()
            return False
        for _ in frames:  # the sampler only appends, so the first len(frames) are the ones sent
            self.buffer.popleft()
        if self._failing:
            log.info("Redis is back: the frames of %s that waited are sent", self.node)
        self._failing = False
        return True

    def step(self) -> None:
        """Take one frame into the buffer (never touches Redis: a dead broker must not slow sampling)."""
        if len(self.buffer) == self.buffer.maxlen:
            self.dropped += 1
        self.buffer.append(self.frame())
        self._wake.set()

    def sync(self) -> None:
        """Send what is buffered, and once a second learn which sessions want what."""
        if self.flush() and time.monotonic() >= self._next_sessions_check:
            try:
                self._follow_sessions()
            except redis.RedisError:
                pass
            self._next_sessions_check = time.monotonic() + SESSIONS_CHECK_S

    def _sync_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                self.sync()
            except Exception as exc:
                log.warning("sending frames of %s failed: %s", self.node, exc)
            if self._failing:
                self._stop.wait(0.5)  # Redis is down: retry twice a second, not on every frame

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # a bad reading must not end sampling
                log.warning("sampling on %s failed: %s", self.node, exc)
            next_at += self.period_s
            delay = next_at - time.monotonic()
            if delay < -self.period_s:  # fell far behind (host stalled): do not burst to catch up
                next_at, delay = time.monotonic(), 0
            if self._kick.wait(max(0.0, delay)):
                self._kick.clear()
                next_at = time.monotonic()

    def start(self) -> None:
        try:
            self._follow_sessions()
        except redis.RedisError:
            pass
        self._thread = threading.Thread(target=self._run, name=f"gswarm-sampler-{self.node}", daemon=True)
        self._thread.start()
        self._sync = threading.Thread(target=self._sync_loop, name=f"gswarm-frames-{self.node}", daemon=True)
        self._sync.start()
        self._listen = threading.Thread(
            target=self._listen_loop, name=f"gswarm-sessions-{self.node}", daemon=True
        )
        self._listen.start()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        self._wake.set()
        for t in (self._thread, getattr(self, "_sync", None), getattr(self, "_listen", None)):
            if t is not None:
                t.join(timeout=2)
        self.flush()
