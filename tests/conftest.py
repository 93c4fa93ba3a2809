"""Fixtures: real NATS and PostgreSQL for integration and end-to-end tests.

With a Docker engine, testcontainers starts the servers; without one (these build machines), the embedded
servers from pip packages start on free ports in a temporary directory. One server of each per test session;
every test gets its own subject prefix (so its own streams) and its own database, so tests never see each
other's messages or rows.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from libs.runtime.settings import CommonSettings


def _docker_available() -> bool:
    if os.environ.get("TETO_TEST_NO_DOCKER"):
        return False
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:  # noqa: BLE001 - no engine here
        return False


@dataclass
class Infra:
    nats_url: str
    pg_admin_url: str
    root: Path
    _create_db: object = field(repr=False, default=None)

    def new_database(self) -> str:
        return self._create_db(f"t_{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="session")
def infra() -> Iterator[Infra]:
    from tests.support import reap

    for stale in reap.abandoned(Path(tempfile.gettempdir())):  # servers of a session killed before its teardown
        reap.reap(stale)
    root = Path(tempfile.mkdtemp(prefix="teto-test-"))
    os.chmod(root, 0o755)  # the PostgreSQL service user must enter it (mkdtemp makes it 0700)
    reap.claim(root)
    if _docker_available():
        from testcontainers.nats import NatsContainer
        from testcontainers.postgres import PostgresContainer

        with NatsContainer().with_command("-js") as nats_c, PostgresContainer("postgres:16") as pg_c:
            admin = pg_c.get_connection_url().replace("+psycopg2", "")

            def create(name: str) -> str:
                import asyncio

                import asyncpg

                async def go() -> None:
                    conn = await asyncpg.connect(admin)
                    await conn.execute(f'CREATE DATABASE "{name}"')
                    await conn.close()

                asyncio.run(go())
                return admin.rsplit("/", 1)[0] + f"/{name}"

            yield Infra(nats_c.nats_uri(), admin, root, create)
        return
    from teto.stack.embedded import EmbeddedNats, EmbeddedPostgres, remove_detached

    nats = EmbeddedNats(root / "nats").start()
    pg = EmbeddedPostgres(root / "pg", durable=False).start()
    try:
        yield Infra(nats.url, pg.url, root, pg.create_database)
    finally:  # thrown away: killed rather than shut down, deleted without waiting (remove_detached)
        nats.stop(graceful=False)
        pg.stop(destroy=True, detach=True)
        remove_detached(root)


@dataclass
class TestEnv:
    """One test's isolated slice of the shared servers."""

    __test__ = False
    infra: Infra
    prefix: str
    database_url: str
    data_dir: Path

    def settings(self, cls: type[CommonSettings] = CommonSettings, **overrides) -> CommonSettings:
        base = dict(nats_url=self.infra.nats_url, database_url=self.database_url, subject_prefix=self.prefix,
                    data_dir=self.data_dir, lease_seconds=6.0, heartbeat_seconds=1.0, stop_margin_seconds=1.5)
        base.update(overrides)
        return cls.from_env(env={}, **base)

    def env_vars(self, **extra: str) -> dict[str, str]:
        """Environment for a subprocess (an executor or service started as its own process)."""
        env = dict(os.environ)
        env.update(TETO_NATS_URL=self.infra.nats_url, TETO_DATABASE_URL=self.database_url,
                   TETO_SUBJECT_PREFIX=self.prefix, TETO_DATA_DIR=str(self.data_dir),
                   TETO_LEASE_SECONDS="6", TETO_HEARTBEAT_SECONDS="1", TETO_STOP_MARGIN_SECONDS="1.5")
        env.update(extra)
        return env


@pytest.fixture
def env(infra: Infra, tmp_path: Path) -> TestEnv:
    prefix = "t" + uuid.uuid4().hex[:10]
    return TestEnv(infra=infra, prefix=prefix, database_url=infra.new_database(), data_dir=tmp_path / "data")


@pytest.fixture
def stack_dir() -> Iterator[Path]:
    """A data directory for a whole `teto up` stack, enterable by the PostgreSQL service user (pytest's
    tmp_path lives under a 0700 directory, which would push the cluster to /var/lib/teto), removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="teto-e2e-"))
    os.chmod(root, 0o755)
    yield root / "teto"
    shutil.rmtree(root, ignore_errors=True)


_REPO = Path(__file__).resolve().parent.parent
_SOURCES = ("libs", "services", "agents", "teto", "bench", "examples")


def pytest_sessionstart(session: pytest.Session) -> None:
    """The project's modules compiled to bytecode once, by the controlling process, before any test starts one
    of the hundreds of service, agent and CLI processes the suite runs: where PYTHONDONTWRITEBYTECODE is set (as
    on these machines) no process ever writes what it compiled, so each one compiled every module it imported
    again (a quarter of a second of CPU for a service), minutes of the suite's two cores in all."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: its controller did it
        return
    import compileall

    for name in _SOURCES:
        if (_REPO / name).is_dir():
            compileall.compile_dir(_REPO / name, quiet=1, workers=1)


_LAYERS = ("unit", "integration", "e2e", "faults", "security", "panel")


def pytest_collection_modifyitems(config, items):  # noqa: ARG001
    """Each test carries the marker of its folder, so `-m unit` (etc.) selects exactly that layer."""
    for item in items:
        parts = Path(str(item.fspath)).parts
        for layer in _LAYERS:
            if layer in parts:
                item.add_marker(getattr(pytest.mark, layer))
