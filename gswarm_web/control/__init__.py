"""The control plane's bookkeeping: dispatch (sending operations), the intake of node reports, and the state of
each resource (nodes, models, services, chunks, operations, profiling sessions). Only the control worker and the
API's requests run this code; node workers never do.
"""
