"""The bus's users for ``teto up`` and for a deployment: passwords, credentials files, the server config.

Each part gets its own NATS user (libs/runtime/natsauth.py says what each may publish and subscribe) with a
random password. The server config holds only bcrypt hashes of them and no ``no_auth_user``, so a connection
without credentials is refused; each part reads its password from its own 0600 credentials file (never from
the environment: a child's ``/proc/<pid>/environ`` would show it). ``teto up`` mints a new executor id on every
(re)start of an agent, so ``LocalBus`` adds that executor's user, drops the users of executors no longer
running, rewrites the config and reloads the server (SIGHUP) before the agent starts.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt

from libs.runtime import natsauth

BCRYPT_ROUNDS = 11  # nats-server checks the hash on every connection: about 0.1 s each on a slow core


def new_password() -> str:
    return secrets.token_urlsafe(32)


def hash_password(password: str, rounds: int = BCRYPT_ROUNDS) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds)).decode()


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, atomically (created 0600: never readable, even for an instant)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def credentials(user: natsauth.User, password: str, ca_file: str | None = None) -> dict:
    """The content of one part's credentials file (read by libs/runtime/bus.Credentials)."""
    out = {"user": user.name, "password": password, "inbox_prefix": user.inbox_prefix}
    if ca_file:
        out["ca_file"] = ca_file
    return out


def server_config(users: Iterable[tuple[natsauth.User, str]], *, tls: dict | None = None,
                  extra: dict | None = None) -> str:
    """The nats-server config (JSON is valid NATS config syntax; every string quoted, so the ``$`` of a bcrypt
    hash is never read as a variable). ``users`` pairs each user with its password hash."""
    pairs = list(users)
    config: dict = dict(extra or {})
    config["authorization"] = natsauth.authorization([u for u, _ in pairs], {u.name: h for u, h in pairs})
    if tls:
        config["tls"] = tls
    return json.dumps(config, indent=2) + "\n"


@dataclass
class LocalBus:
    """The embedded server's users under ``teto up``: written under ``<data-dir>/nats/`` (0600 files, 0700
    directory). New passwords on every ``teto up`` (every part starts again anyway)."""

    nats_dir: Path
    prefix: str = "teto"
    server_pid: Callable[[], int | None] = lambda: None
    monitor_url: str | None = None
    # A NATS cluster (teto/stack/cluster.py): each member's running pid (None while down) and monitor URL, and
    # each member's own config (its cluster block) written next to the users as ``<name>.conf``.
    members: Callable[[], list[tuple[int | None, str]]] | None = None
    node_configs: dict[str, dict] = field(default_factory=dict)
    _users: dict[str, tuple[natsauth.User, str, str]] = field(default_factory=dict)  # name -> user, password, hash

    def __post_init__(self) -> None:
        self.nats_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.nats_dir, 0o700)
        self.creds_dir.mkdir(exist_ok=True)
        os.chmod(self.creds_dir, 0o700)
        for stale in self.creds_dir.glob("*.json"):  # an earlier run's passwords are void: remove them
            stale.unlink(missing_ok=True)
        for role in (*natsauth.SERVICES, "admin"):
            self._add(natsauth.user(role, self.prefix))
        self.write()

    @property
    def config_path(self) -> Path:
        return self.nats_dir / "auth.conf"

    @property
    def creds_dir(self) -> Path:
        return self.nats_dir / "creds"

    def creds_file(self, user_name: str) -> Path:
        return self.creds_dir / f"{user_name}.json"

    def _add(self, user: natsauth.User) -> Path:
        password = new_password()
        self._users[user.name] = (user, password, hash_password(password))
        path = self.creds_file(user.name)
        write_private(path, json.dumps(credentials(user, password)))
        return path

    def node_config_path(self, name: str) -> Path:
        return self.nats_dir / f"{name}.conf"

    def write(self) -> None:
        users = [(u, h) for u, _, h in self._users.values()]
        write_private(self.config_path, server_config(users))
        for name, extra in self.node_configs.items():  # the same users on every member of a cluster
            write_private(self.node_config_path(name), server_config(users, extra=extra))

    def own(self) -> dict[str, dict[str, str]]:
        """What each service alone gets (``part_env``'s ``own``): the path of its credentials file."""
        return {role: {"TETO_NATS_CREDENTIALS_FILE": str(self.creds_file(role))} for role in natsauth.SERVICES}

    @property
    def admin_creds(self) -> Path:
        return self.creds_file("admin")

    def executor_env(self, executor_id: str, live: Iterable[str]) -> dict[str, str]:
        """Before an agent starts with a new id: add its user, drop the users of executors not running any more,
        reload the server, and return the agent's own variables (its credentials file and node id)."""
        from agents.executor.settings import ExecutorSettings

        node_id = ExecutorSettings.model_validate({"executor_id": executor_id}).node_id
        keep = {natsauth.executor_user(e) for e in live if e} | {natsauth.executor_user(executor_id)}
        for name in [n for n, (u, _, _) in self._users.items() if u.role == "executor" and n not in keep]:
            del self._users[name]
            self.creds_file(name).unlink(missing_ok=True)
        path = self._add(natsauth.user("executor", self.prefix, executor_id=executor_id, node_id=node_id))
        self.write()
        self.reload()
        return {"TETO_NATS_CREDENTIALS_FILE": str(path), "TETO_NODE_ID": node_id}

    def _servers(self) -> list[tuple[int | None, str | None]]:
        return self.members() if self.members is not None else [(self.server_pid(), self.monitor_url)]

    def reload(self, timeout: float = 30.0) -> None:  # a loaded machine answers /varz slowly
        """SIGHUP every running server and wait until each has loaded the new config (its config_load_time
        changes). A cluster member down meanwhile is skipped: it reads the new file when it starts again."""
        before: dict[str, str | None] = {}
        for pid, url in self._servers():
            if pid is None:
                continue
            if url:
                before[url] = self._load_time(url)
            try:
                os.kill(pid, signal.SIGHUP)
            except ProcessLookupError:
                before.pop(url, None)
        deadline = time.monotonic() + timeout
        while before and time.monotonic() < deadline:
            running = {url for pid, url in self._servers() if pid is not None}
            before = {url: t for url, t in before.items() if url in running and self._load_time(url) in (t, None)}
            if before:
                time.sleep(0.05)
        if before:
            raise TimeoutError(f"nats-server at {sorted(before)} did not reload its config within {timeout:.0f}s")

    @staticmethod
    def _load_time(monitor_url: str) -> str | None:
        try:
            with urllib.request.urlopen(f"{monitor_url}/varz", timeout=1) as r:
                return json.loads(r.read()).get("config_load_time")
        except (OSError, ValueError):
            return None


