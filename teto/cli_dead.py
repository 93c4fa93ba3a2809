"""``teto dead-letters``: what the services gave up on (operators), and ``teto dead-letters replay SEQ`` after a
fix. Reads ``GET /v1/dead-letters`` and posts ``/v1/dead-letters/{seq}/replay`` on the gateway."""

from __future__ import annotations

import argparse

from .cli_common import _print
from .cli_http import call, print_page

COLUMNS = [("seq", "seq"), ("time", "time"), ("service", "service"), ("cause", "cause"), ("subject", "subject"),
           ("deliveries", "deliveries"), ("reason", "reason")]


def cmd_dead_letters(args: argparse.Namespace) -> int:
    return print_page(args, "/v1/dead-letters", {"service": args.service, "after_seq": args.after_seq,
                                                 "limit": args.limit}, "dead_letters", COLUMNS, "no dead letters")


def cmd_dead_letter_replay(args: argparse.Namespace) -> int:
    _, body = call(args, "POST", f"/v1/dead-letters/{args.seq}/replay")
    _print(args, body, f"dead letter {args.seq} replayed on {body.get('subject')}")
    return 0


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser, guard) -> None:
    dead = sub.add_parser("dead-letters", help="messages the services gave up on (needs fleet:manage)",
                          parents=[common])
    dead.add_argument("--service", help="queue, budget, health, audit, ...")
    dead.add_argument("--after-seq", type=int)
    dead.add_argument("--limit", type=int)
    dead.set_defaults(func=guard(cmd_dead_letters))
    dsub = dead.add_subparsers(dest="dead_command")
    p = dsub.add_parser("replay", help="publish one again on its original subject, after a fix", parents=[common])
    p.add_argument("seq", type=int)
    p.set_defaults(func=guard(cmd_dead_letter_replay))
