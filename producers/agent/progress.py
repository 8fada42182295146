"""Training progress from the pods of this node: ``steps=+10 tokens=+40960`` -> ``workload.progress.v1``.

A training job knows its steps, tokens and samples; gpulens knows what its GPUs cost. Joining the
two gives cost per step, but a job must not need credentials to report, and one pod must not be
able to report for another. So the agent listens on two node-local paths and takes the sender's
pod from what the kernel says about the sender, never from the line itself:

- a unix datagram socket (default ``/var/run/gpulens/progress.sock``, shared with pods through a
  hostPath): each datagram carries the sender's PID as the kernel saw it (``SO_PASSCRED`` /
  ``SCM_CREDENTIALS``, the datagram form of ``SO_PEERCRED``), and the PID goes through the same
  ``/proc/<pid>/cgroup`` resolver as GPU processes (:mod:`producers.agent.cgroup`);
- a UDP port on the node's IP (pods find it through the downward API's ``status.hostIP``), for
  clusters that forbid hostPath: the datagram's source address is looked up among the addresses
  of the pods running on this node (:class:`ProcNetPodAddresses`: each pod's network namespace,
  read from ``/proc/<pid>/net`` of one of its processes, with the host PID namespace the agent
  already has). Addresses shared by several pods (host network) attribute to nobody.

Allocator lines (``allocator device=0 reserved=N ...``, :mod:`producers.agent.allocator`) ride the
same paths and attribution and become ``workload.allocator.v1``.
Lines are increments (``key=+N``, keys ``steps``, ``tokens``, ``samples``); the agent keeps one
running total per pod and emits the totals every ``interval_s`` for the pods that reported since
(key = pod uid), which is what ``workload_progress`` and cost per step downstream expect.
Everything a sender controls is bounded: datagram size, datagrams per second per pod (all the
pod's processes and addresses share one budget; a sender no pod owns is rejected before its
line is read, and keeps no state), pods tracked; numbers are ASCII digits only. A rejected
datagram is counted by reason (exactly, in the metrics) and summarised in one log line per
interval (counts by reason, one example each), so no number of senders can flood the log;
nothing a sender does stops the agent.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import re
import selectors
import socket
import stat
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, Protocol

from common.errors import PermanentError
from common.logs import get_logger
from common.metrics import MetricsRegistry
from producers.agent.allocator import AllocatorLedger, MalformedAllocatorLine, is_allocator_line, parse_allocator_line
from producers.agent.cgroup import ProcessResolver
from producers.agent.line_fields import key_value_fields
from schemas.messages import MAX_PROGRESS_TOTAL, AllocatorDevice, WorkloadAllocator, WorkloadProgress

log = get_logger(__name__)

PathName = Literal["unix", "udp"]
KEYS = ("steps", "tokens", "samples")
MAX_INCREMENT = 1e12
"""Largest increment of one key in one line (a typo or an attack, not a training step)."""
_UCRED = struct.Struct("iII")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
"""An increment after its ``+``: ASCII digits, an optional fraction and exponent (what the client's
``%.17g`` writes). Not Python's ``float()`` grammar, which also takes other scripts' digits
(Arabic-Indic, fullwidth), underscores (``1_000``), ``inf`` and ``nan``."""


class MalformedLine(PermanentError, ValueError):
    """A line the agent does not accept; ``reason`` is the counter label (a short fixed word)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class ProgressDelta:
    """Increments reported by one line (absent = not reported)."""

    steps: float | None = None
    tokens: float | None = None
    samples: float | None = None


