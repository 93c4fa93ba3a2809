"""The Prometheus series every Teto part may export, and the HTTP endpoint that serves them.

One registry per process holds every series (the catalogue below: names, labels, meaning; docs/observability.md
lists the same). Parts update them at their edges: the consumer loop (libs/runtime/edge.py) counts what it
handled, refused and buried; the runtime samples consumer lag and singleton leadership; each service counts its
own facts after they are committed (grants, renewals, GPU-seconds charged, ...); the gateway times each route.

Why prometheus-client rather than OpenTelemetry metrics with a Prometheus exporter: that exporter is itself
built on prometheus-client, adds a reader and views between a counter and its text form, and still needs an
HTTP server of its own; the series here are plain counters, gauges and histograms read by Prometheus, so the
client library alone is the shorter path. Traces stay OpenTelemetry's (docs/observability.md, Tracing).

Every sample carries ``instance`` (TETO_INSTANCE, default ``<host>:<pid>``), so two replicas of a service export
two series and a sum over instances counts each fact once (each fact is counted by the replica that committed
it). Ports: TETO_METRICS_PORT (0 = off); ``teto up`` gives every process a free one.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector,
                               disable_created_metrics, start_http_server)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

disable_created_metrics()  # no ``*_created`` twin of every counter: half the text, nothing a dashboard reads
REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)  # process_cpu_seconds_total, process_resident_memory_bytes, ...

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)

# -- every process -------------------------------------------------------------------------------------------
REPLICA = Gauge("teto_replica", "1 while this process runs (count by service: the replicas)", ["service"],
                registry=REGISTRY)
SINGLETON_LEADER = Gauge("teto_singleton_leader", "1 while this replica holds the singleton loop's lock",
                         ["service", "singleton"], registry=REGISTRY)

# -- the edge (libs/runtime/edge.py): what each durable consumer did with each message ------------------------
EDGE_MESSAGES = Counter("teto_edge_messages", "Messages settled by a durable consumer, by outcome (handled, "
                        "skipped, malformed, redelivered, dead); heartbeats ingested: stream=\"HB\", "
                        "outcome=\"handled\"", ["service", "durable", "stream", "outcome"], registry=REGISTRY)
EDGE_WAITS = Counter("teto_edge_unavailable_waits", "Back-offs while the database or the bus was away",
                     ["service", "durable"], registry=REGISTRY)
DEAD_LETTERS = Counter("teto_dead_letters", "Dead letters published (teto.dead.<service>)",
                       ["service", "consumer", "cause"], registry=REGISTRY)
REJECTED = Counter("teto_rejected_messages", "Malformed messages refused (teto.rejected.<service>)", ["service"],
                   registry=REGISTRY)
CONSUMER_PENDING = Gauge("teto_consumer_pending_messages", "JetStream num_pending of a durable (not yet "
                         "delivered), sampled", ["service", "durable", "stream"], registry=REGISTRY)
CONSUMER_ACK_PENDING = Gauge("teto_consumer_ack_pending_messages", "JetStream num_ack_pending of a durable "
                             "(delivered, not yet acknowledged), sampled", ["service", "durable", "stream"],
                             registry=REGISTRY)

# -- queue -----------------------------------------------------------------------------------------------------
JOBS = Gauge("teto_jobs", "Jobs by state (sampled from the queue's table; the same figure in every replica)",
             ["state"], registry=REGISTRY)
PLACEMENT_LATENCY = Histogram("teto_placement_latency_seconds", "From a job becoming queued to its lease grant",
                              registry=REGISTRY, buckets=LATENCY_BUCKETS)
GRANTS = Counter("teto_lease_grants", "Lease grants (a gang counts once)", registry=REGISTRY)
LEASE_RENEWALS = Counter("teto_lease_renewals", "Lease renewals answered by the queue, by outcome (ok, refused)",
                         ["outcome"], registry=REGISTRY)
LEASE_EXPIRIES = Counter("teto_lease_expiries", "Leases the scanner found expired", registry=REGISTRY)

# -- budget ----------------------------------------------------------------------------------------------------
GPU_SECONDS = Counter("teto_gpu_seconds_charged", "GPU-seconds appended to the ledger (each usage record once)",
                      registry=REGISTRY)
OVERSHOOT = Counter("teto_overshoot_seconds", "GPU-seconds charged past a job's ceiling (growth of the jobs' "
                    "overshoot)", registry=REGISTRY)
BUDGET_EXHAUSTED = Counter("teto_budget_exhausted", "budget.exhausted events emitted", registry=REGISTRY)

# -- health ----------------------------------------------------------------------------------------------------
SIGNAL_CHANGES = Counter("teto_signal_changes", "Signals changed by the evaluator, by subject (job, executor) "
                         "and new signal (ok, no_signal, stuck)", ["kind", "signal"], registry=REGISTRY)
CHECK_RESULTS = Counter("teto_check_results", "Deep-check test results reported, by node, test and status",
                        ["node", "test", "status"], registry=REGISTRY)
CHECK_FIGURE = Gauge("teto_check_figure", "The latest figure a deep-check test reported on a node (throughput, "
                     "bandwidth, temperature, ...)", ["node", "test", "figure"], registry=REGISTRY)

# -- gateway ---------------------------------------------------------------------------------------------------
HTTP_LATENCY = Histogram("teto_http_request_duration_seconds", "HTTP requests by route template, method and "
                         "status", ["route", "method", "status"], registry=REGISTRY, buckets=LATENCY_BUCKETS)

# -- executor agent --------------------------------------------------------------------------------------------
EXECUTOR_HEARTBEATS = Counter("teto_executor_heartbeats_sent", "Heartbeats this agent published",
                              registry=REGISTRY)
EXECUTOR_RENEWALS = Counter("teto_executor_lease_renewals", "Lease renewals this agent asked, by outcome (ok, "
                            "refused, no_answer)", ["outcome"], registry=REGISTRY)
EXECUTOR_RUNS = Counter("teto_executor_runs_finished", "Training processes ended, by outcome", ["outcome"],
                        registry=REGISTRY)
EXECUTOR_RUNNING = Gauge("teto_executor_running", "1 while this agent runs a job", registry=REGISTRY)


class InstanceLabels(Collector):
    """Adds constant labels (``instance``) to every sample of an inner registry when it is scraped."""

    def __init__(self, inner: CollectorRegistry, labels: dict[str, str]) -> None:
        self.inner = inner
        self.labels = dict(labels)

    def collect(self) -> Iterator[Metric]:
        for family in self.inner.collect():
            family.samples = [s._replace(labels={**s.labels, **self.labels}) for s in family.samples]
            yield family

    def describe(self) -> Iterable[Metric]:
        return []


def default_instance() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def exposed(instance: str) -> CollectorRegistry:
    """What the endpoint serves: every series of this process, each sample labelled with ``instance``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(InstanceLabels(REGISTRY, {"instance": instance}))
    return registry


