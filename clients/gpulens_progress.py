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
"""

from __future__ import annotations

import atexit
import math
import os
import socket
import threading
import time
from typing import Any

__all__ = ["ProgressReporter", "flush", "lightning_callback", "report", "transformers_callback"]

DEFAULT_SOCKET = "/var/run/gpulens/progress.sock"
DEFAULT_UDP_PORT = 9477
_KEYS = ("steps", "tokens", "samples")


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


class ProgressReporter:
    """Coalesces increments and sends them to the agent; every public method swallows its errors."""

    def __init__(self, socket_path: str | None = None, host: str | None = None, port: int | None = None,
                 min_interval_s: float | None = None) -> None:
        self.socket_path = socket_path if socket_path is not None else os.environ.get(
            "GPULENS_PROGRESS_SOCKET", DEFAULT_SOCKET)
        self.host = host if host is not None else os.environ.get("GPULENS_PROGRESS_HOST", "")
        self.port = port if port is not None else int(_env_float("GPULENS_PROGRESS_UDP_PORT", DEFAULT_UDP_PORT))
        self.min_interval_s = (min_interval_s if min_interval_s is not None
                               else _env_float("GPULENS_PROGRESS_MIN_INTERVAL_S", 1.0))
        self.pending = dict.fromkeys(_KEYS, 0.0)
        self.sent_lines = 0
        self.failed_sends = 0
        self._last_sent = 0.0
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
                if time.monotonic() - self._last_sent >= self.min_interval_s:
                    self._send_locked()
        except Exception:  # never into the training loop
            self.failed_sends += 1

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
        self._last_sent = time.monotonic()
        line = self._line()
        if not line:
            return
        target = self._target()
        if target is None:
            return
        kind, address = target
        try:
            self._socket(kind, address).sendto(line, address)
        except OSError:
            self.failed_sends += 1
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            return
        self.sent_lines += 1
        self.pending = dict.fromkeys(_KEYS, 0.0)


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


class _StepCounter:
    """Turns a framework's cumulative step / token counters into increments."""

    def __init__(self, tokens_per_step: float | None, samples_per_step: float | None,
                 reporter: ProgressReporter | None) -> None:
        self.tokens_per_step = tokens_per_step
        self.samples_per_step = samples_per_step
        self.reporter = reporter
        self.last_step: float | None = None
        self.last_tokens: float | None = None

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
                          reporter: ProgressReporter | None = None) -> Any:
    """A ``transformers.TrainerCallback`` reporting optimizer steps (``state.global_step``).

    Tokens come from ``state.num_input_tokens_seen`` when the Trainer counts them
    (``include_num_input_tokens_seen=True``), else ``tokens_per_step`` per step. Only the local
    main process of each pod reports. Use: ``Trainer(..., callbacks=[transformers_callback()])``.
    """
    from transformers import TrainerCallback

    counter = _StepCounter(tokens_per_step, samples_per_step, reporter)

    class GpulensProgressCallback(TrainerCallback):  # type: ignore[misc, valid-type]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if getattr(state, "is_local_process_zero", True):
                counter.update(getattr(state, "global_step", None), getattr(state, "num_input_tokens_seen", None))
            return control

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
            if getattr(state, "is_local_process_zero", True):
                counter.flush()
            return control

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            return self.on_log(args, state, control)

    return GpulensProgressCallback()


def lightning_callback(tokens_per_step: float | None = None, samples_per_step: float | None = None,
                       reporter: ProgressReporter | None = None) -> Any:
    """A PyTorch Lightning ``Callback`` reporting ``trainer.global_step`` after each training batch.

    Imports ``lightning.pytorch``, or the older ``pytorch_lightning``. Only local rank 0 reports.
    Use: ``Trainer(callbacks=[lightning_callback(tokens_per_step=batch * seq_len)])``.
    """
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback

    counter = _StepCounter(tokens_per_step, samples_per_step, reporter)

    class GpulensProgressCallback(Callback):  # type: ignore[misc, valid-type]
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if getattr(trainer, "local_rank", 0) == 0:
                counter.update(getattr(trainer, "global_step", None))

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            if getattr(trainer, "local_rank", 0) == 0:
                counter.flush()

    return GpulensProgressCallback()
