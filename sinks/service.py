"""Starting the sink: open ClickHouse, migrate, load prices, serve queries, consume.

Kept apart from the CLI so tests, benchmarks and the demo run the very same start-up in-process.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from types import FrameType

from common.errors import UserError
from common.kafka import TOPIC_CALL_TIMEOUT_S, ensure_topics, wait_for_broker
from common.logs import get_logger
from common.metrics import MetricsRegistry
from common.settings import SinkSettings
from schemas.topics import DEADLETTER
from sinks.batches import FlushOutcome
from sinks.clickhouse import ClickHouseStore, describe_target, open_store
from sinks.cluster import check_cluster, unreplicated_tables
from sinks.ddl import TtlDays
from sinks.migrations import migrate
from sinks.query_server import QueryServer
from sinks.readonly import ReadLimits
from sinks.rows import SINK_TOPICS
from sinks.sink import ClickHouseSink

log = get_logger(__name__)


def load_prices(store: ClickHouseStore, prices: dict[str, float]) -> int:
    """Record the configured price per GPU-hour of each GPU model (newest wins)."""
    if not prices:
        return 0
    now = datetime.now(UTC)
    models = sorted(prices)
    store.insert("gpu_prices", {"gpu_model": models, "usd_per_gpu_hour": [float(prices[m]) for m in models],
                                "updated_at": [now] * len(models)})
    return len(models)


def prepare_store(settings: SinkSettings) -> ClickHouseStore:
    """Open the target, apply missing migrations and load the price table."""
    ttl = TtlDays.from_settings(settings)
    unkeepable = ttl.beyond_datetime()
    if unkeepable is not None:  # the engine would drop every row on insert (its TTL would wrap)
        raise UserError(unkeepable)
    url = settings.clickhouse_url()
    store = open_store(url)
    cluster = settings.clickhouse.cluster
    if cluster:
        prepare_cluster(store, cluster)
    applied = migrate(store, ttl, cluster)
    store.forget_schema()
    priced = load_prices(store, settings.prices_usd_per_gpu_hour)
    log.info("clickhouse ready", target=describe_target(url), server_version=store.server_version,
             migrations_applied=applied, prices=priced)
    return store


def prepare_cluster(store: ClickHouseStore, cluster: str) -> None:
    """Refuse a cluster the server does not know, one of several shards, or a database whose tables
    single-server mode created (they would hold data on one replica only)."""
    replicas = check_cluster(store, cluster)
    stray = unreplicated_tables(store)
    if stray:
        raise UserError(
            f"GPULENS_CLICKHOUSE__CLUSTER={cluster}, but tables {', '.join(stray)} of this database are not "
            "replicated (created by single-server mode): use a new database for cluster mode, or convert them "
            "to Replicated engines first (docs/sink.md, \"ClickHouse cluster mode\")")
    log.info("clickhouse cluster", cluster=cluster, replicas=replicas)


@contextmanager
def running_services(settings: SinkSettings, store: ClickHouseStore, registry: MetricsRegistry) -> Iterator[None]:
    """The query endpoint (embedded engine only) and the /metrics endpoint, for the sink's lifetime."""
    server: QueryServer | None = None
    if store.embedded:
        server = QueryServer(store.url, settings.data_dir, settings.query_port,
                             ReadLimits.from_settings(settings.clickhouse))
        server.start()
    if settings.metrics_port:
        port = registry.serve(settings.metrics_port, settings.metrics_addr)
        log.info("metrics serving", port=port)
    try:
        yield
    finally:
        if server is not None:
            server.stop()


def run_sink(settings: SinkSettings, exit_when_idle_s: float | None = None, create_topics: bool = True) -> FlushOutcome:
    """The whole sink process: returns totals when stopped (SIGTERM/SIGINT) or idle."""
    if create_topics:
        wait_for_broker(lambda: ensure_topics(settings.kafka, (*SINK_TOPICS, DEADLETTER), settings.topic_prefix,
                                              settings.topics, timeout_s=TOPIC_CALL_TIMEOUT_S),
                        settings.broker_wait_s, "sink")
    store = prepare_store(settings)
    registry = MetricsRegistry()
    sink = ClickHouseSink(settings, store, registry)
    previous: dict[signal.Signals, object] = {}

    def _stop(signum: int, frame: FrameType | None) -> None:
        log.info("stopping", signal=signum)
        sink.stop()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, _stop)
    try:
        with running_services(settings, store, registry):
            return sink.run(exit_when_idle_s=exit_when_idle_s)
    finally:
        for sig, handler in previous.items():
            with suppress(TypeError, ValueError):
                signal.signal(sig, handler)  # type: ignore[arg-type]
        store.close()