# -- teto up ------------------------------------------------------------------------------------------------

def start_embedded(nats_dir: Path, prefix: str, members: int = 1, sup=None):
    """The embedded NATS server with every part's user and permissions; returns (LocalBus, EmbeddedNats), or
    with ``members`` > 1 (LocalBus, NatsCluster): that many clustered servers with the same users, run as parts
    of the supervisor ``sup``."""
    from teto.stack.embedded import EmbeddedNats

    bus_auth = LocalBus(nats_dir, prefix)
    if members > 1:
        from teto.stack import cluster

        return bus_auth, cluster.start(nats_dir, bus_auth, members, sup)
    if sup is not None:  # one that dies is started again (teto/stack/servers.py)
        from teto.stack.servers import SupervisedNats

        supervised = SupervisedNats.start(EmbeddedNats(nats_dir, config=bus_auth.config_path), sup)
        bus_auth.server_pid, bus_auth.monitor_url = supervised.pid, supervised.monitor_url
        return bus_auth, supervised
    nats = EmbeddedNats(nats_dir, config=bus_auth.config_path).start()
    bus_auth.server_pid = lambda: nats.proc.pid if nats.proc is not None and nats.proc.poll() is None else None
    bus_auth.monitor_url = nats.monitor_url
    return bus_auth, nats


def give_credentials(bus_auth: LocalBus | None, own: dict[str, dict[str, str | None]],
                     live_executors: Callable[[], Iterable[str | None]]):
    """Each service gets only its own credentials file (``own``, see teto/stack/up.part_env); returns the
    executors' ``Part.prepare``: each start gets a new user for its new id. With an external NATS: nothing."""
    if bus_auth is None:
        return None
    for name, variables in bus_auth.own().items():
        own[name].update(variables)
    own["executor"]["TETO_NATS_CREDENTIALS_FILE"] = None  # given per start, for the executor's own id

    def prepare(part) -> dict[str, str]:
        return bus_auth.executor_env(part.executor_id, [e for e in live_executors() if e])

    return prepare


def note(bus_auth: LocalBus | None, nats_admin: Path | None) -> str:
    """What ``teto up``'s start-up output says about the bus's identities."""
    if bus_auth is not None:
        return f"  (one user per part, none anonymous; admin credentials: {nats_admin})"
    return f"  (credentials: {nats_admin})" if nats_admin else "  (external, no credentials configured)"
