"""Dynamic Resource Allocation lowered to the device-plugin model: GPUs published as ResourceSlices,
asked for through ResourceClaims, counted as the extended resources they stand for.

Pure logic over the JSON the API server serves for ``resource.k8s.io/v1`` (no client library):
the watcher feeds every ResourceSlice, ResourceClaim and DeviceClass it sees into a
:class:`DraIndex`; :mod:`producers.watcher.translate` asks it for a node's GPU devices and
capacity and for a pod's GPU demand. docs/dra.md describes the rules; in short:

- **which devices are GPUs** is data: the driver table (:class:`DraDriverTable`, NVIDIA's
  ``gpu.nvidia.com`` by default, ``GPULENS_DRA_DRIVERS`` for others) says which drivers publish
  GPUs and which attributes carry a device's type, UUID, model, MIG profile, parent GPU and
  memory; a whole GPU counts as ``nvidia.com/gpu``, a MIG device as ``nvidia.com/mig-<profile>``;
- **capacity counts a physical GPU once**: devices consuming one shared counter set (partitionable
  devices: the full GPU and every MIG placement of it) are one GPU; a MIG device published with its
  parent (static MIG) counts as its profile and its parent not at all, as the device plugin's mixed
  strategy reports it; a device several claims may share (``allowMultipleAllocations``) is one device;
- **demand**: a claim counts once, in the demand of its first consumer (``status.reservedFor``;
  before allocation, the earliest-created pod that references it). An allocated claim counts the
  devices its results name, as their slices describe them; one not yet allocated counts its requests
  (the device class's resource times ``count``), so a pending pod whose claim cannot be allocated is
  pending demand. A device shared by several claims (consumable capacity) counts in the first of them
  (by namespace/name) only. The claim the scheduler creates for an extended resource served by DRA
  (``pod.status.extendedResourceClaimStatus``) is not counted: the pod's container request already is;
  nor is a request or result with ``adminAccess`` (monitoring access to devices others hold). A pod
  whose claims ask for GPUs is a GPU pod whatever its counted demand (:meth:`DraIndex.uses_gpus`);
- **a pod that ended keeps its demand**: once Succeeded, Failed or being deleted (or bound and its
  claim released, deallocated or deleted, which the resourceclaim controller does only after the
  end, perhaps seen before it), a pod's demand is what its claims gave it while it was live;
- **bounded**: at most ``MAX_DRA_DEVICES`` devices per node and per slice, texts cut to the
  contract's lengths, malformed parts skipped; :attr:`DraIndex.truncated` names what was cut.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from common.logs import get_logger
from common.settings import NVIDIA_DRA_DRIVERS, DraDriver
from producers.watcher.bounds import Trim
from producers.watcher.kube_json import JsonDict, JsonObject, json_dict, json_list, parse_quantity
from schemas.messages import (
    MAX_DNS_LABEL_CHARS,
    MAX_DRA_DEVICES,
    MAX_GPU_MEMORY_BYTES,
    MAX_ID_CHARS,
    MAX_NAME_CHARS,
    MAX_QUALIFIED_NAME_CHARS,
    MAX_SHORT_TEXT_CHARS,
    DraDevice,
)

log = get_logger(__name__)

__all__ = [
    "DRA_KINDS",
    "NVIDIA_DRA_DRIVERS",
    "DraChange",
    "DraDevice",
    "DraDriver",
    "DraDriverTable",
    "DraIndex",
    "DraKind",
]

K = TypeVar("K")
DraKind = Literal["resourceslices", "resourceclaims", "deviceclasses"]
DRA_KINDS: tuple[DraKind, ...] = ("deviceclasses", "resourceslices", "resourceclaims")
"""The collections followed, in the order the watcher lists them (before nodes and pods)."""
MAX_CLAIM_RESULTS = 256
"""Allocation results and requests read per claim (the API allows 32 requests; results follow them)."""
MAX_REQUEST_COUNT = 2**16
"""A request's ``count`` read at most (the API allows far fewer devices per claim)."""
PARTITION_ANY = "any"
"""The profile a partition request counts as when it names none (``nvidia.com/mig-any``)."""

