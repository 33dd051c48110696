"""The data pool's bookkeeping: chunk commands (create, copy, move, delete, pins), chunk state, the collector."""
