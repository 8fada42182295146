"""The Kubernetes API adapter: the only module that imports the ``kubernetes`` client.

It turns the client into :class:`~producers.watcher.informer.WatchSource` objects that hand out
raw JSON (camelCase dicts exactly as the API server serves them): translation never depends on
the client's model classes, and the same translation runs on the simulator's JSON. Lists are
paginated (``limit`` / ``continue``, a consistent snapshot) so a large cluster is not read in one
response; watches ask for bookmarks and a server-side timeout, with a client read timeout a bit
longer so a silently dead connection cannot hang the watcher.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from common.errors import UserError
from producers.watcher.informer import Gone, WatchRequestError
from producers.watcher.kube_json import JsonObject

RESOURCES = ("pods", "nodes", "events", "core-events", "workloads", "resourceslices", "resourceclaims",
             "deviceclasses")
"""``events`` = events.k8s.io/v1 (the current API); ``core-events`` = core/v1 Events; ``workloads`` =
Kueue's ``kueue.x-k8s.io`` Workloads (a CRD: ask :func:`serves_workloads` first)."""
DRA_GROUP, DRA_VERSION = "resource.k8s.io", "v1"
DRA_RESOURCES = ("deviceclasses", "resourceslices", "resourceclaims")
"""Dynamic Resource Allocation's collections (``resource.k8s.io/v1``, Kubernetes 1.34+: ask
:func:`serves_dra` first); read as plain JSON through the generic path, like a CRD."""
_CLUSTER_SCOPED = ("nodes", "resourceslices", "deviceclasses")
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSIONS = ("v1beta2", "v1beta1")
"""The Workload versions the watcher reads, the first one served wins: v1beta2 is the storage version
of Kueue's CRD (v0.17.0 serves v1beta1 too, deprecated), v1beta1 the only one of older releases."""


class KubeConfigError(UserError):
    """No usable cluster configuration (no in-cluster service account, no kubeconfig)."""


def api_client(kubeconfig: Path | None = None, host: str | None = None, context: str | None = None) -> Any:
    """An ApiClient for ``host`` (plain URL, e.g. the simulated server), a kubeconfig file, or
    the in-cluster service account, tried in that order; without either file, the kubeconfig the
    client library finds by itself (``$KUBECONFIG`` or ``~/.kube/config``)."""
    configuration = k8s_client.Configuration()
    try:
        if host:
            configuration.host = host
        elif kubeconfig is not None:
            if not kubeconfig.exists():
                raise KubeConfigError(f"kubeconfig {kubeconfig} does not exist")
            k8s_config.load_kube_config(config_file=str(kubeconfig), context=context,
                                        client_configuration=configuration)
        else:
            try:
                k8s_config.load_incluster_config(client_configuration=configuration)
            except ConfigException:
                k8s_config.load_kube_config(context=context, client_configuration=configuration)
    except (ConfigException, OSError) as exc:
        raise KubeConfigError(f"no Kubernetes configuration: {exc}") from None
    return k8s_client.ApiClient(configuration)


def workloads_version(api: Any, request_timeout_s: float = 30.0) -> str | None:
    """The first of :data:`KUEUE_VERSIONS` that serves watchable Workloads, by discovery
    (``GET /apis/kueue.x-k8s.io/<version>``, readable by every authenticated user); None when each
    answers 404, as a cluster without the CRD does. Any other failure raises
    :class:`WatchRequestError`, so a flaky start-up is not taken for "no Kueue"."""
    custom = k8s_client.CustomObjectsApi(api)
    for version in KUEUE_VERSIONS:
        try:
            resources = custom.get_api_resources(KUEUE_GROUP, version, _request_timeout=request_timeout_s)
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise WatchRequestError(f"discover {KUEUE_GROUP}/{version}: {exc.status} {exc.reason}",
                                    int(exc.status or 0)) from None
        except Exception as exc:
            raise WatchRequestError(f"discover {KUEUE_GROUP}/{version}: {type(exc).__name__}: {exc}") from None
        if any(r.name == "workloads" and "watch" in (r.verbs or []) for r in resources.resources or []):
            return version
    return None


def serves_workloads(api: Any, request_timeout_s: float = 30.0) -> bool:
    """Whether the server serves Kueue's Workloads in a version the watcher reads (:func:`workloads_version`)."""
    return workloads_version(api, request_timeout_s) is not None


def serves_dra(api: Any, request_timeout_s: float = 30.0) -> bool:
    """Whether the server serves Dynamic Resource Allocation's ``resource.k8s.io/v1`` with the three
    collections the watcher follows, by discovery: False on 404 (an older server, or the group turned
    off). Any other failure raises :class:`WatchRequestError`."""
    try:
        resources = k8s_client.CustomObjectsApi(api).get_api_resources(
            DRA_GROUP, DRA_VERSION, _request_timeout=request_timeout_s)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise WatchRequestError(f"discover {DRA_GROUP}/{DRA_VERSION}: {exc.status} {exc.reason}",
                                int(exc.status or 0)) from None
    except Exception as exc:
        raise WatchRequestError(f"discover {DRA_GROUP}/{DRA_VERSION}: {type(exc).__name__}: {exc}") from None
    watchable = {r.name for r in resources.resources or [] if "watch" in (r.verbs or [])}
    return all(name in watchable for name in DRA_RESOURCES)


