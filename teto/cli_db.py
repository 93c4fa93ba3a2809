"""``teto db``: the database step of a deployment (what ``teto up`` does by itself, for deploy/compose.yml).

``teto db password FILE`` makes the administrator's password once (before PostgreSQL's first start).
``teto db provision`` connects as the administrator, creates one login per service, applies every migration as
the schema's owner, and writes each service's own URL to ``<out>/<service>/database.url`` (0600) for that
service alone to mount (``TETO_DATABASE_URL_FILE``). Passwords found in earlier URL files are kept.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

from libs.runtime import dbroles


def write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.touch(mode=0o600)
    os.chmod(tmp, 0o600)
    tmp.write_text(text)
    os.replace(tmp, path)


def known_passwords(out: Path) -> dict[str, str]:
    """Each service's password from the URL file written by an earlier run, or a new one."""
    found = {}
    for service in dbroles.SERVICES:
        try:
            found[service] = unquote(urlsplit((out / service / "database.url").read_text().strip()).password or "")
        except OSError:
            found[service] = ""
        found[service] = found[service] or dbroles.new_password()
    return found


def admin_url(args: argparse.Namespace) -> str:
    url = args.admin_url or os.environ.get("TETO_DATABASE_ADMIN_URL") or ""
    if not url:
        raise SystemExit("teto db provision: pass --admin-url or set TETO_DATABASE_ADMIN_URL")
    if args.admin_password_file:
        parts = urlsplit(url)
        password = Path(args.admin_password_file).read_text().strip()
        url = dbroles.login_url(url, unquote(parts.username or ""), password)
    return url


def cmd_password(args: argparse.Namespace) -> int:
    if args.file.exists() and args.file.read_text().strip():
        print(f"{args.file} exists; kept")
        return 0
    write_private(args.file, dbroles.new_password() + "\n")
    print(f"wrote a new password to {args.file}")
    return 0


def cmd_provision(args: argparse.Namespace) -> int:
    from teto.stack.dbsetup import provision

    secrets = known_passwords(args.out)
    logins = asyncio.run(provision(admin_url(args), secrets, own_cluster=args.own_cluster))
    if logins is None:
        print("teto db provision: the administrator URL is no superuser; nothing changed", file=sys.stderr)
        return 2
    for service, url in logins.urls.items():
        write_private(args.out / service / "database.url", url + "\n")
    print(f"provisioned {', '.join(logins.roles.logins)}; URLs in {args.out}/<service>/database.url")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    dbp = sub.add_parser("db", help="the database step of a deployment (logins, migrations)")
    dsub = dbp.add_subparsers(dest="db_command", required=True)
    pw = dsub.add_parser("password", help="make an administrator password file once (kept if present)")
    pw.add_argument("file", type=Path)
    pw.set_defaults(func=cmd_password)
    pr = dsub.add_parser("provision", help="one login per service, migrations as owners, a URL file each")
    pr.add_argument("--admin-url", help="the administrator's DSN (TETO_DATABASE_ADMIN_URL)")
    pr.add_argument("--admin-password-file", help="the administrator's password, if not in the URL")
    pr.add_argument("--out", type=Path, required=True, help="writes <out>/<service>/database.url")
    pr.add_argument("--own-cluster", action="store_true",
                    help="the cluster is Teto's alone: also revoke CONNECT on its other databases from PUBLIC")
    pr.set_defaults(func=cmd_provision)
