"""The gateway process: open the runtime, serve the HTTP API with uvicorn until cancelled, close everything.

The gateway writes no state of its own to PostgreSQL (tokens live in the tokens file), so it runs no outbox
relay; it reads the public views and publishes commands. Several replicas may run behind a load balancer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import uvicorn

from libs.runtime.service import Runtime

from .api import create_app
from .settings import GatewaySettings

log = logging.getLogger(__name__)


async def serve(settings: GatewaySettings | None = None, *, ready: asyncio.Event | None = None) -> None:
    settings = settings or GatewaySettings.from_env()
    runtime = await Runtime.open("gateway", settings, schema="gateway", package="services.gateway")
    server: uvicorn.Server | None = None
    task: asyncio.Task | None = None
    try:
        app = create_app(settings, runtime)
        tls = ({"ssl_certfile": str(settings.tls_cert_file), "ssl_keyfile": str(settings.tls_key_file)}
               if settings.tls_cert_file else {})
        config = uvicorn.Config(app, host=settings.http_host, port=settings.http_port, log_level="warning",
                                access_log=False, lifespan="off", **tls)
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(), name="gateway-http")
        while not server.started:
            if task.done():  # failed to bind: surface the error
                await task
                raise RuntimeError("the HTTP server stopped during start-up")
            await asyncio.sleep(0.02)
        log.info("gateway listening on %s://%s:%s", "https" if tls else "http", settings.http_host,
                 settings.http_port)
        if ready is not None:
            ready.set()
        # Shielded: on cancellation uvicorn is asked to exit (below) and shuts down cleanly.
        await asyncio.shield(task)  # ends on a signal (uvicorn handles SIGINT/SIGTERM) or cancellation
    finally:
        if server is not None:
            server.should_exit = True
        if task is not None and not task.done():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 5)
        await runtime.close()
