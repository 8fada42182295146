"""Which pod and container the kubelet assigned each GPU / MIG device to: the PodResources API.

The kubelet serves ``PodResourcesLister`` (gRPC, v1) on a unix socket,
``/var/lib/kubelet/pod-resources/kubelet.sock``. ``List`` returns every pod on the node with the
device ids each container received per extended resource; for the NVIDIA device plugin those are
GPU UUIDs (``GPU-...``), MIG device UUIDs (``MIG-...``), time-slicing replicas (``GPU-...::3``)
or, with ``deviceIDStrategy=index``, GPU indexes. This module returns them unchanged; the sampler
normalises them against what NVML reports.

Devices allocated through Dynamic Resource Allocation come in each container's
``dynamic_resources``: per claim (name, namespace) the devices as DRA names them, ``(driver,
pool, device)``, with their CDI ids and, for a device several claims share (consumable capacity),
a ``share_id``. No UUID is there: the agent passes them on as
:class:`schemas.messages.DraAllocation` and the node stage resolves them to GPUs through the
ResourceSlices the watcher reports (docs/dra.md), so the agent needs no API token. Only devices of
GPU drivers are kept: a driver in the domain of a GPU resource prefix (``nvidia.com/`` keeps
``gpu.nvidia.com``). The kubelet's answer is the node's, yet bounded here all the same: at most
:data:`DRA_DECODE_LIMIT` devices are decoded, at most ``MAX_DRA_ALLOCATIONS`` reach the sample,
and an entry whose names exceed the message bounds is left out; each such cut is one line in
:attr:`PodResourcesAnswer.problems` (the sample's ``errors``), never an exception.

Why no grpcio here: the agent makes one unary call per sample, and grpcio with its protobuf
runtime costs the DaemonSet's process about 13 MiB of its 64 MiB budget (docs/agent.md). The call
is spoken directly: gRPC over HTTP/2 (``h2`` does the framing, HPACK and flow control; this is the
only module that imports it) on a fresh connection per call, so a kubelet restart (a new socket)
is survived without restarting the agent; the few protobuf fields used are decoded by hand and
every other field is skipped, as protobuf's own rules require. The wire protocol is the same one
grpcio speaks: the tests run this client against a real grpcio server
(:mod:`producers.agent.fake_kubelet`). If the socket does not exist (PodResources disabled, or not
mounted) the client warns once and returns no assignments: the agent then attributes GPUs through
processes only.

Note: PodResources does not report pod UIDs, so :class:`schemas.messages.PodRef` from here carries
``pod_uid=None``; the sampler links processes (which carry a pod UID from their cgroup) to
assignments by elimination, and the stream jobs join by UID with the watcher's pod state.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pydantic

from common.errors import RetriableError
from common.logs import get_logger
from schemas.messages import MAX_CDI_IDS, MAX_DRA_ALLOCATIONS, MAX_TEXT_CHARS, DraAllocation, PodRef

log = get_logger(__name__)

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""The largest answer accepted (grpcio's limit was set to the same): a node's pods fit many times."""

SERVICE = "/v1.PodResourcesLister"
GRPC_STATUS = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
               "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
               "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")
"""gRPC status code -> name (the codes are fixed by the gRPC protocol)."""


class PodResourcesError(RetriableError):
    """The kubelet did not answer; the message says why (socket, status code, details)."""


DRA_DECODE_LIMIT = 4 * MAX_DRA_ALLOCATIONS
"""DRA devices decoded from one answer at most (non-GPU drivers' included); the rest are counted only."""


@dataclass(frozen=True)
class PodResourcesAnswer:
    """What one ``List`` answer says about the node's GPUs."""

    assignments: dict[str, list[PodRef]] = field(default_factory=dict)
    """Device-plugin device id (GPU UUID, MIG UUID, replica id or index) -> pods/containers holding it."""
    dra_allocations: list[DraAllocation] = field(default_factory=list)
    """GPU-driver devices allocated through DRA, one per (container, claim, device, share)."""
    problems: list[str] = field(default_factory=list)
    """What was left out of the answer and why: one line per kind of cut (the sample's ``errors``)."""


class PodResourcesSource(Protocol):
    def read(self) -> PodResourcesAnswer:
        """The node's device-plugin assignments and DRA allocations, from one call.

        Raises :class:`PodResourcesError` when the source exists but does not answer.
        """


