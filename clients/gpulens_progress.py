"""Report training progress to the gpulens node agent: one file, standard library only.

Copy this file into a training image (or put it on ``PYTHONPATH``) and call::

    import gpulens_progress
    gpulens_progress.report(steps=1, tokens=4096, samples=8)   # increments since the last call

The node agent turns the increments into cost per step, per 1k tokens and per sample. The call
never blocks the training loop and never raises: when no agent is reachable (a laptop, a cluster
without gpulens) it does nothing visible. Increments are coalesced and sent at most every
``GPULENS_PROGRESS_MIN_INTERVAL_S`` (default 1 s) as one line ``steps=+N tokens=+N samples=+N``;
what is not yet sent goes out on :func:`flush` (also at interpreter exit). A send the kernel
refuses keeps the increments for the next one, so nothing is lost while the agent restarts.

Where it sends (environment of the training container, see docs/progress.md):

- ``GPULENS_PROGRESS_SOCKET`` (default ``/var/run/gpulens/progress.sock``): the agent's unix
  datagram socket, mounted from the node through a hostPath volume; the agent identifies the pod
  from the kernel's credentials of this process.
- otherwise ``GPULENS_PROGRESS_HOST`` (the node's IP from the downward API's ``status.hostIP``) and
  ``GPULENS_PROGRESS_UDP_PORT`` (default 9477): UDP to the agent; it identifies the pod from the
  source IP.

Only one process per pod should report a job's steps (in distributed training, the local rank 0):
every report adds to the pod's totals. The framework callbacks (:func:`transformers_callback`,
:func:`lightning_callback`) do this, and import their framework only when called.

The caching allocator's view of the GPU memory (reserved, allocated, allocation retries, OOMs) goes
to the same agent: :func:`report_allocator` takes the figures per device, :func:`torch_allocator_stats`
collects them from PyTorch, :func:`report_torch_allocator` does both (every process reports the
devices its own allocator uses; the callbacks do it from every rank). They travel as
``allocator device=N reserved=N allocated=N ...`` lines of absolute values, in datagrams of their
own so that an agent that does not know them still counts the steps.
"""

from __future__ import annotations

import atexit
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["ProgressReporter", "flush", "lightning_callback", "report", "report_allocator", "report_torch_allocator",
           "torch_allocator_stats", "transformers_callback"]

DEFAULT_SOCKET = "/var/run/gpulens/progress.sock"
DEFAULT_UDP_PORT = 9477
_KEYS = ("steps", "tokens", "samples")
MAX_DATAGRAM_BYTES = 1024
"""The agent's default datagram limit: allocator lines are packed into datagrams no larger."""
_ALLOCATOR_FIELDS = (("reserved_bytes", "reserved"), ("allocated_bytes", "allocated"),
                     ("max_reserved_bytes", "max_reserved"), ("num_alloc_retries", "retries"),
                     ("num_ooms", "ooms"))


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