def parse_progress_line(line: str) -> ProgressDelta:
    """``steps=+10 tokens=+40960 samples=+32`` -> increments; raises :class:`MalformedLine`."""
    fields = line.split()
    if not fields:
        raise MalformedLine("empty", "no key=+N field")
    values: dict[str, float] = {}
    for key, text in key_value_fields(fields, KEYS, MalformedLine, form="key=+N"):
        if not text.startswith("+"):
            raise MalformedLine("bad_number", f"{key}={text[:40]!r}: increments are written +N")
        if not _NUMBER.fullmatch(text, 1):
            raise MalformedLine("bad_number", f"{key}={text[:40]!r}: ASCII digits [.digits][e[+-]digits]")
        value = float(text[1:])
        if not math.isfinite(value) or value < 0 or value > MAX_INCREMENT:
            raise MalformedLine("bad_number", f"{key}={text[:40]!r}: not within 0..{MAX_INCREMENT:g}")
        values[key] = value
    return ProgressDelta(**values)


@dataclass
class _PodTotals:
    steps_total: float | None = None
    tokens_total: float | None = None
    samples_total: float | None = None
    dirty: bool = False


class ProgressLedger:
    """Running totals per pod uid, at most ``max_pods`` (the least recently reporting one goes first)."""

    def __init__(self, max_pods: int = 1024) -> None:
        self.max_pods = max_pods
        self._pods: OrderedDict[str, _PodTotals] = OrderedDict()

    def add(self, pod_uid: str, delta: ProgressDelta) -> None:
        totals = self._pods.pop(pod_uid, None) or _PodTotals()
        for key in KEYS:
            value = getattr(delta, key)
            if value is not None:
                name = f"{key}_total"
                # a total saturates at the contract's bound (2^53) instead of making an invalid message
                setattr(totals, name, min((getattr(totals, name) or 0.0) + value, MAX_PROGRESS_TOTAL))
        totals.dirty = True
        self._pods[pod_uid] = totals
        while len(self._pods) > self.max_pods:
            self._pods.popitem(last=False)

    def drain(self) -> Iterator[tuple[str, float | None, float | None, float | None]]:
        """(pod uid, steps total, tokens total, samples total) of every pod changed since the last drain."""
        for pod_uid, totals in self._pods.items():
            if totals.dirty:
                totals.dirty = False
                yield pod_uid, totals.steps_total, totals.tokens_total, totals.samples_total


class TokenBucket:
    """``rate_per_s`` lines per second with bursts of ``burst`` lines."""

    def __init__(self, rate_per_s: float, burst: float, now_s: float) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.tokens = burst
        self.at_s = now_s

    def take(self, now_s: float) -> bool:
        self.tokens = min(self.burst, self.tokens + max(0.0, now_s - self.at_s) * self.rate_per_s)
        self.at_s = now_s
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class PodAddressBook(Protocol):
    def pod_for_address(self, address: str) -> str | None:
        """The uid of the one pod on this node that owns ``address``; None if none or several do."""


def _fib_trie_local_addresses(text: str) -> set[str]:
    """Local IPv4 addresses of a network namespace, from its ``/proc/<pid>/net/fib_trie``."""
    found: set[str] = set()
    last: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("|--", "+--")):
            last = stripped[3:].split()[0]
        elif last is not None and stripped.startswith("/32 host LOCAL"):
            found.add(last)
    return found


def _if_inet6_addresses(text: str) -> set[str]:
    """Addresses of a network namespace, from its ``/proc/<pid>/net/if_inet6`` (32 hex digits each)."""
    found: set[str] = set()
    for line in text.splitlines():
        fields = line.split()
        if fields and len(fields[0]) == 32:
            try:
                found.add(str(ipaddress.IPv6Address(int(fields[0], 16))))
            except ValueError:
                continue
    return found


def namespace_addresses(proc_root: Path, pid: int | str) -> set[str]:
    """Non-loopback addresses of the network namespace ``pid`` lives in (empty if unreadable)."""
    found: set[str] = set()
    for name, parse in (("fib_trie", _fib_trie_local_addresses), ("if_inet6", _if_inet6_addresses)):
        try:
            found |= parse((proc_root / str(pid) / "net" / name).read_text())
        except OSError:
            continue
    return {a for a in found if not ipaddress.ip_address(a).is_loopback}


