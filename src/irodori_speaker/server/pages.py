"""The pages: `/overlay` (an OBS browser source) and `/studio`, with their scripts and styles.

Plain HTML, CSS and JavaScript shipped in the package (`server/static/`), no build step and
nothing fetched from the network: a page loads only from this server. The user's own overlay
files (a CSS file, fonts it names) come from the overlay folder (`serve --overlay-dir`) at
`/overlay/user/NAME`; `overlay.css` there is loaded by default.
"""

from __future__ import annotations

import mimetypes
import re
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, Response

__all__ = ["STATIC", "make_router"]

STATIC = Path(__file__).with_name("static")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,100}$")  # one file, no folders, no dotfiles
_TYPES = {".woff2": "font/woff2", ".woff": "font/woff", ".ttf": "font/ttf", ".otf": "font/otf"}


def _file(folder: Path, name: str) -> FileResponse:
    path = folder / name
    if not _NAME.fullmatch(name) or not path.is_file():
        raise HTTPException(404, f"no file {name!r}")
    media = _TYPES.get(path.suffix.lower()) or mimetypes.guess_type(name)[0] or "application/octet-stream"
    return FileResponse(path, media_type=media, headers={"Cache-Control": "no-cache"})


def make_router(overlay_dir: str | Path | None = None) -> APIRouter:
    """`/overlay`, `/studio`, `/static/NAME` and the user's `/overlay/user/NAME`."""
    router = APIRouter(tags=["Pages"], include_in_schema=False)
    user = Path(overlay_dir).expanduser() if overlay_dir else None

    @router.get("/overlay")
    def overlay() -> FileResponse:
        return _file(STATIC, "overlay.html")

    @router.get("/studio")
    def studio() -> FileResponse:
        return _file(STATIC, "studio.html")

    @router.get("/static/{name}")
    def static(name: str) -> FileResponse:
        return _file(STATIC, name)

    @router.get("/overlay/user/{name}")
    def user_file(name: str) -> Response:
        if user is None:
            if name == "overlay.css":  # the page always asks: no folder is no style of one's own
                return Response("/* no overlay folder (serve --overlay-dir DIR) */\n", media_type="text/css")
            raise HTTPException(404, "no overlay folder (serve --overlay-dir DIR)")
        if name == "overlay.css" and not (user / name).is_file():
            return Response("/* no overlay.css in the overlay folder */\n", media_type="text/css")
        return _file(user, name)

    return router
