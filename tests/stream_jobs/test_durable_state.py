"""A stage checkpoint's state write is confirmed only once the changelog has it: faust's table
writes go through a producer buffer that its commit does not reliably drain, so the worker awaits
each write's delivery (``DurableTable.confirm``) before acknowledging the inputs it applied."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from common.settings import WorkerSettings, load_settings
from stream_jobs.faust_app import StreamJobs
from stream_jobs.faust_port import DurableTable


class _Delivery(asyncio.Future[Any]):
    """What faust's ``send_changelog`` returns: a future with the message (and its partition)."""

    def __init__(self, partition: int) -> None:
        super().__init__()
        self.message = SimpleNamespace(partition=partition)


def _jobs(tmp_path: Path) -> StreamJobs:
    return StreamJobs(load_settings(WorkerSettings, topic_prefix="durable", data_dir=tmp_path,
                                    state_record_max_bytes=1024))


def test_confirm_waits_for_every_changelog_write_and_fails_with_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = _jobs(tmp_path)
    table = jobs.node_durable
    assert isinstance(table, DurableTable) and isinstance(jobs.cluster_durable, DurableTable)
    sent: list[_Delivery] = []

    def send_changelog(self: Any, partition: int | None, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(_Delivery(partition or 0))
        return sent[-1]

    monkeypatch.setattr(type(table).__mro__[1], "send_changelog", send_changelog)
    monkeypatch.setattr(table, "partition_for_key", lambda key: 0)

    async def scenario() -> None:
        jobs.node_table["p0"] = {"stages": {"gpu-01": "x" * 3000}}  # chunked: several records
        assert len(sent) > 1
        confirm = asyncio.ensure_future(table.confirm())
        for delivery in sent[:-1]:
            delivery.set_result(None)
        await asyncio.sleep(0.01)
        assert not confirm.done(), "confirmed before the last record was delivered"
        sent[-1].set_result(None)
        await asyncio.wait_for(confirm, 5)
        await asyncio.wait_for(table.confirm(), 5)  # nothing new: at once
        jobs.node_table["p0"] = {"stages": {}}
        for delivery in sent:
            if not delivery.done():
                delivery.set_exception(RuntimeError("delivery failed"))
        with pytest.raises(RuntimeError, match="delivery failed"):
            await asyncio.wait_for(table.confirm(), 5)

    asyncio.run(scenario())
