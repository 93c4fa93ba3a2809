"""The README's `curl` example, run as written (the shell lines of its block, only the port changed) against a
gateway serving HTTP, with and without its Content-Type header: both submit the job."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from libs.runtime.ports import free_port_block
from services.gateway.app import serve
from services.gateway.settings import GatewaySettings
from tests.integration.test_gateway import gateway
from tests.support.services import running

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"
HEADER = ' -H "Content-Type: application/json"'


def readme_curl_block() -> str:
    """The README's shell block that posts a job with curl: its lines as a script (continuations joined)."""
    for block in re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.S):
        if "curl" in block and "/v1/jobs" in block:
            return block
    raise AssertionError("the README has no curl example posting to /v1/jobs")


def test_the_readme_example_names_its_content_type():
    assert HEADER.strip() in readme_curl_block()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize("with_header", [True, False], ids=["as-written", "without-content-type"])
async def test_the_readme_curl_example_submits_a_job(env, tmp_path, with_header):
    script = readme_curl_block().replace("8080", str(port := free_port_block(1)))
    if not with_header:
        script = script.replace(HEADER, "")
        assert "Content-Type" not in script
    async with gateway(env) as gw:  # the stand-in queue answers the submit; it shares this test's database
        (tmp_path / ".teto").mkdir()
        (tmp_path / ".teto" / "stack.json").write_text(json.dumps({"admin_token": gw.tokens["admin"]}))
        async with running(serve, env.settings(GatewaySettings, http_port=port, command_timeout_seconds=5.0)):
            # curl as written waits for ever; its own config file (read from $HOME) bounds it, so a gateway that
            # never answers fails here with curl's error instead of hanging the run (seen once in a full run).
            (tmp_path / ".curlrc").write_text("connect-timeout = 10\nmax-time = 60\nshow-error\n")
            proc = await asyncio.create_subprocess_exec("bash", "-e", "-c", script, cwd=tmp_path,
                                                        env={**os.environ, "HOME": str(tmp_path)},
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
            out, err = await proc.communicate()
    assert proc.returncode == 0, f"curl exited {proc.returncode} against port {port}: {err.decode()}"
    job = json.loads(out)
    assert job["state"] == "queued" and job["owner"] == "admin-actor" and job["spec"]["workload"]["kind"] == "finetune"
