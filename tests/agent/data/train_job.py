"""A tiny real training loop that reports its progress through ``clients/gpulens_progress.py``.

Run by tests/agent/test_progress.py as a separate process (the agent attributes it by the kernel's
credentials of this process): ``python train_job.py MODE STEPS [FORGED_POD_UID]`` with ``clients``
and the framework stand-ins on ``PYTHONPATH``. It waits for one line on stdin (the test maps this
PID to a pod first), trains, flushes and prints what it reported as JSON.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import gpulens_progress

BATCH, SEQ_LEN = 4, 16
TOKENS_PER_STEP = BATCH * SEQ_LEN


def data(step: int) -> list[tuple[float, float]]:
    return [((step * BATCH + i) % 10 / 10.0, 3.0 * ((step * BATCH + i) % 10 / 10.0) + 1.0) for i in range(BATCH)]


class LinearModel:
    """y = w x + b fitted by gradient descent on mean squared error."""

    def __init__(self) -> None:
        self.w, self.b = 0.0, 0.0

    def step(self, batch: list[tuple[float, float]], lr: float = 0.1) -> float:
        errors = [(self.w * x + self.b - y, x) for x, y in batch]
        loss = sum(e * e for e, _ in errors) / len(errors)
        self.w -= lr * sum(2 * e * x for e, x in errors) / len(errors)
        self.b -= lr * sum(2 * e for e, _ in errors) / len(errors)
        time.sleep(0.005)
        return loss

    def loss(self) -> float:
        points = [p for step in range(10) for p in data(step)]
        return sum((self.w * x + self.b - y) ** 2 for x, y in points) / len(points)


def main() -> None:
    mode, steps = sys.argv[1], int(sys.argv[2])
    forged = sys.argv[3] if len(sys.argv) > 3 else None
    sys.stdin.readline()
    model = LinearModel()
    loss_before = model.loss()
    if forged:
        claim = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        claim.sendto(f"pod={forged} steps=+1000".encode(), os.environ["GPULENS_PROGRESS_SOCKET"])
        claim.close()
    if mode == "plain":
        for step in range(steps):
            model.step(data(step))
            gpulens_progress.report(steps=1, tokens=TOKENS_PER_STEP, samples=BATCH)
        gpulens_progress.flush()
    elif mode == "transformers":
        from transformers import Trainer, TrainingArguments

        args = TrainingArguments(max_steps=steps, logging_steps=5, include_num_input_tokens_seen=True)
        Trainer(args, lambda step: (model.step(data(step)), TOKENS_PER_STEP),
                callbacks=[gpulens_progress.transformers_callback(samples_per_step=BATCH)]).train()
    elif mode == "lightning":
        from lightning.pytorch import Trainer as LightningTrainer

        trainer = LightningTrainer(max_steps=steps, callbacks=[
            gpulens_progress.lightning_callback(tokens_per_step=TOKENS_PER_STEP, samples_per_step=BATCH)])
        trainer.fit(lambda batch, _i: model.step(batch), [data(i) for i in range(10)])
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps({"steps": steps, "tokens": steps * TOKENS_PER_STEP, "samples": steps * BATCH,
                      "loss_before": loss_before, "loss_after": model.loss()}))


if __name__ == "__main__":
    main()
