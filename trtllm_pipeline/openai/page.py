"""The chat page: static HTML, JS and CSS shipped in the package (``openai/static``), served by the front.

A page of its own rather than Gradio: three small files, no build step and nothing fetched from elsewhere
(it works offline, behind the same address as the API), and no UI server beside the front; it speaks to
``/v1/chat/completions`` like any client. Its policy headers allow only same-origin scripts, styles and
requests, so even a mistake that let model text through as HTML could run nothing.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

PATH = "/chat"
FILES = {"chat.html": "text/html; charset=utf-8", "chat.js": "text/javascript; charset=utf-8",
         "chat.css": "text/css; charset=utf-8"}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def add_chat_page(app: FastAPI) -> None:
    """``GET /`` and ``GET /chat``: the page; ``GET /static/chat.js`` and ``chat.css``: its script and style."""
    static = resources.files("trtllm_pipeline.openai") / "static"
    files = {name: (static / name).read_bytes() for name in FILES}

    def serve(name: str):
        async def route():
            return Response(files[name], media_type=FILES[name], headers=HEADERS)
        return route

    for path in ("/", PATH):
        app.get(path, include_in_schema=False)(serve("chat.html"))
    for name in ("chat.js", "chat.css"):
        app.get(f"/static/{name}", include_in_schema=False)(serve(name))