_RESOURCE_NAME = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_CEL_DRIVER = re.compile(r"""device\.driver\s*==\s*["']([^"']{1,253})["']""")
_CEL_ATTRIBUTE = re.compile(
    r"""(?:\.([A-Za-z][A-Za-z0-9_]{0,62})|\[\s*["']([A-Za-z][A-Za-z0-9_./-]{0,62})["']\s*\])\s*==\s*["']([^"']{1,63})["']""")


class DraDriverTable:
    """The drivers whose devices are GPUs, by name (``GPULENS_DRA_DRIVERS``)."""

    def __init__(self, drivers: Iterable[DraDriver] = NVIDIA_DRA_DRIVERS) -> None:
        self.drivers: dict[str, DraDriver] = {d.driver: d for d in drivers}

    def get(self, driver: object) -> DraDriver | None:
        return self.drivers.get(driver) if isinstance(driver, str) else None

    def class_driver(self, class_name: str) -> tuple[DraDriver, Literal["gpu", "partition"]] | None:
        """The driver (and what it selects) of a DeviceClass the table names."""
        for driver in self.drivers.values():
            kind = driver.device_classes.get(class_name)
            if kind is not None:
                return driver, kind
        return None


@dataclass(frozen=True)
class DraChange:
    """What an applied object changes: the nodes and pods (by uid) whose message may differ;
    ``all_pods`` when a DeviceClass changed (every pod with claims)."""

    nodes: frozenset[str] = frozenset()
    pods: frozenset[str] = frozenset()
    all_pods: bool = False

    def __or__(self, other: DraChange) -> DraChange:
        return DraChange(self.nodes | other.nodes, self.pods | other.pods, self.all_pods or other.all_pods)

    def __bool__(self) -> bool:
        return bool(self.nodes or self.pods or self.all_pods)


DeviceKey = tuple[str, str, str]
"""``(driver, pool, device)``: unique in a cluster."""


@dataclass(frozen=True)
class _SliceDevice:
    device: DraDevice
    kind: Literal["gpu", "partition"]
    counter_sets: tuple[str, ...]


@dataclass(frozen=True)
class _Slice:
    driver: str
    pool: str
    generation: int
    node: str | None
    devices: tuple[_SliceDevice, ...]
    cut: frozenset[str]
    """What parsing it cut (devices over the cap, texts over their length): the node's message says so."""


@dataclass(frozen=True)
class _Request:
    """A claim's request as its demand reads before allocation: the class and its selectors."""

    name: str
    device_class: str
    selectors: tuple[str, ...]
    count: int


