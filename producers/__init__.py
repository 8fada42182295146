"""Producers: the node agent (NVML + kubelet -> gpu samples) and the cluster watcher (Kubernetes API ->
pods, nodes, events)."""
