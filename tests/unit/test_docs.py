"""The docs say what the code does: the reference pages equal what scripts/docs_reference.py makes from the code now,
every setting, command, workflow action and route has text there, the README stays short with links that resolve,
and the site builds with --strict into pages that load nothing from another host."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
README_MAX_BYTES = 12_288
REGENERATE = "run `make docs` (scripts/docs_reference.py) and commit docs/reference"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "scripts" / "docs_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def openapi(script: ModuleType) -> tuple[dict[str, Any], dict[str, list[str]]]:
    return script.openapi_spec()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def generated(script: ModuleType, openapi: tuple[dict[str, Any], dict[str, list[str]]]) -> dict[str, str]:
    return script.pages(openapi)  # type: ignore[no-any-return]


def committed(name: str) -> str:
    path = REFERENCE / name
    assert path.is_file(), f"docs/reference/{name} is missing: {REGENERATE}"
    return path.read_text()


def test_the_committed_reference_is_what_the_code_makes_now(generated: dict[str, str]) -> None:
    stale = [name for name, text in generated.items() if committed(name) != text]
    assert stale == [], f"docs/reference/{', '.join(stale)} differ from the code: {REGENERATE}"


def test_every_setting_has_its_variable_key_default_and_meaning(
    script: ModuleType, generated: dict[str, str]
) -> None:
    from gswarm_tasks.settings import OPTIONS

    page = generated["settings.md"]
    rows = {line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("| `GSWARM_")}
    for opt in OPTIONS:
        assert opt.help.strip(), f"{opt.env} has no help text in gswarm_tasks/settings.py OPTIONS"
        row = rows.get(f"`{opt.env}`")
        assert row is not None, f"{opt.env} is not on the settings page"
        assert script.md(opt.help, table=True) in row, opt.env
        assert (f"`{opt.path}`" if opt.path else "| - |") in row, opt.env
    for name, text in script.OTHER_VARIABLES.items():
        assert text.strip() and f"`{name}`" in rows, name


def test_every_command_has_text(script: ModuleType, generated: dict[str, str]) -> None:
    page = generated["cli.md"]
    commands = script.cli_commands()
    assert len(commands) > 60, len(commands)
    for path, cmd, same in commands:
        assert (cmd.help or cmd.short_help or "").strip(), f"`{path}` has no help text"
        if same is not None:  # gsprof's `gswarm` commands: listed once, under gswarm
            assert f"### {same} {{" in page or same == "gswarm", path
            continue
        heading = f"## {path} {{" if " " not in path else f"### {path} {{"
        assert heading in page, f"`{path}` has no section on the commands page"
        section = page.split(heading, 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
        assert (
            script._help(cmd) in section and f"\n{script._usage(cmd, _context(script, path))}\n" in section
        ), path


def _context(script: ModuleType, path: str) -> Any:
    name = path.split()[0]
    root = dict(script.cli_programs())[name]
    return next(ctx for _, ctx in script.walk_commands(root, name) if ctx.command_path == path)


def test_every_workflow_action_has_its_fields_and_outputs(generated: dict[str, str]) -> None:
    from gswarm_web.workflows import actions

    page = generated["actions.md"]
    for kind in actions.AVAILABLE:
        row = next((line for line in page.splitlines() if line.startswith(f"| `{kind}` |")), None)
        assert row is not None, f"action type {kind} is not on the actions page"
        assert all(f"`{field}`" in row for field in actions.FIELDS[kind] | actions.OUTPUTS[kind]), kind


def test_every_route_has_text(
    script: ModuleType, openapi: tuple[dict[str, Any], dict[str, list[str]]], generated: dict[str, str]
) -> None:
    spec, methods = openapi
    page = generated["api.md"]
    operations = script.operations(spec)
    assert len(operations) > 60, len(operations)
    for method, path, op in operations:
        summary = " ".join((op.get("summary") or "").split())
        assert summary, f"{method} {path} has no summary (the view's docstring)"
        heading = f"### {method} {path} {{"
        assert heading in page, f"{method} {path} is not on the API page"
        assert script.md(summary) in page.split(heading, 1)[1].split("\n### ", 1)[0], f"{method} {path}"
    documented = {script.rule_path(p) for p in spec["paths"]} | set(spec["paths"])
    for rule in methods:
        if script.rule_path(rule) in documented:
            continue
        text = script.OTHER_ROUTES.get(rule, "")
        assert text.strip(), f"{rule} is served but neither in the OpenAPI document nor in OTHER_ROUTES"
        assert f"| `{rule}` |" in page and text in page, rule
    offline = committed("openapi.json")
    assert all(f'"{path}"' in offline for path in spec["paths"])


def test_the_readme_is_short_and_its_links_resolve() -> None:
    readme = ROOT / "README.md"
    assert readme.stat().st_size <= README_MAX_BYTES, f"README.md is {readme.stat().st_size} bytes"
    for doc in (readme, ROOT / "bench" / "README.md"):
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # a URL: not a file of this repository
            assert (doc.parent / target).exists(), (
                f"{doc.relative_to(ROOT)} links to {target}, which is missing"
            )


def test_the_site_builds_strict_and_loads_nothing_from_another_host(tmp_path: Path) -> None:
    site = tmp_path / "site"
    # not --quiet: mkdocs counts only the warnings it logs, so a quiet strict build passes with broken links
    mkdocs = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    env = {"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(sys.executable).parent)}
    built = subprocess.run(mkdocs, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    tag = r"""<(?:script|link|img|iframe|source)\b[^>]*\b(?:src|href)=["']?"""
    external = re.compile(rf"""(?:{tag}|url\(["']?|@import\s+["'])(?:https?:)?//""", re.IGNORECASE)
    loaded = []
    for path in site.rglob("*"):
        if path.suffix in (".html", ".css", ".js") and external.search(path.read_text(errors="replace")):
            loaded.append(str(path.relative_to(site)))
    assert loaded == [], f"these load something from another host: {loaded}"
    assert (site / "search" / "search_index.js").is_file()  # the offline plugin's search, usable from file://
