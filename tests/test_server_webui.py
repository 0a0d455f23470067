"""The web chat page's files as the server serves them (the page itself runs in a real browser in
tests/test_webui_browser.py, marked `browser`): types, the strict Content-Security-Policy, nothing loaded
from outside the server, no path escape, and every vendored library with its license and pinned version."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from ember.server.webui import WEBUI_DIR

VENDOR = WEBUI_DIR / "vendor"
FETCH_SCRIPT = Path(__file__).parents[1] / "tools" / "dev" / "fetch_webui_vendor.sh"


def referenced_files(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"]+)"', html)


def test_index_and_every_file_it_loads_are_served_with_types_and_csp(server):
    index = httpx.get(server.url + "/", timeout=30)
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    csp = index.headers["content-security-policy"]
    for directive in ("default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'"):
        assert directive in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert index.headers["x-content-type-options"] == "nosniff"
    files = referenced_files(index.text)
    assert len(files) == 9  # the icon, 2 stylesheets, 6 scripts
    assert "<script>" not in index.text and " style=" not in index.text  # nothing inline (CSP forbids it)
    for url in files:
        assert url.startswith("/webui/"), url  # nothing from outside the server
        reply = httpx.get(server.url + url, timeout=30)
        assert reply.status_code == 200, url
        want = {"js": "text/javascript", "css": "text/css", "svg": "image/svg+xml"}[url.rsplit(".", 1)[1]]
        assert reply.headers["content-type"].startswith(want), url
        assert reply.headers["content-security-policy"] == csp
        assert reply.content == (WEBUI_DIR / url.removeprefix("/webui/")).read_bytes()


@pytest.mark.parametrize("path", ["/webui/../service.py", "/webui/%2e%2e/service.py", "/webui/nope.js", "/webui/"])
def test_nothing_outside_the_page_is_served(server, path):
    assert httpx.get(server.url + path, timeout=30).status_code == 404


def test_page_scripts_reach_only_this_server():
    for script in WEBUI_DIR.glob("*.js"):
        text = script.read_text()
        assert not re.search(r"https?://", text), script.name
        assert "innerHTML = sanitize(" in text or "innerHTML" not in text, script.name  # only sanitized HTML


def test_every_vendored_library_has_its_license_and_pinned_version():
    manifest = json.loads((VENDOR / "manifest.json").read_text())
    script = FETCH_SCRIPT.read_text()
    names = {entry["name"] for entry in manifest}
    assert names == {"marked", "dompurify", "highlight"}
    for entry in manifest:
        folder = VENDOR / entry["name"]
        assert re.fullmatch(r"\d+\.\d+\.\d+", entry["version"]), entry
        assert f'"{entry["package"]}@{entry["version"]} {entry["name"]} ' in script  # the script re-fetches it
        assert entry["integrity"].startswith("sha512-")
        assert "LICENSE" in entry["files"] and (folder / "LICENSE").stat().st_size > 500
        assert sorted(entry["files"]) == sorted(p.name for p in folder.iterdir())
    assert (
        (VENDOR / "marked" / "marked.umd.js").read_text().startswith(f"/**\n * marked v{_version(manifest, 'marked')}")
    )
    assert f"DOMPurify {_version(manifest, 'dompurify')}" in (VENDOR / "dompurify" / "purify.min.js").read_text()
    highlight = (VENDOR / "highlight" / "highlight.min.js").read_text()
    assert f"Highlight.js v{_version(manifest, 'highlight')}" in highlight
    assert sorted(p.name for p in VENDOR.iterdir()) == ["dompurify", "highlight", "manifest.json", "marked"]


def _version(manifest, name: str) -> str:
    return next(entry["version"] for entry in manifest if entry["name"] == name)