@dataclass(frozen=True)
class _Claim:
    namespace: str
    name: str
    requests: tuple[_Request, ...]
    results: tuple[tuple[str, DeviceKey], ...]
    """Allocated ``(request, (driver, pool, device))``; empty before allocation."""
    shared_devices: frozenset[DeviceKey]
    """Devices of the results that are a share (``shareID``) of a device several claims may hold."""
    reserved_for: tuple[str, ...]
    """Pod uids of ``status.reservedFor`` in order."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class _DeviceClass:
    name: str
    selectors: tuple[str, ...]
    extended_resource: str | None


@dataclass
class _PodRef:
    """What the index remembers of a pod that references claims (for the first-consumer rule, and
    the demand its claims gave it while it was live)."""

    order: tuple[str, str, str]
    """(creationTimestamp, namespace/name, uid): the earliest-created consumer counts an unreserved claim."""
    claims: tuple[str, ...]
    ended: bool = False
    """Succeeded, Failed or being deleted: it keeps what it counted while live and no longer takes
    an unreserved claim from the pods still waiting for it."""
    counted: dict[str, dict[str, int]] = field(default_factory=dict)
    """Claim key -> the demand that claim gave the pod when last read while it held the claim."""


@dataclass
class DraIndex:
    """The latest ResourceSlices, ResourceClaims and DeviceClasses, parsed and bounded; what nodes
    publish and pods ask for through them. Not thread-safe: the watcher calls it under its lock."""

    table: DraDriverTable = field(default_factory=DraDriverTable)
    truncated: set[str] = field(default_factory=set)
    """What was cut of the objects applied so far (words of ``producers.watcher.bounds.WHAT``)."""

    def __post_init__(self) -> None:
        self._slices: dict[str, _Slice] = {}
        self._device_slice: dict[DeviceKey, tuple[str, _SliceDevice]] = {}
        """Where each device is published (the slice's name), for claim results."""
        self._node_slices: dict[str, set[str]] = {}
        self._pool_slices: dict[tuple[str, str], set[str]] = {}
        self._claims: dict[str, _Claim] = {}
        self._classes: dict[str, _DeviceClass] = {}
        self._pods: dict[str, _PodRef] = {}
        self._claim_pods: dict[str, set[str]] = {}
        self._device_claims: dict[DeviceKey, set[str]] = {}
        self._node_cut: set[str] = set()
        self._other_drivers: set[str] = set()
        """Drivers outside the table seen so far (logged once each, at most 64 remembered)."""

    # ------------------------------------------------------------------ feeding it

    def apply(self, kind: str, obj: JsonObject, deleted: bool = False) -> DraChange:
        """Take the newest version of one object (or its deletion); says what to republish."""
        meta = json_dict(obj.get("metadata"))
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            return DraChange()
        if kind == "resourceslices":
            return self._apply_slice(name, obj, deleted)
        if kind == "resourceclaims":
            key = f"{meta.get('namespace') or 'default'}/{name}"
            return self._apply_claim(key, obj, deleted)
        if kind == "deviceclasses":
            before = self._classes.pop(name, None)
            if not deleted:
                self._classes[name] = _parse_class(name, obj)
            return DraChange(all_pods=before != self._classes.get(name))
        return DraChange()

    def _apply_slice(self, name: str, obj: JsonObject, deleted: bool) -> DraChange:
        before = self._slices.pop(name, None)
        after = None if deleted else self._parse_slice(name, obj)
        if before is not None:
            for d in before.devices:
                key = (d.device.driver, d.device.pool, d.device.device)
                if self._device_slice.get(key, (None,))[0] == name:
                    del self._device_slice[key]
            _discard(self._pool_slices, (before.driver, before.pool), name)
            if before.node:
                _discard(self._node_slices, before.node, name)
        if after is not None:
            self._slices[name] = after
            for d in after.devices:
                self._device_slice[(d.device.driver, d.device.pool, d.device.device)] = (name, d)
            self._pool_slices.setdefault((after.driver, after.pool), set()).add(name)
            if after.node:
                self._node_slices.setdefault(after.node, set()).add(name)
        nodes = {s.node for s in (before, after) if s is not None and s.node}
        pools = {(s.driver, s.pool) for s in (before, after) if s is not None}
        pods = {uid for claim in self._claims.values()
                if any((d, p) in pools for _, (d, p, _) in claim.results)
                for uid in self._consumers(claim)}
        return DraChange(frozenset(nodes), frozenset(pods))

    def _apply_claim(self, key: str, obj: JsonObject, deleted: bool) -> DraChange:
        before = self._claims.pop(key, None)
        after = None if deleted else self._parse_claim(obj)
        touched: set[DeviceKey] = set()
        for claim in (before, after):
            if claim is not None:
                touched |= claim.shared_devices
        others = {other for device in touched for other in self._device_claims.get(device, ())} - {key}
        if before is not None:
            for device in before.shared_devices:
                holders = self._device_claims.get(device)
                if holders is not None:
                    holders.discard(key)
                    if not holders:
                        del self._device_claims[device]
        if after is not None:
            self._claims[key] = after
            for device in after.shared_devices:
                self._device_claims.setdefault(device, set()).add(key)
        pods: set[str] = set(self._claim_pods.get(key, ()))
        for claim in (before, after):
            if claim is not None:
                pods.update(claim.reserved_for)
        for other in others:
            claim = self._claims.get(other)
            if claim is not None:
                pods.update(self._consumers(claim))
        return DraChange(pods=frozenset(pods))

    def track_pod(self, pod: JsonDict) -> DraChange:
        """Remember which claims a pod references (for the first-consumer rule); says which other pods'
        demand may have changed with it."""
        meta = json_dict(pod.get("metadata"))
        uid = str(meta.get("uid") or "")
        if not uid:
            return DraChange()
        claims = tuple(self.pod_claims(pod))
        before = self._pods.get(uid)
        if not claims:
            return self.forget_pod(uid) if before is not None else DraChange()
        order = (str(meta.get("creationTimestamp") or ""), f"{meta.get('namespace')}/{meta.get('name')}", uid)
        ended = _has_ended(pod) or (before is not None and before.ended)
        if before is not None and before.claims == claims and before.order == order and before.ended == ended:
            return DraChange()
        change = self.forget_pod(uid)
        self._pods[uid] = _PodRef(order, claims, ended, before.counted if before is not None else {})
        for key in claims:
            self._claim_pods.setdefault(key, set()).add(uid)
        return change | DraChange(pods=frozenset(o for k in claims for o in self._claim_pods.get(k, ())) - {uid})

    def end_pod(self, uid: str) -> DraChange:
        """A pod is gone (its deletion seen, perhaps only from a relist that found it missing): from
        now on it keeps the demand it had while live, as a pod that has ended does."""
        ref = self._pods.get(uid)
        if ref is None or ref.ended:
            return DraChange()
        ref.ended = True
        return DraChange(pods=frozenset(o for k in ref.claims for o in self._claim_pods.get(k, ())) - {uid})

    def forget_pod(self, uid: str) -> DraChange:
        """A pod is gone: the other consumers of its claims may count them now."""
        ref = self._pods.pop(uid, None)
        if ref is None:
            return DraChange()
        others: set[str] = set()
        for key in ref.claims:
            consumers = self._claim_pods.get(key)
            if consumers is not None:
                consumers.discard(uid)
                others |= consumers
                if not consumers:
                    del self._claim_pods[key]
        return DraChange(pods=frozenset(others))

    def tracked_pods(self) -> list[str]:
        """Uids of the pods that reference claims."""
        return sorted(self._pods)

    # ------------------------------------------------------------------ nodes

    def node_devices(self, node: str, trim: Trim | None = None) -> list[DraDevice]:
        """The GPU devices the node's current slices publish, by (driver, pool, device), at most
        ``MAX_DRA_DEVICES``; what was cut of them is noted in ``trim``."""
        return [d.device for d in self._node_slice_devices(node, trim)]

    def _node_slice_devices(self, node: str, trim: Trim | None = None) -> list[_SliceDevice]:
        slices = [self._slices[name] for name in sorted(self._node_slices.get(node, ()))]
        generations = {(s.driver, s.pool): max(self._slices[other].generation
                                                for other in self._pool_slices.get((s.driver, s.pool), ()))
                       for s in slices}
        found: dict[DeviceKey, _SliceDevice] = {}
        for s in slices:
            if s.generation != generations[(s.driver, s.pool)]:
                continue  # a pool's older generation the driver is replacing
            if trim is not None:
                for what in s.cut:
                    trim.note(what)
            for d in s.devices:
                found.setdefault((d.device.driver, d.device.pool, d.device.device), d)
        ordered = _with_physical_gpus([found[key] for key in sorted(found)])
        if len(ordered) > MAX_DRA_DEVICES:
            self.truncated.add("items")
            if trim is not None:
                trim.note("items")
            if node not in self._node_cut:
                self._node_cut.add(node)
                log.warning("node publishes more DRA GPU devices than a message holds", node=node,
                            devices=len(ordered), kept=MAX_DRA_DEVICES)
            ordered = ordered[:MAX_DRA_DEVICES]
        return ordered

    def node_capacity(self, node: str) -> dict[str, int]:
        """The node's DRA GPUs by the resource they count as, each physical GPU once (see the module
        docstring): partitionable groups as one whole GPU, static MIG devices as their profile."""
        devices = self._node_slice_devices(node)
        static_parents = {d.device.mig_parent_uuid for d in devices
                          if d.kind == "partition" and not d.counter_sets and d.device.mig_parent_uuid}
        counts: dict[str, int] = {}
        groups: dict[str, str] = {}
        for d in devices:
            dev = d.device
            if d.counter_sets:
                driver = self.table.get(dev.driver)
                groups.setdefault(dev.physical_gpu or f"{dev.pool}/{d.counter_sets[0]}",
                                  driver.gpu_resource if driver else dev.resource)
            elif d.kind == "partition" or dev.uuid is None or dev.uuid not in static_parents:
                counts[dev.resource] = counts.get(dev.resource, 0) + 1
        for resource in groups.values():
            counts[resource] = counts.get(resource, 0) + 1
        return counts

    # ------------------------------------------------------------------ pods

    def pod_claims(self, pod: JsonDict) -> list[str]:
        """``namespace/name`` of the claims the pod uses, without the one the scheduler made for an
        extended resource served by DRA (the pod's container request counts that one)."""
        meta = json_dict(pod.get("metadata"))
        namespace = str(meta.get("namespace") or "default")
        spec = json_dict(pod.get("spec"))
        status = json_dict(pod.get("status"))
        generated = {str(json_dict(s).get("name")): json_dict(s).get("resourceClaimName")
                     for s in json_list(status.get("resourceClaimStatuses"))}
        extended = json_dict(status.get("extendedResourceClaimStatus")).get("resourceClaimName")
        names: list[str] = []
        for raw in json_list(spec.get("resourceClaims"))[:MAX_CLAIM_RESULTS]:
            entry = json_dict(raw)
            claim = entry.get("resourceClaimName")
            if not claim and entry.get("resourceClaimTemplateName"):
                claim = generated.get(str(entry.get("name")))
            if isinstance(claim, str) and claim and claim != extended:
                key = f"{namespace}/{claim}"
                if key not in names:
                    names.append(key)
        return names

    def pod_demand(self, pod: JsonDict) -> dict[str, int]:
        """The GPU resources the pod's claims ask for or hold, by the resource they count as (each
        claim in its first consumer only; see the module docstring). Before allocation the first
        consumer is the earliest-created pod :meth:`track_pod` has seen: track every pod first.

        A tracked pod keeps what a claim gave it while live once it has ended (Succeeded, Failed,
        being deleted, or :meth:`end_pod`), and, while bound to a node, once the claim no longer holds
        devices for it (released from ``reservedFor``, deallocated, deleted): the resourceclaim
        controller does that only after the pod ended, perhaps before the watcher sees the end."""
        uid = str(json_dict(pod.get("metadata")).get("uid") or "")
        ref = self._pods.get(uid)
        ended = _has_ended(pod) or (ref is not None and ref.ended)
        bound = bool(json_dict(pod.get("spec")).get("nodeName"))
        demand: dict[str, int] = {}
        for key in self.pod_claims(pod):
            claim = self._claims.get(key)
            part = self._claim_demand(claim) if claim is not None and self._counts_in(claim, uid, pod) else {}
            if ref is not None:
                if ended or (bound and _released(claim, uid)):
                    part = ref.counted.get(key, part)
                else:
                    ref.counted[key] = part
            for resource, amount in part.items():
                demand[resource] = demand.get(resource, 0) + amount
        return demand

    def uses_gpus(self, pod: JsonDict) -> bool:
        """Whether one of the pod's claims asks for or holds GPU devices, whether or not the pod's
        demand counts them (a shared claim counts in its first consumer only): such a pod is a GPU
        pod, published with its scheduling events whatever its demand."""
        for key in self.pod_claims(pod):
            claim = self._claims.get(key)
            if claim is None:
                continue
            if any(self.table.get(driver) is not None for _, (driver, _, _) in claim.results):
                return True
            if not claim.results and any(self._class_resource(r.device_class, r.selectors) is not None
                                         for r in claim.requests):
                return True
        return False

    def _consumers(self, claim: _Claim) -> set[str]:
        return set(claim.reserved_for) | self._claim_pods.get(claim.key, set())

    def _counts_in(self, claim: _Claim, uid: str, pod: JsonDict) -> bool:
        if claim.reserved_for:
            return claim.reserved_for[0] == uid
        meta = json_dict(pod.get("metadata"))
        mine = (str(meta.get("creationTimestamp") or ""), f"{meta.get('namespace')}/{meta.get('name')}", uid)
        orders = [self._pods[o].order for o in self._claim_pods.get(claim.key, ())
                  if o in self._pods and o != uid and not self._pods[o].ended]
        return all(mine < other for other in orders)

    def _claim_demand(self, claim: _Claim) -> dict[str, int]:
        demand: dict[str, int] = {}
        if claim.results:
            seen: set[DeviceKey] = set()
            requests = {r.name: r for r in claim.requests}
            for request_name, key in claim.results:
                if key in seen or self.table.get(key[0]) is None:
                    continue
                seen.add(key)
                if key in claim.shared_devices and min(self._device_claims.get(key, {claim.key})) != claim.key:
                    continue  # a share of a device an earlier claim already counts
                resource = self._device_resource(key)
                if resource is None:  # its slice is gone or not seen yet: what the request asked for
                    request = requests.get(request_name.split("/", 1)[0])
                    resource = self._class_resource(request.device_class, request.selectors) if request else None
                if resource is not None:
                    demand[resource] = demand.get(resource, 0) + 1
            return demand
        for request in claim.requests:
            resource = self._class_resource(request.device_class, request.selectors)
            if resource is not None:
                demand[resource] = demand.get(resource, 0) + request.count
        return demand

    def _device_resource(self, key: DeviceKey) -> str | None:
        found = self._device_slice.get(key)
        return found[1].device.resource if found is not None else None

    def _class_resource(self, class_name: str, selectors: Sequence[str]) -> str | None:
        """The resource a request of this class counts as before allocation; None when no GPU driver's."""
        known = self._classes.get(class_name)
        all_selectors = [*(known.selectors if known else ()), *selectors]
        named = self.table.class_driver(class_name)
        driver: DraDriver | None = named[0] if named else None
        kind: str | None = named[1] if named else None
        if driver is None:
            for text in all_selectors:
                match = _CEL_DRIVER.search(text)
                if match and self.table.get(match.group(1)) is not None:
                    driver = self.table.get(match.group(1))
                    break
        if driver is None:
            return None
        attributes = _cel_equalities(all_selectors)
        if driver.type_attribute and driver.type_attribute in attributes:
            value = attributes[driver.type_attribute]
            kind = "gpu" if value in driver.gpu_types else "partition" if value in driver.partition_types else None
            if kind is None:
                return None
        if kind == "partition":
            profile = attributes.get(driver.profile_attribute or "", PARTITION_ANY)
            return _resource_name(driver.partition_resource_prefix + profile)
        return driver.gpu_resource

    # ------------------------------------------------------------------ parsing

    def _parse_slice(self, name: str, obj: JsonObject) -> _Slice | None:
        spec = json_dict(obj.get("spec"))
        driver = self.table.get(spec.get("driver"))
        pool = json_dict(spec.get("pool"))
        pool_name = pool.get("name")
        if driver is None:
            self._other_driver(spec.get("driver"), name)
        if driver is None or not isinstance(pool_name, str) or not pool_name or len(pool_name) > MAX_NAME_CHARS:
            return None  # not a GPU driver's (or malformed): nothing of it is kept
        generation = pool.get("generation")
        node = spec.get("nodeName")
        node = node if isinstance(node, str) and node and len(node) <= MAX_NAME_CHARS else None
        raw_devices = json_list(spec.get("devices"))
        trim = Trim()
        if len(raw_devices) > MAX_DRA_DEVICES:
            trim.note("items")
            log.warning("resource slice with more devices than a node message holds", slice=name,
                        devices=len(raw_devices), kept=MAX_DRA_DEVICES)
            raw_devices = raw_devices[:MAX_DRA_DEVICES]
        devices = []
        for raw in raw_devices:
            parsed = _parse_device(driver, pool_name, json_dict(raw), trim)
            if parsed is not None:
                devices.append(parsed)
        self.truncated |= trim.what
        return _Slice(driver.driver, pool_name, generation if isinstance(generation, int) else 0, node,
                      tuple(devices), frozenset(trim.what))

    def _other_driver(self, driver: object, slice_name: str) -> None:
        text = str(driver)[:MAX_NAME_CHARS]
        if text not in self._other_drivers and len(self._other_drivers) < 64:
            self._other_drivers.add(text)
            log.info("dra driver not in the driver table: its devices are not counted as GPUs (docs/dra.md)",
                     driver=text, slice=slice_name)

    def _parse_claim(self, obj: JsonObject) -> _Claim:
        meta = json_dict(obj.get("metadata"))
        spec = json_dict(json_dict(obj.get("spec")).get("devices"))
        status = json_dict(obj.get("status"))
        requests = []
        for raw in json_list(spec.get("requests"))[:MAX_CLAIM_RESULTS]:
            request = _parse_request(json_dict(raw))
            if request is not None:
                requests.append(request)
        allocation = json_dict(json_dict(status.get("allocation")).get("devices"))
        results: list[tuple[str, DeviceKey]] = []
        shared: set[DeviceKey] = set()
        for raw in json_list(allocation.get("results"))[:MAX_CLAIM_RESULTS]:
            result = json_dict(raw)
            key = (result.get("driver"), result.get("pool"), result.get("device"))
            if not all(isinstance(part, str) and part for part in key) or result.get("adminAccess") is True:
                continue  # malformed, or a monitoring claim's admin access: it takes no device from anyone
            device_key: DeviceKey = (str(key[0]), str(key[1]), str(key[2]))
            results.append((str(result.get("request") or ""), device_key))
            if result.get("shareID"):
                shared.add(device_key)
        reserved = [str(json_dict(r).get("uid")) for r in json_list(status.get("reservedFor"))[:MAX_CLAIM_RESULTS]
                    if json_dict(r).get("resource", "pods") == "pods" and json_dict(r).get("uid")]
        return _Claim(str(meta.get("namespace") or "default"), str(meta.get("name")), tuple(requests),
                      tuple(results), frozenset(shared), tuple(reserved))


# --------------------------------------------------------------------------- parsing helpers


def _has_ended(pod: JsonDict) -> bool:
    """Succeeded, Failed, or being deleted: its claims are released or deleted next."""
    phase = json_dict(pod.get("status")).get("phase")
    return phase in ("Succeeded", "Failed") or bool(json_dict(pod.get("metadata")).get("deletionTimestamp"))


def _released(claim: _Claim | None, uid: str) -> bool:
    """Whether a claim holds no devices for the pod (gone, deallocated, or not reserved for it)."""
    return claim is None or not claim.results or uid not in claim.reserved_for


def _parse_class(name: str, obj: JsonObject) -> _DeviceClass:
    spec = json_dict(obj.get("spec"))
    extended = spec.get("extendedResourceName")
    return _DeviceClass(name, _selectors(spec.get("selectors")),
                        extended if isinstance(extended, str) and len(extended) <= MAX_QUALIFIED_NAME_CHARS else None)


def _selectors(value: object) -> tuple[str, ...]:
    texts = []
    for raw in json_list(value)[:32]:
        expression = json_dict(json_dict(raw).get("cel")).get("expression")
        if isinstance(expression, str):
            texts.append(expression[:10_000])
    return tuple(texts)


def _parse_request(request: JsonDict) -> _Request | None:
    """A v1 request: ``exactly`` (one device class), else the first of ``firstAvailable`` (the one
    the scheduler tries first). ``allocationMode: All`` counts one device before allocation."""
    name = request.get("name")
    exactly = json_dict(request.get("exactly"))
    if not exactly:
        alternatives = json_list(request.get("firstAvailable"))
        first = json_dict(alternatives[0]) if alternatives else {}
        exactly = json_dict(first.get("exactly")) or first
    device_class = exactly.get("deviceClassName")
    if not isinstance(name, str) or not isinstance(device_class, str) or exactly.get("adminAccess") is True:
        return None
    count = exactly.get("count")
    amount = count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1
    if exactly.get("allocationMode") == "All":
        amount = 1
    return _Request(name, device_class, _selectors(exactly.get("selectors")), min(amount, MAX_REQUEST_COUNT))


def _cel_equalities(selectors: Iterable[str]) -> dict[str, str]:
    """``attribute == "value"`` comparisons of CEL selectors (``device.attributes["d"].type == "mig"``)."""
    found: dict[str, str] = {}
    for text in selectors:
        for match in _CEL_ATTRIBUTE.finditer(text):
            attribute = (match.group(1) or match.group(2)).rsplit("/", 1)[-1]
            found.setdefault(attribute, match.group(3))
    return found


def _resource_name(name: str) -> str | None:
    """``name`` when it is a valid extended-resource name (a profile of 300 characters makes none)."""
    return name if len(name) <= MAX_QUALIFIED_NAME_CHARS and _RESOURCE_NAME.fullmatch(name) else None


def _attribute(attributes: JsonDict, driver: DraDriver, name: str | None) -> object:
    """An attribute's value: the short name (the driver's own domain) or the qualified one."""
    if not name:
        return None
    value = json_dict(attributes.get(name) or attributes.get(f"{driver.driver}/{name}"))
    for kind in ("string", "version", "int", "bool"):
        if kind in value:
            return value[kind]
    return None


def _text(value: object, limit: int, trim: Trim) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    return trim.text(value, limit)


def _parse_device(driver: DraDriver, pool: str, device: JsonDict, trim: Trim) -> _SliceDevice | None:
    name = device.get("name")
    if not isinstance(name, str) or not name or len(name) > MAX_DNS_LABEL_CHARS:
        if name:
            trim.note("text")
        return None
    attributes = json_dict(device.get("attributes"))
    kind: Literal["gpu", "partition"] = "gpu"
    if driver.type_attribute:
        value = _attribute(attributes, driver, driver.type_attribute)
        if value in driver.gpu_types:
            kind = "gpu"
        elif value in driver.partition_types:
            kind = "partition"
        else:
            return None  # a VFIO passthrough, a channel, a type we do not know: not a GPU here
    profile = _text(_attribute(attributes, driver, driver.profile_attribute), MAX_SHORT_TEXT_CHARS, trim)
    if kind == "partition":
        resource = _resource_name(driver.partition_resource_prefix + (profile or PARTITION_ANY))
        if resource is None:
            trim.note("text")
            return None
    else:
        resource = driver.gpu_resource
    memory: int | None = None
    if driver.memory_capacity:
        raw_memory = json_dict(json_dict(device.get("capacity")).get(driver.memory_capacity)).get("value")
        if raw_memory is not None:
            memory = parse_quantity(raw_memory)
            if memory > MAX_GPU_MEMORY_BYTES:
                trim.note("quantity")
                memory = None
    counter_sets = tuple(str(json_dict(c).get("counterSet"))[:MAX_NAME_CHARS]
                         for c in json_list(device.get("consumesCounters"))[:8] if json_dict(c).get("counterSet"))
    return _SliceDevice(
        DraDevice(driver=driver.driver, pool=pool, device=name, resource=resource,
                  uuid=_text(_attribute(attributes, driver, driver.uuid_attribute), MAX_ID_CHARS, trim),
                  model=_text(_attribute(attributes, driver, driver.model_attribute), MAX_SHORT_TEXT_CHARS, trim),
                  mig_profile=profile if kind == "partition" else None,
                  mig_parent_uuid=_text(_attribute(attributes, driver, driver.parent_uuid_attribute), MAX_ID_CHARS,
                                        trim) if kind == "partition" else None,
                  memory_bytes=memory, multi_allocatable=device.get("allowMultipleAllocations") is True),
        kind, counter_sets)


def _with_physical_gpus(devices: list[_SliceDevice]) -> list[_SliceDevice]:
    """Each device's ``physical_gpu``: a whole GPU's UUID; a partition's parent UUID; for devices
    consuming a counter set (a pool's, whichever slice of the pool publishes them), the UUID of the
    whole GPU among them, else ``<pool>/<counter set>``."""
    set_owner: dict[tuple[str, str, str], str] = {}
    for d in devices:
        if d.kind == "gpu" and d.device.uuid:
            for counter_set in d.counter_sets:
                set_owner.setdefault((d.device.driver, d.device.pool, counter_set), d.device.uuid)
    out = []
    for d in devices:
        dev = d.device
        if d.counter_sets:
            physical: str | None = (set_owner.get((dev.driver, dev.pool, d.counter_sets[0]))
                                    or f"{dev.pool}/{d.counter_sets[0]}"[:MAX_ID_CHARS])
        elif d.kind == "partition":
            physical = dev.mig_parent_uuid
        else:
            physical = dev.uuid
        out.append(_SliceDevice(dev.model_copy(update={"physical_gpu": physical}), d.kind, d.counter_sets))
    return out


def _discard(index: dict[K, set[str]], key: K, name: str) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(name)
        if not members:
            del index[key]
