"""The gpulens node agent: what every GPU on a node is doing, and for which pod.

It runs once per GPU node (a DaemonSet). Each sampling interval it reads NVML (``nvml``), asks the
kubelet which pod and container each GPU or MIG device was assigned to (``podresources``), maps GPU
processes to containers and pods through their cgroups (``cgroup``), assembles one
:class:`schemas.messages.GpuSample` per node (``sampler``) and produces it to Kafka (``service``).

Every third-party client sits behind a small interface with a faithful fake (``fake_nvml``,
``fake_kubelet``) so the logic in between is plain Python that tests, the fleet simulator and
``gpulens agent --simulate`` drive directly.
"""
