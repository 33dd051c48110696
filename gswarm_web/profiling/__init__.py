"""Profiling data as files and pictures, pure Python shared by the API, the control worker and the CLI: a session's
export document (export.py), the original gswarm profiler's file layout both ways (original.py), and the plots
(plots.py)."""
