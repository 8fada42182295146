"""The baseline every other figure is compared to: raw Kafka produce and consume throughput on this
machine's local broker, with a realistic message (one 8-GPU node sample, ~5 KB of JSON), through
confluent-kafka and through aiokafka (the client faust uses)."""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from benchmarks.harness import Context, Result
from common.kafka import BoundedProducer, ensure_topics, make_consumer
from common.settings import ProducerSettings
from schemas import codec
from schemas.examples import gpu_sample
from schemas.topics import GPU_SAMPLES

BENCH = "kafka_baseline"


def _payload() -> bytes:
    return codec.encode(gpu_sample(gpus=8))


def _confluent(ctx: Context, topic: str, count: int, payload: bytes) -> tuple[float, float]:
    producer = BoundedProducer(ctx.kafka, ProducerSettings(linger_ms=20, queue_max_messages=max(count, 1000)))
    started = time.perf_counter()
    for i in range(count):
        while not producer.produce(topic, key=f"node-{i % 64}", value=payload):
            producer.poll(0.05)
    producer.flush(120)
    produce_s = time.perf_counter() - started

    consumer = make_consumer(ctx.kafka, group_id=f"{topic}-reader", extra={"fetch.min.bytes": 1})
    consumer.subscribe([topic])
    seen = 0
    started = time.perf_counter()
    while seen < count and time.perf_counter() - started < 120:
        for msg in consumer.consume(1000, 0.5):
            if not msg.error():
                seen += 1
    consume_s = time.perf_counter() - started
    consumer.close()
    return produce_s, consume_s


async def _aiokafka(ctx: Context, topic: str, count: int, payload: bytes) -> tuple[float, float]:
    servers = ctx.kafka.bootstrap_servers
    producer = AIOKafkaProducer(bootstrap_servers=servers, linger_ms=20, acks="all", enable_idempotence=True,
                                compression_type="lz4")
    await producer.start()
    started = time.perf_counter()
    try:
        batch = []
        for i in range(count):
            batch.append(await producer.send(topic, payload, key=f"node-{i % 64}".encode()))
        await asyncio.gather(*batch)
    finally:
        await producer.stop()
    produce_s = time.perf_counter() - started

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=servers, group_id=f"{topic}-aioreader",
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    seen = 0
    started = time.perf_counter()
    try:
        while seen < count and time.perf_counter() - started < 120:
            batches = await consumer.getmany(timeout_ms=500, max_records=2000)
            seen += sum(len(records) for records in batches.values())
    finally:
        await consumer.stop()
    return produce_s, time.perf_counter() - started


def run(ctx: Context) -> list[Result]:
    count = 5_000 if ctx.quick else 30_000
    payload = _payload()
    mb = count * len(payload) / 1e6
    results = []
    for client in ("confluent-kafka", "aiokafka"):
        topic = GPU_SAMPLES.name(f"{ctx.topic_prefix}-{client}")
        ensure_topics(ctx.kafka, [GPU_SAMPLES], f"{ctx.topic_prefix}-{client}")
        if client == "confluent-kafka":
            produce_s, consume_s = _confluent(ctx, topic, count, payload)
        else:
            produce_s, consume_s = asyncio.run(_aiokafka(ctx, topic, count, payload))
        for direction, seconds in (("produce", produce_s), ("consume", consume_s)):
            rate = count / seconds
            ctx.shared[f"{client}.{direction}.msgs_per_s"] = rate
            results.append(Result(BENCH, f"{client} {direction} msgs/s ({len(payload)} B)", rate, "msg/s"))
            results.append(Result(BENCH, f"{client} {direction} MB/s", mb / seconds, "MB/s"))
    return results
