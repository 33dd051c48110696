"""Profiling sessions: their state, the frames consumer and archiver, the archive, a session's window of frames,
imports of the original's data, recovery after a stop, and the Prometheus text of the fleet's frames."""
