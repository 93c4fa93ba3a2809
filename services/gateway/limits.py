"""Request bodies at the edge: a hard size limit (413, in the gateway's JSON error shape), and every body read
as JSON whatever its Content-Type.

A declared Content-Length over the limit is refused before a byte of the body is read; a body without one
(chunked) is counted as it arrives and refused as soon as it passes the limit, so a 5 MB body never sits in
memory whole. Every body the API takes is JSON, so one sent as text/plain or form-urlencoded (``curl -d``) is
read as JSON too, rather than refused as "not an object".
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class JsonBodies:
    """Label every request body JSON: the API has no other kind, and clients often forget the header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") in ("POST", "PUT", "PATCH"):
            headers = [(k, v) for k, v in scope.get("headers") or () if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


class BodyLimit:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max):
            await self._refuse(send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max:
                    # Raised inside the route's body read: the app's exception handler answers with JSON.
                    raise HTTPException(413, "too large")
            return message

        await self.app(scope, counted, send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps({"error": "too_large", "reason": f"request body larger than {self.max} bytes",
                           "limit_bytes": self.max}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