def series_names(registry: CollectorRegistry = REGISTRY) -> set[str]:
    """Every sample name the registry can export (``_total`` of counters, ``_bucket``/``_sum``/``_count`` of
    histograms), children or not: what a dashboard query may name."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",),
                "summary": ("", "_sum", "_count")}
    return {family.name + suffix for family in registry.collect()
            for suffix in suffixes.get(family.type, ("",))}


class Endpoint:
    """The metrics HTTP server of one process (a daemon thread), started once whatever asks for it.

    A port that cannot be listened on (another process holds it) does not stop the process: a service that cannot
    serve its metrics still schedules, charges and audits. The failure is logged as an error, kept in ``error``
    (a service's replica status carries it, so ``teto status`` names it among its problems), and the bind is
    retried every ``retry_seconds`` in a daemon thread until it succeeds."""

    server = None
    instance: str | None = None
    port: int | None = None
    error: str | None = None  # why the configured port is not served (yet); None once it is, or when off
    retry_seconds = 5.0
    _retrying: threading.Thread | None = None

    @classmethod
    def start(cls, port: int, host: str = "127.0.0.1", instance: str | None = None) -> int | None:
        """Serve ``/metrics`` on ``host:port`` (0: off). Returns the port, or None when off or not bound yet."""
        if port == 0:
            return None
        if cls.server is not None or cls._retrying is not None:
            return cls.port
        cls.instance = instance or default_instance()
        if cls._bind(port, host):
            return cls.port
        log.error("metrics: cannot listen on %s:%d (%s); running on without /metrics, trying again every %g s",
                  host, port, cls.error, cls.retry_seconds)
        cls._retrying = threading.Thread(target=cls._retry, args=(port, host), name="metrics-bind", daemon=True)
        cls._retrying.start()
        return None

    @classmethod
    def _bind(cls, port: int, host: str) -> bool:
        try:
            cls.server, _ = start_http_server(port, addr=host, registry=exposed(cls.instance))
        except OSError as exc:
            cls.error = f"port {port} on {host}: {exc.strerror or exc}"
            return False
        cls.port, cls.error = cls.server.server_port, None
        log.info("metrics at http://%s:%d/metrics (instance %s)", host, cls.port, cls.instance)
        return True

    @classmethod
    def _retry(cls, port: int, host: str) -> None:
        while True:
            time.sleep(cls.retry_seconds)
            if cls._bind(port, host):
                return
