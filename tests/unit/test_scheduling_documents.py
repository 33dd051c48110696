"""The scheduler's file reader: JSON and YAML read as `yaml.safe_load` reads them, without what YAML adds to JSON
that nobody needs in a trace (aliases, anchors, merge keys, other tags, several documents), and fast."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest
import yaml

from gswarm_tasks.errors import InvalidRequest
from gswarm_web.scheduling.documents import MAX_DEPTH, read_document
from gswarm_web.scheduling.generator import bench_config, generate

SCALARS = """\
plain: text
quoted: '3.5'
double: "yes"
int: 42
negative: -7
octal: 0o17
old_octal: 017
hex: 0x1F
float: 3.131
exp: 1e3
sign: +2.5
inf: .inf
nan_text: '.nan'
bools: [yes, No, true, FALSE, on, off]
nulls: [~, null, Null]
empty:
stamp: 2025-01-01T00:00:00.5+00:00
date: 2025-01-01
stamp_text: '2025-01-01T00:00:00Z'
folded: >
  two
  lines
literal: |
  kept
explicit: !!str 12
explicit_float: !!float 1
nonspecific: ! 12
nested: {a: [1, {b: c}], d: []}
unicode: "caf\\u00e9"
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_yaml_scalars_mean_what_safe_load_says(tmp_path: Path) -> None:
    got = read_document(write(tmp_path, "s.yaml", SCALARS))
    assert got == yaml.safe_load(SCALARS)
    assert isinstance(got["stamp"], dt.datetime) and isinstance(got["date"], dt.date)
    assert got["quoted"] == "3.5" and got["explicit"] == "12" and got["explicit_float"] == 1.0
    assert [type(v) for v in got["bools"]] == [bool] * 6 and got["nulls"] == [None, None, None]


def test_a_generated_trace_reads_the_same_as_yaml_and_as_json(tmp_path: Path) -> None:
    trace = generate(bench_config(), requests=300, gpus=8, utilization=0.7, seed=4)
    as_yaml = write(tmp_path, "t.yaml", yaml.safe_dump(trace, sort_keys=False))
    as_json = write(tmp_path, "t.json", json.dumps(trace))
    assert read_document(as_yaml) == yaml.safe_load(as_yaml.read_text()) == trace
    assert read_document(as_json) == trace
    # JSON under a YAML name is JSON too, and flow-style YAML that is not JSON still reads as YAML
    assert read_document(write(tmp_path, "j.yaml", json.dumps(trace))) == trace
    assert read_document(write(tmp_path, "f.yaml", "{a: 1, b: [x, 'y']}")) == {"a": 1, "b": ["x", "y"]}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("a: &x [1]\nb: *x\n", "anchors (&x)"),
        ("a: *x\n", "alias"),
        ("base: {a: 1}\nc:\n  <<: {a: 2}\n", "merge keys"),
        ("a: !!binary aGk=\n", "tag:yaml.org,2002:binary"),
        ("a: !!set {x}\n", "tag:yaml.org,2002:set"),
        ("a: !custom 1\n", "!custom"),
        ("a: 1\n---\nb: 2\n", "one document only"),
        ("[1, 2]: x\n", "mapping keys must be strings"),
        ("a: [1, 2\n", "cannot be parsed"),
        ("a:\n" + "".join("  " * i + "- \n" for i in range(MAX_DEPTH + 1)), f"deeper than {MAX_DEPTH}"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_what_a_trace_never_needs_is_refused_naming_the_file(tmp_path: Path, text: str, says: str) -> None:
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(InvalidRequest) as err:
        read_document(path)
    assert says in err.value.message and str(path) in err.value.message
    assert err.value.details["field"] == str(path)


def test_bad_json_in_a_json_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="cannot be parsed"):
        read_document(write(tmp_path, "bad.json", "{'a': 1}"))


def test_a_file_that_is_not_text_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InvalidRequest, match="cannot be read"):
        read_document(path)


def test_a_large_trace_reads_faster_than_the_c_loader(tmp_path: Path) -> None:
    """The reason this reader exists: 2,000 requests (about 500 KB) against yaml.CSafeLoader on the same file."""
    trace = generate(bench_config(), requests=2000, gpus=8, utilization=0.7, seed=4)
    path = write(tmp_path, "big.yaml", yaml.safe_dump(trace, sort_keys=False))
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    t0 = time.perf_counter()
    ours = read_document(path)
    t1 = time.perf_counter()
    theirs = yaml.load(path.read_text(), Loader=loader)  # noqa: S506 (the C safe loader)
    t2 = time.perf_counter()
    assert ours == theirs
    assert t1 - t0 < t2 - t1, (t1 - t0, t2 - t1)