class ProcNetPodAddresses:
    """Pod addresses from ``/proc``: every PID's cgroup names its pod, its ``net/`` its addresses.

    Rescanned on a lookup miss at most once per ``min_rescan_s`` (a new pod's first datagrams may
    arrive before its first rescan; they are counted as unattributed). The host's own addresses
    (those of PID 1's namespace) never attribute: host-network pods all share them.
    """

    def __init__(self, proc_root: Path, resolver: ProcessResolver, *, min_rescan_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.proc_root = proc_root
        self.resolver = resolver
        self.min_rescan_s = min_rescan_s
        self.clock = clock
        self._owners: dict[str, str | None] = {}
        self._scanned_at: float | None = None

    def rescan(self) -> None:
        owners: dict[str, str | None] = {}
        host = namespace_addresses(self.proc_root, 1)
        seen_pods: set[str] = set()
        try:
            entries = [e.name for e in os.scandir(self.proc_root) if e.name.isdigit()]
        except OSError:
            entries = []
        for pid in entries:
            ref = self.resolver.resolve(int(pid))
            if ref is None or ref.pod_uid is None or ref.pod_uid in seen_pods:
                continue
            addresses = namespace_addresses(self.proc_root, pid) - host
            if not addresses:
                continue
            seen_pods.add(ref.pod_uid)
            for address in addresses:
                owners[address] = ref.pod_uid if owners.get(address, ref.pod_uid) == ref.pod_uid else None
        for address in host:
            owners[address] = None
        self._owners = owners
        self._scanned_at = self.clock()

    def pod_for_address(self, address: str) -> str | None:
        address = _normalise(address)
        if address not in self._owners and (
                self._scanned_at is None or self.clock() - self._scanned_at >= self.min_rescan_s):
            self.rescan()
        return self._owners.get(address)


class StaticPodAddresses:
    """A fixed address -> pod uid map (tests, the simulator)."""

    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = {_normalise(a): uid for a, uid in mapping.items()}

    def pod_for_address(self, address: str) -> str | None:
        return self.mapping.get(_normalise(address))


def _normalise(address: str) -> str:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


class ProgressMetrics:
    """Counters of the progress paths, on the agent's registry."""

    def __init__(self, registry: MetricsRegistry) -> None:
        self.lines = registry.counter(
            "agent_progress_lines_total",
            "Progress lines received, by path and outcome (accepted, malformed, too_large, rate_limited, "
            "unattributed)", ("path", "outcome"))
        self.malformed = registry.counter(
            "agent_progress_malformed_total", "Malformed progress lines by path and reason", ("path", "reason"))
        self.messages = registry.counter(
            "agent_progress_messages_total", "progress and allocator messages handed to the sink")
        self.dropped = registry.counter(
            "agent_progress_messages_dropped_total", "progress and allocator messages dropped (local buffer full)")


@dataclass(frozen=True)
class ProgressLimits:
    """What one sender can make the agent do."""

    max_datagram_bytes: int = 1024
    rate_per_s: float = 20.0
    """Datagrams per second per pod (all its PIDs and addresses together), with bursts of twice as many."""
    max_senders: int = 4096
    """Rate budgets remembered, one per pod that sent (least recent forgotten first)."""
    max_pods: int = 1024
    log_interval_s: float = 60.0
    """Rejections are logged as one summary line per interval (the first at once)."""


PodNames = Callable[[str], tuple[str, str] | None]
"""pod uid -> (namespace, name) when the agent can tell (from its last GPU sample)."""


class ProgressCollector:
    """Turns datagrams from attributed senders into per-pod totals and ``WorkloadProgress`` messages.

    Pure: the listeners below feed it what the kernel says (PID, source address); tests feed it
    directly. Attribution goes only through ``resolver`` (PID -> cgroup -> pod) and ``addresses``
    (source address -> pod); nothing in a line can name a pod.
    """

    def __init__(self, resolver: ProcessResolver, addresses: PodAddressBook, metrics: ProgressMetrics, *,
                 limits: ProgressLimits | None = None, pod_names: PodNames | None = None,
                 clock: Callable[[], float] = time.monotonic, node: str = "") -> None:
        self.resolver = resolver
        self.addresses = addresses
        self.metrics = metrics
        self.limits = limits or ProgressLimits()
        self.pod_names = pod_names
        self.clock = clock
        self.ledger = ProgressLedger(self.limits.max_pods)
        self.allocator = AllocatorLedger(self.limits.max_pods)
        self.node = node
        """This agent's node, on the ``workload.allocator.v1`` messages."""
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        """Rate budgets by pod uid (both paths together), at most ``limits.max_senders``."""
        self._rejected: dict[str, int] = {}
        """Rejections since the last summary by ``path/reason`` (fixed words: a bounded dict)."""
        self._examples: dict[str, str] = {}
        """The first rejection of each ``path/reason`` since the last summary (sender and detail)."""
        self._logged_at_s: float | None = None
        self._lock = threading.Lock()

    @property
    def rate_budgets(self) -> int:
        """How many rate budgets are held (one per pod that sent recently; never one per sender)."""
        return len(self._buckets)

    def _bucket(self, key: str, now_s: float) -> TokenBucket:
        bucket = self._buckets.pop(key, None) or TokenBucket(self.limits.rate_per_s, 2 * self.limits.rate_per_s,
                                                              now_s)
        self._buckets[key] = bucket
        while len(self._buckets) > self.limits.max_senders:
            self._buckets.popitem(last=False)
        return bucket

    def _reject(self, path: PathName, sender_id: str, outcome: str, reason: str, detail: str, now_s: float) -> None:
        self.metrics.lines.labels(path, outcome).inc()
        if outcome == "malformed":
            self.metrics.malformed.labels(path, reason).inc()
        name = f"{path}/{reason}"
        self._rejected[name] = self._rejected.get(name, 0) + 1
        self._examples.setdefault(name, f"{sender_id}: {detail}")
        self._log_rejections(now_s, force=False)

    def _log_rejections(self, now_s: float, *, force: bool) -> None:
        if not self._rejected or (not force and self._logged_at_s is not None
                                  and now_s - self._logged_at_s < self.limits.log_interval_s):
            return
        since = None if self._logged_at_s is None else round(now_s - self._logged_at_s, 3)
        log.warning("progress lines rejected", rejected=sum(self._rejected.values()), by_reason=dict(self._rejected),
                    examples=dict(self._examples), since_s=since)
        self._rejected.clear()
        self._examples.clear()
        self._logged_at_s = now_s

    def log_rejections(self, *, force: bool = False) -> None:
        """Log the rejections counted since the last summary when the interval is up (or ``force``)."""
        with self._lock:
            self._log_rejections(self.clock(), force=force)

    def from_unix(self, data: bytes, pid: int | None) -> str | None:
        """A datagram from the unix socket; ``pid`` from ``SCM_CREDENTIALS`` (None: none attached)."""
        return self._receive("unix", f"pid {pid}", data, lambda: self._pod_of_pid(pid))

    def from_udp(self, data: bytes, address: str) -> str | None:
        """A datagram from the UDP port; ``address`` is its source IP as the kernel received it."""
        return self._receive("udp", _normalise(address), data, lambda: self.addresses.pod_for_address(address))

    def _pod_of_pid(self, pid: int | None) -> str | None:
        if not pid or pid <= 0:
            return None
        ref = self.resolver.resolve(pid)
        return ref.pod_uid if ref is not None else None

    def _receive(self, path: PathName, sender_id: str, data: bytes, attribute: Callable[[], str | None]) -> str | None:
        """Accept or reject one datagram; returns the pod uid it was credited to."""
        now_s = self.clock()
        with self._lock:
            if len(data) > self.limits.max_datagram_bytes:
                self._reject(path, sender_id, "too_large", "too_large",
                             f"{len(data)} bytes > {self.limits.max_datagram_bytes}", now_s)
                return None
            pod_uid = attribute()
            if pod_uid is None:  # neither parsed nor remembered: a stranger costs one lookup
                self._reject(path, sender_id, "unattributed", "unattributed",
                             "sender is not a process of a pod on this node", now_s)
                return None
            # the budget is the pod's, whichever of its processes (or addresses) sends and on
            # either path: forking more senders buys no more
            if not self._bucket(pod_uid, now_s).take(now_s):
                self._reject(path, sender_id, "rate_limited", "rate_limited",
                             f"more than {self.limits.rate_per_s:g} datagrams/s", now_s)
                return None
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                self._reject(path, sender_id, "malformed", "not_utf8", "not UTF-8 text", now_s)
                return None
            deltas: list[ProgressDelta] = []
            devices: list[AllocatorDevice] = []
            for line in text.splitlines() or [""]:
                try:
                    if is_allocator_line(line):
                        devices.append(parse_allocator_line(line))
                    else:
                        deltas.append(parse_progress_line(line))
                except (MalformedLine, MalformedAllocatorLine) as exc:
                    self._reject(path, sender_id, "malformed", exc.reason, str(exc), now_s)
                    return None
            for delta in deltas:
                self.ledger.add(pod_uid, delta)
            for device in devices:
                self.allocator.add(pod_uid, device)
            self.metrics.lines.labels(path, "accepted").inc(len(deltas) + len(devices))
            return pod_uid

    def drain(self, ts: datetime) -> list[WorkloadProgress]:
        """One message per pod that reported since the last drain, with its running totals."""
        with self._lock:
            changed = list(self.ledger.drain())
        out = []
        for pod_uid, steps, tokens, samples in changed:
            names = self.pod_names(pod_uid) if self.pod_names is not None else None
            namespace, pod = names if names is not None else ("", "")
            out.append(WorkloadProgress(pod_uid=pod_uid, namespace=namespace, pod=pod, ts=ts, steps_total=steps,
                                        tokens_total=tokens, samples_total=samples))
        return out

    def drain_allocator(self, ts: datetime) -> list[WorkloadAllocator]:
        """One ``workload.allocator.v1`` per pod that reported allocator figures since the last drain."""
        with self._lock:
            return self.allocator.drain(ts, self.node, self.pod_names)


def bind_unix_datagram(path: Path) -> socket.socket:
    """A datagram socket at ``path`` that receives its senders' credentials, writable by every pod.

    A socket file left by a previous agent is replaced; one a live agent still listens on is not
    (raises ``OSError``), so two agents never steal each other's senders.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise OSError(f"{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()
        else:
            raise OSError(f"another process is listening on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.bind(str(path))
        os.chmod(path, 0o666)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def bind_udp(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.bind((address, port))
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _sender_pid(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= _UCRED.size:
            pid, _uid, _gid = _UCRED.unpack(payload[:_UCRED.size])
            return int(pid)
    return None


class ProgressListener:
    """The agent's progress paths on one thread: receive, attribute, and every ``interval_s`` emit.

    ``emit`` gets each ``WorkloadProgress``, ``emit_allocator`` each ``WorkloadAllocator`` (the agent's
    Kafka or stdout sink; without it allocator figures are kept, never sent); ``wall_clock`` gives the
    messages' timestamps (seconds since the epoch).
    """

    def __init__(self, collector: ProgressCollector, emit: Callable[[WorkloadProgress], bool], *,
                 interval_s: float, socket_path: Path | None = None, udp: tuple[str, int] | None = None,
                 wall_clock: Callable[[], float] = time.time,
                 emit_allocator: Callable[[WorkloadAllocator], bool] | None = None) -> None:
        self.collector = collector
        self.emit = emit
        self.emit_allocator = emit_allocator
        self.interval_s = interval_s
        self.wall_clock = wall_clock
        self.socket_path = socket_path
        self.unix_sock: socket.socket | None = None
        self.udp_sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if socket_path is not None:
            try:
                self.unix_sock = bind_unix_datagram(socket_path)
                log.info("progress socket listening", path=str(socket_path))
            except OSError as exc:
                log.warning("progress socket disabled", path=str(socket_path), error=str(exc))
        if udp is not None:
            try:
                self.udp_sock = bind_udp(*udp)
                log.info("progress UDP port listening", address=udp[0], port=self.udp_port)
            except OSError as exc:
                log.warning("progress UDP port disabled", address=udp[0], port=udp[1], error=str(exc))

    @property
    def udp_port(self) -> int | None:
        return int(self.udp_sock.getsockname()[1]) if self.udp_sock is not None else None

    @property
    def listening(self) -> bool:
        return self.unix_sock is not None or self.udp_sock is not None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="gpulens-progress", daemon=True)
        self._thread.start()

    def flush(self) -> int:
        """Emit the totals of every pod that reported since the last flush; returns messages emitted."""
        ts = datetime.fromtimestamp(self.wall_clock(), UTC)
        outcomes = [self.emit(message) for message in self.collector.drain(ts)]
        if self.emit_allocator is not None:
            outcomes += [self.emit_allocator(message) for message in self.collector.drain_allocator(ts)]
        sent = sum(outcomes)
        self.collector.metrics.messages.inc(sent)
        self.collector.metrics.dropped.inc(len(outcomes) - sent)
        self.collector.log_rejections()
        return sent

    def _read_unix(self, sock: socket.socket) -> None:
        space = socket.CMSG_SPACE(_UCRED.size)
        limit = self.collector.limits.max_datagram_bytes + 1
        for _ in range(256):
            try:
                data, ancdata, _flags, _addr = sock.recvmsg(limit, space)
            except (BlockingIOError, InterruptedError):
                return
            self.collector.from_unix(data, _sender_pid(ancdata))

    def _read_udp(self, sock: socket.socket) -> None:
        limit = self.collector.limits.max_datagram_bytes + 1
        for _ in range(256):
            try:
                data, addr = sock.recvfrom(limit)
            except (BlockingIOError, InterruptedError):
                return
            self.collector.from_udp(data, str(addr[0]))

    def _loop(self) -> None:
        selector = selectors.DefaultSelector()
        readers: dict[socket.socket, Callable[[socket.socket], None]] = {}
        if self.unix_sock is not None:
            readers[self.unix_sock] = self._read_unix
        if self.udp_sock is not None:
            readers[self.udp_sock] = self._read_udp
        for sock, reader in readers.items():
            selector.register(sock, selectors.EVENT_READ, (sock, reader))
        due = time.monotonic() + self.interval_s
        try:
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=max(0.0, min(0.5, due - time.monotonic()))):
                    ready, read = key.data
                    try:
                        read(ready)
                    except OSError as exc:
                        log.warning("progress receive failed", error=str(exc))
                if time.monotonic() >= due:
                    self._safe_flush()
                    due = time.monotonic() + self.interval_s
        finally:
            selector.close()

    def _safe_flush(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # a sink failure must not end the progress paths
            log.error("progress flush failed", error=str(exc))

    def close(self) -> None:
        """Stop the thread, read what is queued, emit the totals, close the sockets, remove the socket file."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        for sock, read in ((self.unix_sock, self._read_unix), (self.udp_sock, self._read_udp)):
            if sock is not None:
                with contextlib.suppress(OSError):
                    read(sock)
        self._safe_flush()
        self.collector.log_rejections(force=True)
        if self.unix_sock is not None:
            self.unix_sock.close()
            if self.socket_path is not None:
                with contextlib.suppress(OSError):
                    self.socket_path.unlink()
        if self.udp_sock is not None:
            self.udp_sock.close()