@dataclass(frozen=True)
class ContainerDevices:
    """Devices of one extended resource (e.g. ``nvidia.com/gpu``) a container holds."""

    resource_name: str
    device_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ClaimDevice:
    """One device of a DRA claim (``ClaimResource``): ``(driver_name, pool_name, device_name)`` names it."""

    driver_name: str
    pool_name: str
    device_name: str
    cdi_ids: list[str] = field(default_factory=list)
    """The first ``MAX_CDI_IDS`` CDI device ids."""
    share_id: str | None = None
    cdi_ids_dropped: int = 0
    """CDI ids past the first ``MAX_CDI_IDS``: counted, not decoded."""


@dataclass(frozen=True)
class DynamicResource:
    """The devices one DRA claim gave a container."""

    claim_name: str
    claim_namespace: str
    devices: list[ClaimDevice] = field(default_factory=list)


@dataclass(frozen=True)
class ContainerResources:
    name: str
    devices: list[ContainerDevices] = field(default_factory=list)
    dynamic_resources: list[DynamicResource] = field(default_factory=list)


@dataclass(frozen=True)
class PodResources:
    name: str
    namespace: str
    containers: list[ContainerResources] = field(default_factory=list)


def unix_target(socket_path: Path) -> str:
    """The gRPC target name of a unix socket (what grpcio servers and clients are given)."""
    return f"unix://{socket_path.absolute()}"


class _CallFailed(RetriableError):
    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")


def grpc_unary_call(socket_path: Path, method: str, request: bytes, timeout_s: float) -> bytes:
    """One unary gRPC call over HTTP/2 on a unix socket: the response message's bytes.

    Raises :class:`_CallFailed` with the gRPC status name (``UNAVAILABLE`` when nothing answers,
    ``DEADLINE_EXCEEDED`` past ``timeout_s``, the server's own status otherwise).
    """
    deadline = time.monotonic() + timeout_s
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(str(socket_path))
            conn.initiate_connection()
            stream = conn.get_next_available_stream_id()
            conn.send_headers(stream, [
                (":method", "POST"), (":scheme", "http"), (":path", method), (":authority", "localhost"),
                ("content-type", "application/grpc"), ("te", "trailers"),
                ("grpc-timeout", f"{max(1, int(timeout_s * 1000))}m"), ("user-agent", "gpulens-agent"),
            ])
            conn.send_data(stream, b"\x00" + len(request).to_bytes(4, "big") + request, end_stream=True)
            message = _read_response(sock, conn, stream, deadline)
            conn.close_connection()  # a polite GOAWAY: the kubelet logs no broken connection
            with contextlib.suppress(OSError):
                sock.sendall(conn.data_to_send())
            return message
    except TimeoutError:
        raise _CallFailed("DEADLINE_EXCEEDED", f"no answer within {timeout_s:g}s") from None
    except OSError as exc:
        raise _CallFailed("UNAVAILABLE", f"{socket_path}: {exc.strerror or exc}") from None
    except h2.exceptions.ProtocolError as exc:
        raise _CallFailed("INTERNAL", f"HTTP/2 protocol error: {exc}") from None


def _read_response(sock: socket.socket, conn: h2.connection.H2Connection, stream: int, deadline: float) -> bytes:
    headers: dict[str, str] = {}
    body = bytearray()
    while True:
        if outgoing := conn.data_to_send():
            sock.sendall(outgoing)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        sock.settimeout(remaining)
        chunk = sock.recv(65536)
        if not chunk:
            raise _CallFailed("UNAVAILABLE", "the kubelet closed the connection before answering")
        for event in conn.receive_data(chunk):
            if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                headers.update((str(k), str(v)) for k, v in event.headers)
            elif isinstance(event, h2.events.DataReceived):
                body += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, stream)
                if len(body) > MAX_RESPONSE_BYTES + 5:
                    raise _CallFailed("RESOURCE_EXHAUSTED", f"answer larger than {MAX_RESPONSE_BYTES} bytes")
            elif isinstance(event, h2.events.StreamReset):
                code = _h2_code(event.error_code)
                raise _CallFailed("UNAVAILABLE", f"the kubelet reset the call (HTTP/2 {code})")
            elif isinstance(event, h2.events.ConnectionTerminated):
                code = _h2_code(event.error_code)
                raise _CallFailed("UNAVAILABLE", f"the kubelet closed the connection (HTTP/2 {code})")
            elif isinstance(event, h2.events.StreamEnded):
                return _grpc_message(headers, bytes(body))


