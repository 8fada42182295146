"""Stand-in for ``lightning.pytorch`` (not installed here: it needs torch): ``Callback`` with the
real hook signatures and a ``Trainer`` whose fit loop calls ``on_train_batch_end(trainer,
pl_module, outputs, batch, batch_idx)`` after each optimizer step with ``trainer.global_step``
already advanced, and ``on_train_end(trainer, pl_module)``, as Lightning's fit loop does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Callback:
    def on_train_batch_end(self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        pass

    def on_train_end(self, trainer: Trainer, pl_module: Any) -> None:
        pass


class Trainer:
    def __init__(self, max_steps: int, callbacks: list[Callback]) -> None:
        self.max_steps = max_steps
        self.callbacks = callbacks
        self.global_step = 0
        self.local_rank = 0

    def fit(self, training_step: Callable[[Any, int], float], batches: list[Any]) -> None:
        for batch_idx in range(self.max_steps):
            batch = batches[batch_idx % len(batches)]
            loss = training_step(batch, batch_idx)
            self.global_step += 1
            for callback in self.callbacks:
                callback.on_train_batch_end(self, None, {"loss": loss}, batch, batch_idx)
        for callback in self.callbacks:
            callback.on_train_end(self, None)
