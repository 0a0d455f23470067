"""The web chat page at `/` (as llama-server has): static files from server/webui/, served by this app with
no build step, under a strict Content-Security-Policy — scripts, styles and connections only from this
server, no inline script or style, nothing fetched from elsewhere. The libraries in webui/vendor/ come from
npm at pinned versions with their licenses (vendor/manifest.json; tools/dev/fetch_webui_vendor.sh).

The page and its files are public (they hold no secret); every API call the page makes carries the key
the user typed, kept in the tab's sessionStorage, so `--api-key` protects what it always did."""

from __future__ import annotations

from pathlib import Path

from sanic import Blueprint, response

from .errors import ApiError

blueprint = Blueprint("webui")

WEBUI_DIR = Path(__file__).parent / "webui"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
}
CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def is_public(path: str) -> bool:
    return path == "/" or path.startswith("/webui/")


def _file(path: Path):
    return response.raw(path.read_bytes(), content_type=CONTENT_TYPES[path.suffix], headers=dict(SECURITY_HEADERS))


@blueprint.get("/")
async def index(request):
    return _file(WEBUI_DIR / "index.html")


@blueprint.get("/webui/<name:path>")
async def asset(request, name: str):
    path = (WEBUI_DIR / name).resolve()
    if not path.is_relative_to(WEBUI_DIR.resolve()) or not path.is_file() or path.suffix not in CONTENT_TYPES:
        raise ApiError(404, f"no web page file {name!r}")
    return _file(path)