def _h2_code(code: object) -> str:
    return str(getattr(code, "name", code))


def _grpc_message(headers: dict[str, str], body: bytes) -> bytes:
    if headers.get(":status") != "200":
        raise _CallFailed("UNKNOWN", f"HTTP status {headers.get(':status')} (not a gRPC server?)")
    status = headers.get("grpc-status")
    if status is None:
        raise _CallFailed("INTERNAL", "the answer has no grpc-status")
    if status != "0":
        name = GRPC_STATUS[int(status)] if status.isdigit() and int(status) < len(GRPC_STATUS) else status
        raise _CallFailed(name, unquote(headers.get("grpc-message", "")))
    if len(body) < 5 or body[0] != 0 or int.from_bytes(body[1:5], "big") != len(body) - 5:
        raise _CallFailed("INTERNAL", "the answer is not one uncompressed gRPC message")
    return body[5:]


def _fields(buf: bytes) -> Iterator[tuple[int, bytes]]:
    """(field number, bytes) of the length-delimited fields of a protobuf message; others skipped."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > end:
                raise ValueError("field runs past the end of its message")
            yield number, buf[pos:pos + size]
            pos += size
        else:
            raise ValueError(f"wire type {wire} of field {number}")
    if pos != end:
        raise ValueError("truncated field")


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _text(raw: bytes) -> str:
    return raw.decode("utf-8")


def _container_devices(buf: bytes) -> ContainerDevices:
    resource, ids = "", []
    for number, raw in _fields(buf):
        if number == 1:
            resource = _text(raw)
        elif number == 2:
            ids.append(_text(raw))
    return ContainerDevices(resource, ids)


class _DraBudget:
    """How many DRA devices one answer may still materialise; those past it are only counted."""

    def __init__(self, limit: int) -> None:
        self.wanted = limit > 0
        self.left = limit
        self.skipped = 0

    def take(self) -> bool:
        if self.left > 0:
            self.left -= 1
            return True
        self.skipped += 1
        return False


def _claim_device(buf: bytes) -> ClaimDevice:
    cdi_ids: list[str] = []
    driver = pool = device = ""
    share_id: str | None = None
    dropped = 0
    for number, raw in _fields(buf):
        if number == 1:  # CDIDevice { string name = 1; }
            if len(cdi_ids) < MAX_CDI_IDS:
                cdi_ids.extend(_text(name) for n, name in _fields(raw) if n == 1)
            else:
                dropped += 1
        elif number == 2:
            driver = _text(raw)
        elif number == 3:
            pool = _text(raw)
        elif number == 4:
            device = _text(raw)
        elif number == 5:
            share_id = _text(raw) or None
    return ClaimDevice(driver, pool, device, cdi_ids, share_id, dropped)


def _dynamic_resource(buf: bytes, budget: _DraBudget) -> DynamicResource:
    claim_name = claim_namespace = ""
    devices: list[ClaimDevice] = []
    for number, raw in _fields(buf):
        if number == 2:
            claim_name = _text(raw)
        elif number == 3:
            claim_namespace = _text(raw)
        elif number == 4 and budget.take():
            devices.append(_claim_device(raw))
    return DynamicResource(claim_name, claim_namespace, devices)  # a claim past the budget has none


def _container(buf: bytes, budget: _DraBudget) -> ContainerResources:
    name, devices, dynamic = "", [], []
    for number, raw in _fields(buf):
        if number == 1:
            name = _text(raw)
        elif number == 2:
            devices.append(_container_devices(raw))
        elif number == 5 and budget.wanted:
            claim = _dynamic_resource(raw, budget)
            if claim.devices:  # a claim without devices tells nothing: not kept, however many there are
                dynamic.append(claim)
    return ContainerResources(name, devices, dynamic)


def _pod(buf: bytes, budget: _DraBudget) -> PodResources:
    name = namespace = ""
    containers = []
    for number, raw in _fields(buf):
        if number == 1:
            name = _text(raw)
        elif number == 2:
            namespace = _text(raw)
        elif number == 3:
            containers.append(_container(raw, budget))
    return PodResources(name, namespace, containers)


@dataclass(frozen=True)
class DecodedList:
    """A decoded ``ListPodResourcesResponse``: its pods, and how many DRA devices were not decoded."""

    pods: list[PodResources]
    dra_devices_skipped: int = 0


def decode_list(buf: bytes, dra_limit: int = DRA_DECODE_LIMIT) -> DecodedList:
    """``ListPodResourcesResponse`` -> its pods (``pod_resources = 1``), with at most ``dra_limit``
    DRA devices (``ClaimResource``) decoded; the others are counted in ``dra_devices_skipped``
    (``dra_limit=0``: no ``dynamic_resources`` at all)."""
    budget = _DraBudget(dra_limit)
    pods = [_pod(raw, budget) for number, raw in _fields(buf) if number == 1]
    return DecodedList(pods, budget.skipped)


def decode_list_response(buf: bytes) -> list[PodResources]:
    """``ListPodResourcesResponse`` -> its pods with their device-plugin devices (with DRA: :func:`decode_list`)."""
    return decode_list(buf, dra_limit=0).pods


def _short(name: str, keep: int = 40) -> str:
    return name if len(name) <= keep else name[:keep] + "…"


def _line(text: str) -> str:
    return text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 1] + "…"


def gpu_driver_filter(resource_prefixes: Sequence[str]) -> Callable[[str], bool]:
    """Whether a DRA driver serves GPUs: it is a GPU resource prefix's domain or a name in it
    (``nvidia.com/`` -> ``gpu.nvidia.com``); no prefixes keep every driver."""
    domains = tuple(prefix.split("/", 1)[0].strip(".") for prefix in resource_prefixes if prefix.split("/", 1)[0])
    if not domains:
        return lambda driver: True
    suffixes = tuple("." + domain for domain in domains)
    return lambda driver: driver in domains or driver.endswith(suffixes)


def dra_allocations(
    pods: Sequence[PodResources], wanted_driver: Callable[[str], bool], skipped: int = 0
) -> tuple[list[DraAllocation], list[str]]:
    """The DRA devices of GPU drivers the pods' containers hold, as sample records, and what was
    left out (the lines of :attr:`PodResourcesAnswer.problems`).

    Each record is bounded like the message (names, CDI ids); one that is not is left out, CDI ids
    past ``MAX_CDI_IDS`` are dropped; the records are sorted (pod, container, claim, device) and at
    most ``MAX_DRA_ALLOCATIONS`` kept."""
    records: dict[tuple[str, ...], DraAllocation] = {}
    invalid: dict[str, int] = {}
    first_invalid = ""
    invalid_devices = cdi_cut = 0
    for pod in pods:
        for container in pod.containers:
            for claim in container.dynamic_resources:
                for device in claim.devices:
                    if not wanted_driver(device.driver_name):
                        continue
                    cdi_ids = device.cdi_ids
                    cdi_cut += device.cdi_ids_dropped
                    if len(cdi_ids) > MAX_CDI_IDS:  # a device built by hand (tests, fakes)
                        cdi_cut += len(cdi_ids) - MAX_CDI_IDS
                        cdi_ids = cdi_ids[:MAX_CDI_IDS]
                    try:
                        record = DraAllocation(
                            driver=device.driver_name, pool=device.pool_name, device=device.device_name,
                            namespace=pod.namespace, pod=pod.name, container=container.name,
                            claim_namespace=claim.claim_namespace, claim_name=claim.claim_name,
                            cdi_ids=cdi_ids, share_id=device.share_id)
                        records.setdefault(_allocation_order(record), record)
                    except pydantic.ValidationError as exc:
                        invalid_devices += 1
                        for name in sorted({str(error["loc"][0]) for error in exc.errors() if error["loc"]}):
                            invalid[name] = invalid.get(name, 0) + 1
                        first_invalid = first_invalid or (
                            f"{_short(pod.namespace)}/{_short(pod.name)} claim {_short(claim.claim_name)} "
                            f"device {_short(device.device_name)}")
    ordered = [records[key] for key in sorted(records)]
    problems: list[str] = []
    if skipped:
        problems.append(f"pod resources: {skipped} DRA devices not decoded (more than {DRA_DECODE_LIMIT} on the node)")
    if invalid:
        per_field = ", ".join(f"{name}: {count}" for name, count in sorted(invalid.items()))
        problems.append(_line(f"pod resources: {invalid_devices} DRA devices left out, a name beyond its bound "
                              f"({per_field}; the first: {first_invalid})"))
    if cdi_cut:
        problems.append(f"pod resources: {cdi_cut} CDI ids dropped (more than {MAX_CDI_IDS} for one DRA device)")
    if len(ordered) > MAX_DRA_ALLOCATIONS:
        problems.append(f"pod resources: {len(ordered) - MAX_DRA_ALLOCATIONS} DRA devices left out "
                        f"(more than {MAX_DRA_ALLOCATIONS} on the node)")
        ordered = ordered[:MAX_DRA_ALLOCATIONS]
    return ordered, problems


def _allocation_order(record: DraAllocation) -> tuple[str, ...]:
    return (record.namespace, record.pod, record.container, record.claim_namespace, record.claim_name,
            record.driver, record.pool, record.device, record.share_id or "")


def decode_allocatable_response(buf: bytes) -> list[ContainerDevices]:
    """``AllocatableResourcesResponse`` -> its devices (``devices = 1``)."""
    return [_container_devices(raw) for number, raw in _fields(buf) if number == 1]


class KubeletPodResources:
    """Client of the kubelet PodResources v1 API over its unix socket (gRPC, see module doc)."""

    def __init__(
        self,
        socket_path: Path = DEFAULT_SOCKET,
        timeout_s: float = 5.0,
        resource_prefixes: Sequence[str] = ("nvidia.com/",),
    ) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self.resource_prefixes = tuple(resource_prefixes)
        self._wanted_driver = gpu_driver_filter(self.resource_prefixes)
        self._lock = threading.Lock()
        self._warned_missing = False

    @property
    def available(self) -> bool:
        return self.socket_path.exists()

    def close(self) -> None:
        """Nothing to release: every call opens and closes its own connection."""

    def _socket_present(self) -> bool:
        if self.socket_path.exists():
            if self._warned_missing:
                log.info("kubelet pod-resources socket appeared", socket=str(self.socket_path))
                self._warned_missing = False
            return True
        if not self._warned_missing:
            log.warning(
                "kubelet pod-resources socket not found; attributing GPUs through processes only",
                socket=str(self.socket_path),
            )
            self._warned_missing = True
        return False

    def _wanted(self, resource_name: str) -> bool:
        return resource_name.startswith(self.resource_prefixes)

    def _call(self, name: str) -> bytes:
        with self._lock:
            try:
                return grpc_unary_call(self.socket_path, f"{SERVICE}/{name}", b"", self.timeout_s)
            except _CallFailed as exc:
                raise PodResourcesError(f"kubelet PodResources {name} failed: {exc}") from None

    def _list(self) -> DecodedList:
        raw = self._call("List")
        try:
            return decode_list(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise PodResourcesError(f"kubelet PodResources List failed: malformed answer: {exc}") from None

    def list_pods(self) -> list[PodResources]:
        """The pods of the ``List`` answer (raises :class:`PodResourcesError`)."""
        return self._list().pods

    def read(self) -> PodResourcesAnswer:
        if not self._socket_present():
            return PodResourcesAnswer()
        decoded = self._list()
        mapping: dict[str, list[PodRef]] = {}
        for pod in decoded.pods:
            for container in pod.containers:
                for devices in container.devices:
                    if not self._wanted(devices.resource_name):
                        continue
                    ref = PodRef(namespace=pod.namespace, pod=pod.name, container=container.name)
                    for device_id in devices.device_ids:
                        refs = mapping.setdefault(device_id, [])
                        if ref not in refs:
                            refs.append(ref)
        allocations, problems = dra_allocations(decoded.pods, self._wanted_driver, decoded.dra_devices_skipped)
        return PodResourcesAnswer(mapping, allocations, problems)

    def assignments(self) -> dict[str, list[PodRef]]:
        """The device-plugin part of :meth:`read`."""
        return self.read().assignments

    def allocatable(self) -> dict[str, list[str]]:
        """Resource name -> device ids the kubelet can hand out (``GetAllocatableResources``)."""
        if not self._socket_present():
            return {}
        raw = self._call("GetAllocatableResources")
        try:
            devices = decode_allocatable_response(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise PodResourcesError(
                f"kubelet PodResources GetAllocatableResources failed: malformed answer: {exc}") from None
        result: dict[str, list[str]] = {}
        for entry in devices:
            if self._wanted(entry.resource_name):
                result.setdefault(entry.resource_name, []).extend(entry.device_ids)
        return result
