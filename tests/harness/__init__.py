"""What the tests and the benchmarks run gswarm with: whole fleets (fleet.py) and `gswarm up` (local_up.py), their
processes (procs.py), the services they reach (services.py, worker_redis.py), a local Hugging Face endpoint
(hfserver.py), the NVML mock (nvml_mock/), hostile inputs, the original gswarm's files, small models.

Nothing here is collected as a test. Keep this file free of imports: tests/cluster/hub.py loads hfserver.py from here
inside a container that has none of the test dependencies."""
