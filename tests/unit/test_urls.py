"""Outbound URLs: one parse decides and fetches; what two parsers could read differently is refused; the node
connects to the address it checked and follows no redirect. Real HTTP servers on 127.0.0.1 count what reaches them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gswarm_tasks.data.sources import fetch_into, parse_data_source
from gswarm_tasks.errors import InvalidRequest
from gswarm_tasks.models.sources import parse_source
from gswarm_tasks.settings import Settings
from gswarm_tasks.urls import Allow, fetch, parse_url, service_ref
from tests.harness.hostile import SSRF, Recorder


@pytest.fixture
def internal() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.close()


@pytest.mark.parametrize(
    ("url", "why"),
    [
        (SSRF.format(port=8000), "backslash"),
        ("http://user@allowed.example/x", "user information"),
        ("http://allowed.example:8000@127.0.0.1/x", "user information"),
        ("http://127.1/x", "canonical IPv4"),
        ("http://0x7f.0.0.1/x", "canonical IPv4"),
        ("http://2130706433/x", "canonical IPv4"),
        ("http://127.0.0.01/x", "canonical IPv4"),
        ("http://allowed.example /x", "space"),
        ("http://allowed.example/\x00", "control character"),
        ("http://allowed.example\t/x", "control character"),
        ("http://al%6cowed.example/x", "percent-encoded host"),
        ("http://xn--zz.example/x", "internationalized"),
        ("http://allowed..example/x", "not a domain name"),
        ("http://allowed.example:/x", "malformed host or port"),
        ("http://allowed.example:0/x", "port outside"),
        ("http://[fe80::1%25eth0]/x", "malformed"),
        ("http://allowed.example/%zz", "percent-encoded"),
        ("http://allowed.example/caf\u00e9", "percent-encoded"),
        ("ftp://allowed.example/x", "scheme"),
        ("//allowed.example/x", "scheme"),
    ],
)
def test_what_parsers_could_read_differently_is_refused(url: str, why: str) -> None:
    with pytest.raises(InvalidRequest, match=f"^source: .*{why}") as exc:
        parse_url(url, "source")
    assert exc.value.details["field"] == "source"


def test_one_canonical_form() -> None:
    u = parse_url("HTTP://B\u00fccher.Example:8080/a/./b/../c?q=../x#frag", "u")
    assert (u.scheme, u.host, u.port, u.target) == ("http", "xn--bcher-kva.example", 8080, "/a/c?q=../x")
    assert str(u) == "http://xn--bcher-kva.example:8080/a/c?q=../x"
    assert u.origin == "http://xn--bcher-kva.example:8080"
    v6 = parse_url("http://[::1]/x", "u")
    assert (v6.host, v6.port, v6.authority, v6.origin) == ("::1", 80, "[::1]", "http://[::1]:80")
    assert parse_url("http://svc:9000", "u").join("/v1/embeddings").target == "/v1/embeddings"
    assert service_ref("${serve.service_url}/health") == ("serve", "/health")
    assert service_ref("${serve.output.service_url}") == ("serve", "")
    assert service_ref("http://x/${serve.service_url}") is None


def test_allowlists_name_hosts_ports_addresses_and_networks() -> None:
    allow = Allow.of(
        ["allowed.example", "127.0.0.1:8000", "10.0.0.0/8", "[fd00::1]:9000"], "data.allowed_hosts"
    )
    ok = [
        "http://allowed.example/x",
        "https://allowed.example:4443/",
        "http://127.0.0.1:8000/",
        "http://10.9.8.7/",
    ]
    ok += ["http://[fd00::1]:9000/"]
    for url in ok:
        assert allow.permits(parse_url(url)), url
    bad = ["http://127.0.0.1:8001/", "http://evil.example/", "http://allowed.example.evil.example/"]
    bad += ["http://11.0.0.1/", "http://[fd00::1]:9001/", "http://[::ffff:127.0.0.1]:8000/"]
    for url in bad:
        assert not allow.permits(parse_url(url)), url
    with pytest.raises(InvalidRequest, match="not in data.allowed_hosts"):
        allow.check(parse_url("http://169.254.169.254/latest/meta-data", "source"), "source")


def test_the_ssrf_url_reaches_nothing_at_submission_or_on_the_node(
    internal: Recorder, tmp_path: Path
) -> None:
    s = Settings(home=str(tmp_path), data_allowed_hosts=("allowed.example",))
    url = SSRF.format(port=internal.port)
    with pytest.raises(InvalidRequest, match="^source: .*backslash"):
        parse_data_source(url, s)  # what the control plane checks at submission
    with pytest.raises(InvalidRequest, match="^source: .*backslash"):
        fetch_into(url, tmp_path / "out", s)  # what a node does when handed the URL directly
    assert not (tmp_path / "out").exists()
    assert internal.hits == []


def test_a_redirect_to_another_host_is_not_followed(internal: Recorder, tmp_path: Path) -> None:
    front = Recorder(target=f"http://127.0.0.1:{internal.port}/secret")
    try:
        s = Settings(home=str(tmp_path), data_allowed_hosts=(f"127.0.0.1:{front.port}",))
        with pytest.raises(InvalidRequest, match="^source: .* answered 302, a redirect .* not followed"):
            fetch_into(f"http://127.0.0.1:{front.port}/redirect", tmp_path / "out", s)
        assert front.hits == [("/redirect", f"127.0.0.1:{front.port}")]
        assert internal.hits == []
    finally:
        front.close()


def test_a_name_resolving_to_a_private_address_needs_that_address_listed(
    internal: Recorder, tmp_path: Path
) -> None:
    url = f"http://localhost:{internal.port}/a/../data.bin"
    with pytest.raises(
        InvalidRequest, match="^source: .* resolves to 127.0.0.1, a private address not named"
    ):
        fetch_into(url, tmp_path / "out", Settings(home=str(tmp_path), data_allowed_hosts=("localhost",)))
    assert internal.hits == []
    s = Settings(home=str(tmp_path), data_allowed_hosts=("localhost", "127.0.0.0/8"))
    fetch_into(url, tmp_path / "out", s)
    assert (tmp_path / "out").read_bytes() == b"hello"
    # The connection went to the address that was checked; the server saw the URL's own host and the parsed path.
    assert internal.hits == [("/data.bin", f"localhost:{internal.port}")]


def test_fetch_refuses_an_address_the_list_does_not_name(internal: Recorder) -> None:
    url = parse_url(f"http://127.0.0.1:{internal.port}/x", "target_url")
    with pytest.raises(InvalidRequest, match="^target_url: host .* not in workflows.allowed_hosts"):
        with fetch(url, Allow.of([], "workflows.allowed_hosts"), "target_url"):
            pass
    with fetch(url, Allow.of([], "workflows.allowed_hosts", [url.origin]), "target_url") as r:
        assert r.status == 200
    assert internal.hits == [("/x", f"127.0.0.1:{internal.port}")]


def test_hugging_face_urls_name_the_hub_or_the_configured_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:5555")
    assert parse_source("http://127.0.0.1:5555/org/repo", []).repo_id == "org/repo"
    assert parse_source("https://huggingface.co/org/repo", []).repo_id == "org/repo"
    for bad in ("http://127.0.0.1:5556/org/repo", "https://huggingface.co\\@127.0.0.1/org/repo"):
        with pytest.raises(InvalidRequest, match="^source_url: "):
            parse_source(bad, [])


def test_a_node_refuses_a_health_check_or_inference_nobody_allowed(
    internal: Recorder, tmp_path: Path
) -> None:
    """What the node does when a step reaches it with a URL (handed directly, or a spec edited in Redis)."""
    from types import SimpleNamespace

    from gswarm_tasks.data.compute import run_inference
    from gswarm_tasks.workflows.actions import _health_check

    task: Any = SimpleNamespace(app=SimpleNamespace(gswarm_settings=Settings(home=str(tmp_path))))
    here = f"http://127.0.0.1:{internal.port}"
    spec = {"params": {"target_url": f"{here}/health"}}
    with pytest.raises(InvalidRequest, match="^target_url: host .* not in workflows.allowed_hosts"):
        _health_check(task, spec, {"target_url": f"{here}/health"}, None)
    with pytest.raises(InvalidRequest, match="^service_url: host .* not in workflows.allowed_hosts"):
        run_inference(
            here, "/v1/embeddings", None, b"text", "c", allow=Allow.of([], "workflows.allowed_hosts")
        )
    assert internal.hits == []
    # The origin the control plane allowed at submission, or the service a serve step of the workflow started.
    allowed = {"params": {"target_url": f"{here}/health"}, "allowed_origins": [parse_url(here).origin]}
    assert _health_check(task, allowed, {"target_url": f"{here}/health"}, None)["status_code"] == 200
    started = {"params": {"target_url": "${serve.service_url}/ready"}}
    out = _health_check(task, started, {"target_url": f"{here}/ready"}, {"serve": {"service_url": here}})
    assert out["status_code"] == 200
    assert [path for path, _ in internal.hits] == ["/health", "/ready"]
