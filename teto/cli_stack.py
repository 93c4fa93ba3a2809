"""``teto up``, ``teto service NAME`` and ``teto executor``: starting the parts."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="start the whole stack locally (embedded NATS and PostgreSQL unless configured)")
    up.add_argument("--data-dir", type=Path, default=Path(os.environ.get("TETO_DATA_DIR", ".teto")))
    up.add_argument("--http-port", type=int, default=8080)
    up.add_argument("--executors", type=int, default=2, help="local executor agents to start")
    up.add_argument("--group", default="local", help="node group of the local executors")
    up.add_argument("--demo", action="store_true", help="submit the demo fine-tune and follow it")
    up.add_argument("--exit-after-demo", action="store_true", help="stop the stack when the demo job ends")
    up.add_argument("--lease-seconds", type=float, default=None)
    up.add_argument("--heartbeat-seconds", type=float, default=None)
    up.add_argument("--log-level", default="INFO")
    up.add_argument("--nats-cluster", type=int, default=1, metavar="N",
                    help="embedded NATS members clustered on loopback (3: JetStream streams R3; docs/reliability.md)")
    up.add_argument("--replicas", type=int, default=1, metavar="M", help="processes of each service")
    up.add_argument("--checkpoint-store", choices=["dir", "s3"], default=None,
                    help="s3: checkpoints in an S3 store (an embedded SeaweedFS unless TETO_CHECKPOINT_STORE_URL is "
                    "set), each executor with its own local directory; dir: one shared checkpoint directory "
                    "(the default; docs/checkpoint-store.md)")
    up.set_defaults(func=_up)

    svc = sub.add_parser("service", help="run one service in the foreground (what deploy/compose.yml does)")
    svc.add_argument("name", choices=["queue", "budget", "health", "audit", "gateway"])
    svc.add_argument("--log-level", default=os.environ.get("TETO_LOG_LEVEL", "INFO"))
    svc.set_defaults(func=_service)

    ex = sub.add_parser("executor", help="run an executor agent on this node")
    ex.add_argument("--group", default=None, help="node group (TETO_GROUP)")
    ex.add_argument("--executor-id", default=None)
    ex.add_argument("--node-id", default=None)
    ex.add_argument("--log-level", default=os.environ.get("TETO_LOG_LEVEL", "INFO"))
    ex.set_defaults(func=_executor)

    from teto import cli_db

    cli_db.register(sub)


def _up(args: argparse.Namespace) -> int:
    from teto.stack.up import UpOptions, up

    return up(UpOptions(data_dir=args.data_dir, http_port=args.http_port, executors=args.executors,
                        group=args.group, demo=args.demo, exit_after_demo=args.exit_after_demo,
                        lease_seconds=args.lease_seconds, heartbeat_seconds=args.heartbeat_seconds,
                        log_level=args.log_level, nats_cluster=args.nats_cluster, replicas=args.replicas,
                        checkpoint_store=args.checkpoint_store))


def _service(args: argparse.Namespace) -> int:
    from teto.stack.run import configure_logging, run_service

    configure_logging(args.log_level)
    return run_service(args.name)


def _executor(args: argparse.Namespace) -> int:
    from teto.stack.run import configure_logging, run_executor

    configure_logging(args.log_level)
    return run_executor({"group": args.group, "executor_id": args.executor_id, "node_id": args.node_id})
