"""The web console: ``GET /console`` serves a single page from the static files of this package.

Role: a browser face on the broker for the people who run it. The page (``static/``: HTML, CSS
and JavaScript modules, no build step and no third-party code) calls the same public REST,
admin and WebSocket APIs a user would, with the user's token; this module only serves files.

Invariants:
- Only the files under ``static/`` are served, read once when the router is built and looked up
  by exact relative path (nothing a request names reaches the file system); at most
  ``CONSOLE_FILES_MAX`` files of at most ``CONSOLE_FILE_BYTES_MAX`` bytes each.
- The files are public, also with token authentication on: they hold no data; every call the
  page makes is authenticated and authorized like any other.
- Every answer carries a strict Content-Security-Policy (scripts, styles and connections only
  to this broker; no inline script, no framing), ``nosniff`` and an ETag; a browser revalidates
  (``no-cache``) so an upgraded broker never runs an old page.
"""

from __future__ import annotations

import hashlib
import mimetypes
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, Request, Response

from api.limits import CONSOLE_FILE_BYTES_MAX, CONSOLE_FILES_MAX
from broker import NotFound

STATIC_DIR = Path(__file__).resolve().parent / "static"
INDEX = "index.html"
_MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png",
                ".txt": "text/plain; charset=utf-8"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    media_type: str
    etag: str


def load_static_files(directory: Path = STATIC_DIR) -> dict[str, StaticFile]:
    """Every file under ``directory`` by its relative POSIX path."""
    files: dict[str, StaticFile] = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        if len(files) >= CONSOLE_FILES_MAX:
            raise ValueError(f"the console ships more than {CONSOLE_FILES_MAX} files")
        body = path.read_bytes()
        if len(body) > CONSOLE_FILE_BYTES_MAX:
            raise ValueError(f"{path} is larger than {CONSOLE_FILE_BYTES_MAX} bytes")
        media_type = _MEDIA_TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        files[path.relative_to(directory).as_posix()] = StaticFile(body, media_type, etag)
    if INDEX not in files:
        raise ValueError(f"the console's {INDEX} is missing from {directory}")
    return files


def router() -> APIRouter:
    files = load_static_files()
    routes = APIRouter(tags=["console"])

    def serve(name: str, request: Request) -> Response:
        found = files.get(name)
        if found is None:
            raise NotFound(f"the console has no file {name!r}")
        headers = {**SECURITY_HEADERS, "ETag": found.etag}
        if request.headers.get("if-none-match") == found.etag:
            return Response(status_code=304, headers=headers)
        return Response(found.body, media_type=found.media_type, headers=headers)

    @routes.get("/console", summary="The web console (open it in a browser)", response_class=Response)
    def console(request: Request) -> Response:
        return serve(INDEX, request)

    @routes.get("/console/{name:path}", include_in_schema=False, response_class=Response)
    def console_file(name: str, request: Request) -> Response:
        return serve(name or INDEX, request)

    return routes
