"""Applied migrations are frozen: each one's statements, rendered, have the text they had when the
migration was released (pinned by hash here), so a store migrated long ago and one migrated today
are the same.

A new migration fails :func:`test_every_migration_is_pinned` until its hash is added below (the
failure prints it). An edit to a pinned migration fails it as well: write a new migration instead.
When a released migration built from code (the column spec, :func:`sinks.sample_json.ddl_update`)
renders differently because that code changed, write its statements out as the literal SQL they
rendered before (``git show``), as :mod:`sinks.migration_additions` holds migrations 8-12.
"""

from __future__ import annotations

import hashlib
import inspect

from sinks import migration_rebuilds
from sinks.ddl import TtlDays
from sinks.migrations import MIGRATIONS

PINNED: dict[int, str] = {
    1: "3f7b22ff37cd836211c43dd3cc6de876e1b0270e094b241ea735735fac42d8a0",
    2: "fb802a99b3eac511790d7d2e1e7db2f58d15565534899d046eb1ba67e6b1b026",
    3: "7bfcceb9e48064c80e84c0dc48698984ece97cb23aa58bc46beec2f1607c88af",
    4: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    5: "53b2fca53c0b25f7b1ad046c23b4339bf8717956c4017c13abaf95f0f46a5e66",
    6: "a3fa26315c22d324c99ef77d951b72f877e583e2a556810648e2ee7cf5232194",
    7: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    8: "4b02cdf3e272fbd4fe824e9cd0c26197acab5e85c341d2d6b38d314f496a587c",
    9: "24ec4a5b9417342df1f0b58c3fe36867f18ea2befdc82278fcb90e7ddd662e48",
    10: "3ee769ab6d335f21d615287321e2c2dc7b58397583f387631191b893538a62ba",
    11: "c98ec2ff8e69ca66a8fb35dcecf102b01321a7a4781de5aa54e9767a0fb0f3c9",
    12: "d3be91b129e1cb22d7c252be624c504dce379963ebbd9e10bb530652d6229be7",
    13: "58607106a9f0b4ef37b4bf43d41862c7fcbea6bc3b7ed8ec9c7eef058abb9e19",
    14: "e3dfdb84074aa0c8dd514886829b9d43f755cd0b7aee62ce434f82426b6958af",
    15: "cf151784503534449cf86a229652b223cdbaa9b030a74aba2cc6866634a3b3ae",
    16: "94085d66af175205b369ba11184489793761a23dc8625ff446a5086f9d5e77ce",
    17: "c43ba4f0cd388faa770ecc53cd2b00648f6cb052c06393f47261363841517a98",
    18: "e550dedbe00754787d624a3ad3de415ba81137dcbb2645e8e65bb9cd8d991f99",
}
"""sha256 of each migration's statements rendered with :data:`TTL`, joined by ``\\n;\\n``."""

REBUILDS = "9b5b510020a973818edd290629f90ab4c55621c461420bde06334088b329e1de"
"""sha256 of :mod:`sinks.migration_rebuilds`: migrations 4 and 7 look at the store first, so their
code is their text."""

TTL = TtlDays(raw=11, state=22, rollup=33)
"""TTLs unlike the defaults, so that a TTL written in place of its placeholder changes the hash."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_every_migration_is_pinned() -> None:
    rendered = {m.version: _digest("\n;\n".join(m.statements(TTL))) for m in MIGRATIONS}
    changed = {version: digest for version, digest in rendered.items() if PINNED.get(version) != digest}
    assert not changed, (
        f"migrations {sorted(changed)} render a text that is not pinned: an applied migration must not change "
        f"(add a new one); a new migration is pinned by adding {changed} to PINNED")
    assert sorted(PINNED) == sorted(rendered), "a pinned migration is gone from sinks.migrations.MIGRATIONS"


def test_the_migrations_that_look_at_the_store_are_pinned() -> None:
    assert _digest(inspect.getsource(migration_rebuilds)) == REBUILDS, (
        "sinks/migration_rebuilds.py changed: migrations 4-7 are applied and frozen (add a new migration)")


def test_every_ttl_placeholder_is_filled() -> None:
    for migration in MIGRATIONS:
        for statement in migration.statements(TTL):
            assert "_ttl_days}" not in statement, (migration.version, statement[:200])
