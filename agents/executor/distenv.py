"""The ``torch.distributed`` conventions every worker of a gang is started with (pure), so a script written for
``torchrun`` (``Trainer``/``accelerate``, Lightning, plain ``init_process_group("env://")``) runs under Teto
unchanged: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and what
``torchrun`` sets beside them (``GROUP_RANK``, ``ROLE_RANK``, ``TORCHELASTIC_RUN_ID``...), which Lightning reads
for its cluster environment, and ``NODE_RANK``, which ``accelerate`` and Lightning read.

Each worker is its own node to the stack: one process per executor, holding only the devices it was granted
(``CUDA_VISIBLE_DEVICES``), so its local rank is 0 of 1 and its group (node) rank is its rank. ``MASTER_ADDR`` and
``MASTER_PORT`` are the rendezvous the queue chose for the gang (rank 0's host, a port no other gang holds), the
same address ``teto.sdk.init_distributed`` joins. A single worker gets none of them: a stack that sees ``RANK``
would set up a process group of one and wait for a rendezvous nobody offers.
"""

from __future__ import annotations

from libs.contracts.agents import RunJob


def split_rendezvous(rendezvous: str) -> tuple[str, str]:
    """``host:port`` (``[v6]:port`` for an IPv6 host) as (host, port), the brackets removed."""
    host, _, port = rendezvous.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def torch_env(grant: RunJob) -> dict[str, str]:
    """The variables a gang worker gets (none for a single worker, or a gang without a rendezvous)."""
    if grant.world_size <= 1 or not grant.rendezvous:
        return {}
    host, port = split_rendezvous(grant.rendezvous)
    rank, world = str(grant.rank), str(grant.world_size)
    return {
        "RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": rank, "GROUP_WORLD_SIZE": world, "NODE_RANK": rank,
        "ROLE_RANK": rank, "ROLE_WORLD_SIZE": world, "ROLE_NAME": "default",
        "MASTER_ADDR": host, "MASTER_PORT": port,
        # torchrun's run id is its rendezvous id; Lightning takes the torchrun environment (RANK, WORLD_SIZE as
        # given) when it is set. One per gang attempt, like the rendezvous port.
        "TORCHELASTIC_RUN_ID": f"{grant.job_id}-{grant.epoch}",
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
    }
