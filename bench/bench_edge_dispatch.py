"""What FastStream's dispatch adds to a batch (issue 29): the same decoded batches settled by the edge
(libs/runtime/edge_settle.py) with the handler called directly (the reference: the edge before FastStream) and
through the service's FastStream subscriber (``EdgeSubscriber.deliver``: FastStream's ``process_message``, its
context, parser, decoder and the declared handler, whose three dependencies are injected from the broker's context
as the services' handlers' are), in the same process, alternating, no server.

The figure is batches per second through FastStream against direct calls; the ratio is per batch, so what it costs
a message is that over the batch size (500 for the heartbeat consumers). The ingest benchmark (bench_ingest.py)
measures the whole path on real servers.

Run: .venv/bin/python -m bench.bench_edge_dispatch [BATCHES] [SIZE]
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass

from faststream import Context
from faststream._internal.endpoint.subscriber.utils import MultiLock

from bench._drain import NullReporter, row
from libs.contracts.subjects import Subjects
from libs.runtime.edge import Consumer
from libs.runtime.edge_loop import ConsumerLoop
from libs.runtime.edge_stream import EdgeBroker, provide, subscribe


@dataclass
class _Msg:
    """A delivered message as the edge sees it once read (only acknowledgement is asked of it)."""

    data: bytes
    subject: str = "bench.hb.x"
    headers: dict[str, str] | None = None

    async def ack(self) -> None:
        return None


async def run(batches: int, size: int) -> dict:
    # Three dependencies from the broker's context, as the services' handlers declare theirs (a store, counters, a
    # clock): the FastStream path resolves them each batch; called directly, the handler keeps its defaults.
    async def handle(items: list[bytes], store: object = Context(), counters: object = Context(),
                     clock: object = Context()) -> None:
        return None

    consumer = Consumer("bench.hb.*", "HB", "bench-dispatch", bytes, handle, batch=size)
    loop = ConsumerLoop(js=None, subjects=Subjects("bench"), consumer=consumer, reporter=NullReporter())
    broker = EdgeBroker()
    sub = subscribe(broker, Subjects("bench"), consumer, loop)
    provide(broker, store=object(), counters=object(), clock=object())
    broker._setup_logger()  # what start() prepares for handling, without a server
    sub._build_fastdepends_model()
    sub.lock = MultiLock()
    through = sub.deliver
    decoded = [(_Msg(b"x" * 200), b"x" * 200) for _ in range(size)]
    took = {"direct": 0.0, "faststream": 0.0}
    for _ in range(5):  # alternate, so a disturbance of the machine falls on both
        for name, deliver in (("direct", None), ("faststream", through)):
            loop.deliver = deliver
            t0 = time.perf_counter()
            for _ in range(batches // 5):
                await loop.apply(decoded)
            took[name] += time.perf_counter() - t0
    per_batch_us = (took["faststream"] - took["direct"]) / batches * 1e6
    return row("edge dispatch: batches through FastStream", batches, took["faststream"], took["direct"],
               unit="batch/s", target=None,
               note=f"{size} messages a batch, handler does nothing but take three dependencies from the broker's "
                    f"context, acks included; FastStream adds "
                    f"{per_batch_us:.0f} us a batch ({per_batch_us / size:.2f} us a message); reference: the "
                    "edge calling the handler directly, same process, alternating")


def main(quick: bool = False) -> dict:
    return asyncio.run(run(500 if quick else 5_000, 500))


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5_000
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    r = asyncio.run(run(n, size))
    print(f"{r['name']}: {r['figure']:.0f} {r['unit']} against {r['reference']:.0f} direct: {r['ratio']:.2f}x; "
          f"{r['note']}")