class ProgressReporter:
    """Coalesces increments and sends them to the agent; every public method swallows its errors."""

    def __init__(self, socket_path: str | None = None, host: str | None = None, port: int | None = None,
                 min_interval_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.socket_path = socket_path if socket_path is not None else os.environ.get(
            "GPULENS_PROGRESS_SOCKET", DEFAULT_SOCKET)
        self.host = host if host is not None else os.environ.get("GPULENS_PROGRESS_HOST", "")
        self.port = port if port is not None else int(_env_float("GPULENS_PROGRESS_UDP_PORT", DEFAULT_UDP_PORT))
        self.min_interval_s = (min_interval_s if min_interval_s is not None
                               else _env_float("GPULENS_PROGRESS_MIN_INTERVAL_S", 1.0))
        self.pending = dict.fromkeys(_KEYS, 0.0)
        self.allocator_pending: dict[str, str] = {}
        """The latest allocator line per device (absolute values: a newer one replaces an older)."""
        self.sent_lines = 0
        self.failed_sends = 0
        self._last_sent: float | None = None
        """``clock()`` of the last send; None until the first, which is due at once whatever the
        host's uptime (the monotonic clock starts at boot)."""
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._sock_kind = ""

    def report(self, steps: float | None = None, tokens: float | None = None, samples: float | None = None) -> None:
        """Add increments (non-negative numbers; others are ignored) and send if the interval is due."""
        try:
            with self._lock:
                for key, value in (("steps", steps), ("tokens", tokens), ("samples", samples)):
                    if isinstance(value, int | float) and math.isfinite(value) and value > 0:
                        self.pending[key] += float(value)
                if self._due():
                    self._send_locked()
        except Exception:  # never into the training loop
            self.failed_sends += 1

    def report_allocator(self, devices: list[dict[str, Any]]) -> None:
        """Latest allocator figures, one dict per device (see :func:`torch_allocator_stats` for the keys);
        a device with a missing or bad figure is left out. Sent with the next progress send."""
        try:
            with self._lock:
                for device in devices:
                    line = _allocator_line(device)
                    if line is not None:
                        self.allocator_pending[line.split(" ", 2)[1]] = line
                if self._due():
                    self._send_locked()
        except Exception:
            self.failed_sends += 1

    def _due(self) -> bool:
        return self._last_sent is None or self.clock() - self._last_sent >= self.min_interval_s

    def flush(self) -> None:
        """Send what is pending now."""
        try:
            with self._lock:
                self._send_locked()
        except Exception:
            self.failed_sends += 1

    def _line(self) -> bytes:
        parts = [f"{key}=+{self.pending[key]:.17g}" for key in _KEYS if self.pending[key] > 0]
        return " ".join(parts).encode()

    def _target(self) -> tuple[str, Any] | None:
        if self.socket_path and os.path.exists(self.socket_path):
            return "unix", self.socket_path
        if self.host:
            return "udp", (self.host, self.port)
        return None

    def _socket(self, kind: str, address: Any) -> socket.socket:
        if self._sock is None or self._sock_kind != kind:
            if self._sock is not None:
                self._sock.close()
            if kind == "unix":
                family = socket.AF_UNIX
            else:
                family = socket.getaddrinfo(address[0], address[1], type=socket.SOCK_DGRAM)[0][0]
            self._sock = socket.socket(family, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
            self._sock_kind = kind
        return self._sock

    def _send_locked(self) -> None:
        self._last_sent = self.clock()
        line = self._line()
        if not line and not self.allocator_pending:
            return
        target = self._target()
        if target is None:
            return
        if line:
            if not self._sendto(target, line):
                return
            self.sent_lines += 1
            self.pending = dict.fromkeys(_KEYS, 0.0)
        for datagram in _pack(sorted(self.allocator_pending.values())):
            if not self._sendto(target, datagram):
                return
        self.allocator_pending = {}

    def _sendto(self, target: tuple[str, Any], data: bytes) -> bool:
        kind, address = target
        try:
            self._socket(kind, address).sendto(data, address)
        except OSError:
            self.failed_sends += 1
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            return False
        return True


def _whole(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return int(value)


def _allocator_line(device: dict[str, Any]) -> str | None:
    """``allocator device=0 reserved=N allocated=N [max_reserved=N] [retries=N] [ooms=N] [uuid=GPU-...]``."""
    index = _whole(device.get("device"))
    reserved, allocated = _whole(device.get("reserved_bytes")), _whole(device.get("allocated_bytes"))
    if index is None or reserved is None or allocated is None:
        return None
    parts = ["allocator", f"device={index}"]
    for key, name in _ALLOCATOR_FIELDS:
        value = _whole(device.get(key))
        if value is not None:
            parts.append(f"{name}={value}")
    uuid = device.get("gpu_uuid")
    if isinstance(uuid, str) and uuid.startswith(("GPU-", "MIG-")) and " " not in uuid and len(uuid) <= 80:
        parts.append(f"uuid={uuid}")
    return " ".join(parts)


def _pack(lines: list[str]) -> list[bytes]:
    """Lines joined into datagrams of at most :data:`MAX_DATAGRAM_BYTES`."""
    out: list[bytes] = []
    current = b""
    for line in lines:
        data = line.encode()
        if current and len(current) + 1 + len(data) > MAX_DATAGRAM_BYTES:
            out.append(current)
            current = b""
        current = current + b"\n" + data if current else data
    if current:
        out.append(current)
    return out


_default: ProgressReporter | None = None
_default_lock = threading.Lock()


def _reporter() -> ProgressReporter:
    global _default
    with _default_lock:
        if _default is None:
            _default = ProgressReporter()
            atexit.register(_default.flush)
        return _default


def report(steps: float | None = None, tokens: float | None = None, samples: float | None = None) -> None:
    """Add increments to this process's progress; non-blocking, never raises."""
    try:
        _reporter().report(steps=steps, tokens=tokens, samples=samples)
    except Exception:
        return


def flush() -> None:
    """Send pending increments now (also done at interpreter exit)."""
    try:
        _reporter().flush()
    except Exception:
        return


def report_allocator(devices: list[dict[str, Any]]) -> None:
    """Latest allocator figures per device (keys as :func:`torch_allocator_stats` returns); never raises."""
    try:
        _reporter().report_allocator(devices)
    except Exception:
        return


def _device_uuid(cuda: Any, index: int) -> str | None:
    try:
        uuid = str(cuda.get_device_properties(index).uuid)
    except Exception:  # older torch: no uuid in the properties
        return None
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def torch_allocator_stats(torch_module: Any = None) -> list[dict[str, Any]]:
    """PyTorch's caching-allocator figures for every device this process's allocator holds memory on.

    Per device: ``device``, ``gpu_uuid`` (when torch tells it), ``reserved_bytes``
    (``torch.cuda.memory_reserved``), ``allocated_bytes`` (``memory_allocated``), ``max_reserved_bytes``
    (``max_memory_reserved``), ``num_alloc_retries`` and ``num_ooms`` (``torch.cuda.memory_stats``).
    Empty when torch is not importable, CUDA is not initialised in this process, or anything fails:
    devices other processes use (other ranks) hold nothing in this allocator and are left out.
    """
    try:
        if torch_module is None:
            import torch as torch_module  # type: ignore[import-not-found, no-redef]
        cuda = torch_module.cuda
        if not cuda.is_available() or not cuda.is_initialized():
            return []
        out = []
        for index in range(cuda.device_count()):
            reserved = int(cuda.memory_reserved(index))
            stats = cuda.memory_stats(index) or {}
            retries, ooms = stats.get("num_alloc_retries"), stats.get("num_ooms")
            if reserved <= 0 and not retries and not ooms:
                continue
            out.append({"device": index, "gpu_uuid": _device_uuid(cuda, index), "reserved_bytes": reserved,
                        "allocated_bytes": int(cuda.memory_allocated(index)),
                        "max_reserved_bytes": int(cuda.max_memory_reserved(index)),
                        "num_alloc_retries": retries, "num_ooms": ooms})
        return out
    except Exception:
        return []


def report_torch_allocator(reporter: ProgressReporter | None = None, torch_module: Any = None) -> None:
    """Collect :func:`torch_allocator_stats` and report them; never raises."""
    try:
        devices = torch_allocator_stats(torch_module)
        if devices:
            (reporter or _reporter()).report_allocator(devices)
    except Exception:
        return


class _StepCounter:
    """Turns a framework's cumulative step / token counters into increments."""

    def __init__(self, tokens_per_step: float | None, samples_per_step: float | None,
                 reporter: ProgressReporter | None, allocator: bool = True) -> None:
        self.tokens_per_step = tokens_per_step
        self.samples_per_step = samples_per_step
        self.reporter = reporter
        self.allocator = allocator
        self.last_step: float | None = None
        self.last_tokens: float | None = None
        self._allocator_at: float | None = None

    def allocator_stats(self, force: bool = False) -> None:
        """This process's allocator figures, at most once per the reporter's interval (every rank)."""
        if not self.allocator:
            return
        reporter = self.reporter or _reporter()
        now = time.monotonic()
        if force or self._allocator_at is None or now - self._allocator_at >= reporter.min_interval_s:
            self._allocator_at = now
            report_torch_allocator(reporter)

    def update(self, global_step: Any, tokens_seen: Any = None) -> None:
        try:
            if not isinstance(global_step, int | float):
                return
            steps = global_step - self.last_step if self.last_step is not None else global_step
            self.last_step = global_step
            if steps <= 0:
                return
            tokens: float | None = None
            if isinstance(tokens_seen, int | float) and tokens_seen > 0:
                tokens = tokens_seen - (self.last_tokens or 0.0)
                self.last_tokens = tokens_seen
            elif self.tokens_per_step:
                tokens = steps * self.tokens_per_step
            samples = steps * self.samples_per_step if self.samples_per_step else None
            (self.reporter or _reporter()).report(steps=steps, tokens=tokens, samples=samples)
        except Exception:
            return

    def flush(self) -> None:
        (self.reporter or _reporter()).flush()


def transformers_callback(tokens_per_step: float | None = None, samples_per_step: float | None = None,
                          reporter: ProgressReporter | None = None, allocator: bool = True) -> Any:
    """A ``transformers.TrainerCallback`` reporting optimizer steps (``state.global_step``).

    Tokens come from ``state.num_input_tokens_seen`` when the Trainer counts them
    (``include_num_input_tokens_seen=True``), else ``tokens_per_step`` per step. Only the local
    main process of each pod reports steps; with ``allocator`` every process also reports its
    caching allocator's figures (:func:`torch_allocator_stats`) after steps, at most once per interval.
    Use: ``Trainer(..., callbacks=[transformers_callback()])``.
    """
    from transformers import TrainerCallback

    counter = _StepCounter(tokens_per_step, samples_per_step, reporter, allocator)

    class GpulensProgressCallback(TrainerCallback):  # type: ignore[misc, valid-type]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if getattr(state, "is_local_process_zero", True):
                counter.update(getattr(state, "global_step", None), getattr(state, "num_input_tokens_seen", None))
            counter.allocator_stats()
            return control

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
            if getattr(state, "is_local_process_zero", True):
                counter.flush()
            return control

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            counter.allocator_stats(force=True)
            counter.flush()  # steps only from the local main process (others have none pending)
            return control

    return GpulensProgressCallback()


def lightning_callback(tokens_per_step: float | None = None, samples_per_step: float | None = None,
                       reporter: ProgressReporter | None = None, allocator: bool = True) -> Any:
    """A PyTorch Lightning ``Callback`` reporting ``trainer.global_step`` after each training batch.

    Imports ``lightning.pytorch``, or the older ``pytorch_lightning``. Only local rank 0 reports
    steps; with ``allocator`` every rank reports its caching allocator's figures, at most once per
    interval. Use: ``Trainer(callbacks=[lightning_callback(tokens_per_step=batch * seq_len)])``.
    """
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback

    counter = _StepCounter(tokens_per_step, samples_per_step, reporter, allocator)

    class GpulensProgressCallback(Callback):  # type: ignore[misc, valid-type]
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if getattr(trainer, "local_rank", 0) == 0:
                counter.update(getattr(trainer, "global_step", None))
            counter.allocator_stats()

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            counter.allocator_stats(force=True)
            counter.flush()

    return GpulensProgressCallback()
