"""Tokens never travel in clear when the gateway is given a certificate: it serves HTTPS only (a plain HTTP
request gets no answer), the CLI verifies it against the CA that `teto secrets tls` made, and refuses a
gateway it cannot verify."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from teto.cli import main
from teto.tls import make_tls
from tests.security.gateway_stack import gateway_stack

pytestmark = pytest.mark.security


async def test_the_gateway_serves_tls_and_the_cli_verifies_it(env, tmp_path, capsys):
    files = make_tls(tmp_path / "tls", ["localhost", "127.0.0.1"])
    async with gateway_stack(env, tmp_path / "s", audit=False, tls_cert_file=files.cert, tls_key_file=files.key,
                             ca_file=files.ca) as s:
        assert s.url.startswith("https://")
        r = await s.as_("olga").get("/v1/whoami")
        assert r.status_code == 200 and r.json()["actor"] == "olga"
        with pytest.raises(httpx.HTTPError):  # the token is never sent in clear to this port
            async with httpx.AsyncClient(timeout=5) as plain:
                await plain.get(s.url.replace("https://", "http://") + "/v1/whoami",
                                headers={"Authorization": f"Bearer {s.tokens['olga']}"})

        common = ["--url", s.url, "--token", s.tokens["olga"], "--data-dir", str(tmp_path / "none")]
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["jobs", *common, "--ca-file", str(files.ca), "--json"]) == 0
        assert capsys.readouterr().out.strip() == "[]"
        # Without the CA the gateway's certificate is not trusted: refused before any token is sent.
        assert await asyncio.to_thread(main, ["jobs", *common]) == 3
        assert "certificate" in capsys.readouterr().err.lower()
