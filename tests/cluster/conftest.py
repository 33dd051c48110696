"""One compose cluster for the modules of tests/cluster (brought up once, taken down with its volumes at the end),
and the fault table printed at the end of the run and written to $GSWARM_CLUSTER_DIR/faults.txt.

The modules here run only under `make test-cluster` (GSWARM_CLUSTER_TEST=1): `make test` does not collect them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.compose import OUT, Cluster
from tests.cluster.faults import Ledger

collect_ignore_glob = [] if os.environ.get("GSWARM_CLUSTER_TEST") == "1" else ["test_*.py"]

LEDGER = Ledger()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    c.up()
    try:
        yield c
    finally:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "compose.log").write_text(c.logs(tail=2000))
        if os.environ.get("GSWARM_CLUSTER_KEEP") != "1":
            c.down()
        LEDGER.timings.update(c.timings)


@pytest.fixture(scope="session")
def ledger() -> Ledger:
    return LEDGER


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not LEDGER.rows and not LEDGER.timings:
        return
    text = LEDGER.table()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "faults.txt").write_text(text + "\n")
    terminalreporter.write_sep("=", f"cluster faults and timings ({OUT / 'faults.txt'})")
    terminalreporter.write_line(text)
