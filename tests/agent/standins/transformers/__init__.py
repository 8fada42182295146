"""Stand-in for ``transformers`` (not installed here: torch alone is gigabytes): the part of its
callback API the gpulens callback uses, with the real hook signatures, and a ``Trainer`` whose loop
calls them in the real order (``on_step_end`` after each optimizer step, ``on_log`` every
``logging_steps``, ``on_train_end``), like ``transformers.trainer_callback.CallbackHandler``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainingArguments:
    max_steps: int = 10
    logging_steps: int = 5
    per_device_train_batch_size: int = 8
    include_num_input_tokens_seen: bool = False


@dataclass
class TrainerState:
    global_step: int = 0
    num_input_tokens_seen: int = 0
    is_local_process_zero: bool = True
    log_history: list[dict[str, float]] = field(default_factory=list)


@dataclass
class TrainerControl:
    should_log: bool = False


class TrainerCallback:
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        pass

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> None:
        pass

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        pass

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        pass

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        pass


class Trainer:
    def __init__(self, args: TrainingArguments, train_step: Callable[[int], tuple[float, int]],
                 callbacks: list[TrainerCallback]) -> None:
        self.args = args
        self.train_step = train_step
        self.callbacks = callbacks
        self.state = TrainerState()
        self.control = TrainerControl()

    def _call(self, event: str, **kwargs: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, event)(self.args, self.state, self.control, **kwargs)

    def train(self) -> TrainerState:
        self._call("on_train_begin")
        for step in range(self.args.max_steps):
            self._call("on_step_begin")
            loss, tokens = self.train_step(step)
            self.state.global_step += 1
            if self.args.include_num_input_tokens_seen:
                self.state.num_input_tokens_seen += tokens
            self._call("on_step_end")
            if self.state.global_step % self.args.logging_steps == 0:
                logs = {"loss": loss}
                self.state.log_history.append(logs)
                self._call("on_log", logs=logs)
        self._call("on_train_end")
        return self.state
