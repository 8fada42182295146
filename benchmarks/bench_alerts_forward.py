"""Alert forwarding latency: an alert transition on ``alerts.v1`` -> received by a local webhook.

Transitions are produced paced (one every 50 ms, as a live fleet does, not a burst) and timed
from just before ``produce`` to the webhook's receipt. ``gpulens alerts forward``
(:func:`sinks.alerts_forward.run_forwarder`, JSON webhook) is compared with a baseline measured in
the same run on the same broker and webhook: a plain loop that consumes the topic, POSTs each raw
record and commits after each batch (no decoding, mapping, retries, dead letters or logs). Both
consume the same way (wait for one record, then take what has arrived) with the same client
settings, so the consumer's fetch wait is in both figures. Also: a burst of
transitions through each, as transitions per second.
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from benchmarks.harness import Context, Result
from common.kafka import BoundedProducer, commit_offsets, ensure_topics, make_consumer
from common.metrics import MetricsRegistry
from common.settings import AlertForwardSettings, ProducerSettings, load_settings
from schemas.codec import encode
from schemas.messages import utc_now
from schemas.outputs import Alert, AlertSubject
from schemas.topics import ALERTS, DEADLETTER
from sinks.alerts_forward import ForwardMetrics, run_forwarder

BENCH = "alerts_forward"
PACE_S = 0.05


class _Webhook:
    """Records when each alert id arrived."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                now = time.time()
                with hook.lock:
                    hook.arrived.setdefault(str(body["id"]), now)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self) -> int:
        with self.lock:
            return len(self.arrived)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _alert(i: int, tag: str) -> Alert:
    now = utc_now()
    return Alert(id=f"{tag}-{i}", type="idle_gpu", severity="warning", state="firing" if i % 2 == 0 else "resolved",
                 at=now, started_at=now, subject=AlertSubject(kind="pod", namespace="ml", name=f"train-{i % 50}",
                                                              node=f"gpu-{i % 16}", gpu_uuid=f"GPU-{i}"),
                 summary=f"ml/train-{i % 50}: GPU idle", details={"idle_class": "no_process", "util_pct": 0.0})


def _plain_loop(ctx: Context, topic: str, url: str, stop: threading.Event) -> None:
    consumer = make_consumer(ctx.kafka, f"{topic}-plain")
    consumer.subscribe([topic])
    try:
        while not stop.is_set():
            first = consumer.poll(0.5)  # the same wait-for-one-then-drain as the forwarder
            if first is None:
                continue
            messages = [m for m in [first, *consumer.consume(499, 0)] if m.error() is None]
            offsets: dict[tuple[str, int], int] = {}
            for m in messages:
                request = urllib.request.Request(url, data=m.value(), method="POST",
                                                 headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=10) as response:
                    response.read()
                offsets[(m.topic() or topic, int(m.partition() or 0))] = int(m.offset() or 0) + 1
            if offsets:
                commit_offsets(consumer, offsets)
    finally:
        consumer.close()


def _measure(ctx: Context, name: str, start: Callable[[str, str, threading.Event], threading.Thread],
             paced: int, burst: int) -> tuple[list[float], float]:
    prefix = f"{ctx.topic_prefix}-{name}"
    ensure_topics(ctx.kafka, [ALERTS, DEADLETTER], prefix)
    topic = ALERTS.name(prefix)
    hook = _Webhook()
    stop = threading.Event()
    worker = start(topic, hook.url, stop)
    producer = BoundedProducer(ctx.kafka, ProducerSettings(linger_ms=0))
    try:
        warm = _alert(-1, f"{name}-warm")  # the consumer has joined its group once this one arrives
        producer.produce(topic, warm.id, encode(warm))
        producer.flush(10)
        deadline = time.time() + 60
        while hook.count() < 1 and time.time() < deadline:
            time.sleep(0.05)
        sent: dict[str, float] = {}
        for i in range(paced):
            alert = _alert(i, name)
            sent[alert.id] = time.time()
            producer.produce(topic, alert.id, encode(alert))
            producer.flush(10)
            time.sleep(PACE_S)
        deadline = time.time() + 60
        while hook.count() < paced + 1 and time.time() < deadline:
            time.sleep(0.05)
        latencies = [hook.arrived[i] - t for i, t in sent.items() if i in hook.arrived]
        started = time.time()
        for i in range(burst):
            alert = _alert(i, f"{name}-burst")
            producer.produce(topic, alert.id, encode(alert))
        producer.flush(30)
        deadline = time.time() + 120
        while hook.count() < paced + 1 + burst and time.time() < deadline:
            time.sleep(0.02)
        rate = (hook.count() - paced - 1) / (time.time() - started)
    finally:
        stop.set()
        worker.join(timeout=30)
        hook.close()
    return latencies, rate


def _forwarder(ctx: Context) -> Callable[[str, str, threading.Event], threading.Thread]:
    def start(topic: str, url: str, stop: threading.Event) -> threading.Thread:
        prefix = topic.removesuffix("." + ALERTS.suffix)
        settings = load_settings(AlertForwardSettings, webhook_url=url, topic_prefix=prefix,
                                 group_id=f"{topic}-forward", kafka=ctx.kafka.model_dump())
        thread = threading.Thread(target=run_forwarder, kwargs={
            "settings": settings, "stop": stop, "metrics": ForwardMetrics(MetricsRegistry())}, daemon=True)
        thread.start()
        return thread
    return start


def _plain(ctx: Context) -> Callable[[str, str, threading.Event], threading.Thread]:
    def start(topic: str, url: str, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=_plain_loop, args=(ctx, topic, url, stop), daemon=True)
        thread.start()
        return thread
    return start


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) >= 2 else float("nan")


def run(ctx: Context) -> list[Result]:
    paced, burst = (60, 300) if ctx.quick else (200, 2000)
    base_lat, base_rate = _measure(ctx, "plain", _plain(ctx), paced, burst)
    log = logging.getLogger("sinks.alerts_forward")
    level = log.level
    log.setLevel(logging.WARNING)  # one "alert delivered" line per delivery: kept out of the table
    try:
        fwd_lat, fwd_rate = _measure(ctx, "forward", _forwarder(ctx), paced, burst)
    finally:
        log.setLevel(level)
    results: list[Result] = []
    for q in (50, 95):
        base = _pct(base_lat, q) * 1000
        value = _pct(fwd_lat, q) * 1000
        results.append(Result(BENCH, f"latency p{q}, topic -> webhook (paced)", value, "ms",
                              baseline=f"plain consume->POST p{q} {base:.1f} ms", ratio_to_baseline=value / base,
                              notes=f"{len(fwd_lat)}/{paced} forwarded, {len(base_lat)}/{paced} plain"))
    results.append(Result(BENCH, f"burst of {burst} transitions", fwd_rate, "alerts/s",
                          baseline=f"plain consume->POST {base_rate:.0f} alerts/s",
                          ratio_to_baseline=fwd_rate / base_rate if base_rate else None))
    return results