def may_list(api: Any, resource: str, namespace: str | None = None, request_timeout_s: float = 30.0) -> bool:
    """Whether this identity may list ``resource`` (one item asked for): False on 403, so a watcher
    whose ClusterRole predates a collection starts without it instead of retrying forever. Any other
    failure raises :class:`WatchRequestError`."""
    try:
        KubeSource(api, resource, namespace)._func(limit=1, _preload_content=False,
                                                   _request_timeout=request_timeout_s)
    except ApiException as exc:
        if exc.status == 403:
            return False
        raise WatchRequestError(f"list {resource}: {exc.status} {exc.reason}", int(exc.status or 0)) from None
    except Exception as exc:
        raise WatchRequestError(f"list {resource}: {type(exc).__name__}: {exc}") from None
    return True


def api_host(api: Any) -> str:
    return str(api.configuration.host)


class KubeSource:
    """List and watch one collection (``pods``, ``nodes``, ``events``, ``core-events``, ``workloads``).

    Workloads are read in the version discovery picks (:func:`workloads_version`), asked again at
    every list: a Kueue upgrade that stops serving a version ends the watch, and the relist that
    follows reads the version served then."""

    def __init__(self, api: Any, resource: str, namespace: str | None = None, page_size: int = 500,
                 request_timeout_s: float = 60.0) -> None:
        if resource not in RESOURCES:
            raise ValueError(f"unknown resource {resource!r}; known: {', '.join(RESOURCES)}")
        if resource in _CLUSTER_SCOPED and namespace:
            raise ValueError(f"{resource} are cluster-scoped")
        self.resource = resource if not namespace else f"{resource}:{namespace}"
        self.kind = resource
        self.namespace = namespace
        self.page_size = page_size
        self.request_timeout_s = request_timeout_s
        self.version: str | None = None
        """The Workload version the last list read (``workloads`` only)."""
        self._api = api
        self._func = self._list_function(api, resource, namespace, lambda: self.version or KUEUE_VERSIONS[-1])
        self._lock = threading.Lock()
        self._watches: set[Any] = set()

    @staticmethod
    def _list_function(api: Any, resource: str, namespace: str | None,
                       version: Callable[[], str]) -> Callable[..., Any]:
        core = k8s_client.CoreV1Api(api)
        if resource == "workloads":
            custom = k8s_client.CustomObjectsApi(api)

            def call_custom(**kwargs: Any) -> Any:
                if namespace:
                    return custom.list_namespaced_custom_object(KUEUE_GROUP, version(), namespace, "workloads",
                                                                **kwargs)
                return custom.list_cluster_custom_object(KUEUE_GROUP, version(), "workloads", **kwargs)

            return call_custom
        if resource in DRA_RESOURCES:
            dra = k8s_client.CustomObjectsApi(api)

            def call_dra(**kwargs: Any) -> Any:
                if namespace:
                    return dra.list_namespaced_custom_object(DRA_GROUP, DRA_VERSION, namespace, resource, **kwargs)
                return dra.list_cluster_custom_object(DRA_GROUP, DRA_VERSION, resource, **kwargs)

            return call_dra
        if resource == "nodes":
            method: Callable[..., Any] = core.list_node
        elif resource == "pods":
            method = core.list_namespaced_pod if namespace else core.list_pod_for_all_namespaces
        elif resource == "core-events":
            method = core.list_namespaced_event if namespace else core.list_event_for_all_namespaces
        else:
            events = k8s_client.EventsV1Api(api)
            method = events.list_namespaced_event if namespace else events.list_event_for_all_namespaces

        # A plain wrapper without a return annotation: the client's Watch then yields the raw
        # JSON object instead of deserialising it into model classes (and still maps ERROR events).
        def call(**kwargs: Any) -> Any:
            if namespace:
                return method(namespace, **kwargs)
            return method(**kwargs)

        return call

    def list(self) -> tuple[list[JsonObject], str]:
        if self.kind == "workloads":
            self.version = workloads_version(self._api, self.request_timeout_s)
            if self.version is None:
                raise WatchRequestError(f"list {self.resource}: {KUEUE_GROUP} serves none of "
                                        f"{', '.join(KUEUE_VERSIONS)}", 404)
        items: list[JsonObject] = []
        resource_version = ""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self.page_size, "_preload_content": False,
                                      "_request_timeout": self.request_timeout_s}
            if token:
                kwargs["_continue"] = token
            try:
                response = self._func(**kwargs)
                body = json.loads(response.data)
            except ApiException as exc:
                raise WatchRequestError(f"list {self.resource}: {exc.status} {exc.reason}",
                                        int(exc.status or 0)) from None
            except Exception as exc:
                raise WatchRequestError(f"list {self.resource}: {type(exc).__name__}: {exc}") from None
            metadata = body.get("metadata") or {}
            if not resource_version:
                resource_version = str(metadata.get("resourceVersion") or "")
            items.extend(item for item in body.get("items") or [] if isinstance(item, dict))
            token = metadata.get("continue") or None
            if not token:
                return items, resource_version

    def watch(self, resource_version: str, timeout_s: int) -> Iterator[JsonObject]:
        watcher = k8s_watch.Watch()
        with self._lock:
            self._watches.add(watcher)
        try:
            stream = watcher.stream(
                self._func,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=int(timeout_s),
                _request_timeout=(10, int(timeout_s) + 30),
            )
            for event in stream:
                yield {"type": event.get("type"), "object": event.get("raw_object", event.get("object"))}
        except ApiException as exc:
            if exc.status == 410:
                raise Gone(str(exc.reason)) from None
            raise WatchRequestError(f"watch {self.resource}: {exc.status} {exc.reason}", int(exc.status or 0)) from None
        except (Gone, WatchRequestError, GeneratorExit):
            raise
        except Exception as exc:
            raise WatchRequestError(f"watch {self.resource}: {type(exc).__name__}: {exc}") from None
        finally:
            with self._lock:
                self._watches.discard(watcher)

    def interrupt(self) -> None:
        with self._lock:
            watches = list(self._watches)
        for watcher in watches:
            watcher.stop()
