"""The cluster watcher: Kubernetes pods, nodes and scheduling events into Kafka.

The pipeline needs to know which pods hold (or wait for) GPUs, who owns them, where they run,
why they wait and how they end; the node agents only see processes. This package list-watches
the API server with informer semantics and produces ``k8s.pods.v1``, ``k8s.nodes.v1`` and
``k8s.events.v1``.

Modules:
- ``translate``      pure functions from API-server JSON to the message types (also driven by the
                     fleet simulator), plus the change filter;
- ``informer``       list + watch + resume + 410 re-list semantics over an abstract source,
                     retried on the schedule of ``common/backoff.py``;
- ``kube``           the only module that imports the ``kubernetes`` client;
- ``service``        wiring: informers -> translation -> Kafka / stdout, self-metrics;
- ``fake_apiserver`` an HTTP server that behaves like the API server for tests and ``--simulate``;
- ``fake_cluster``   builders of realistic pod/node/event JSON and a small churning GPU cluster.
"""
