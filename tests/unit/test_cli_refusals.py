"""The CLI refuses an unsafe configuration with the reason on one line, not a traceback."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def test_unsafe_lease_contract_is_refused_cleanly(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "teto.cli", "up", "--data-dir", str(tmp_path), "--lease-seconds", "10",
         "--heartbeat-seconds", "5", "--executors", "0"],
        capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "TETO_NATS_URL": "nats://127.0.0.1:1", "TETO_DATABASE_URL": "postgresql://x@127.0.0.1:1/x"},
    )
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert "shorter than two heartbeats" in res.stderr
