"""Stopping a training run on Ctrl-C or SIGTERM without losing it.

While ``fit`` runs, SIGINT and SIGTERM only *ask* it to stop: the loop notices at the next step boundary,
writes a checkpoint (atomically, like every other one) and raises ``TrainingInterrupted``, which the
commands print as one line and turn into the exit status a shell expects of a process stopped by that
signal (128 + the signal number: 130 for SIGINT, 143 for SIGTERM). A second signal while the first is
being handled raises ``KeyboardInterrupt`` at once: the user who presses Ctrl-C twice means it, and the
folder still holds the previous checkpoint because checkpoints replace each other atomically.

The handlers are installed only for the duration of ``fit`` (and only from the main thread, where Python
allows it); the previous ones are put back afterwards, so a library caller's own handlers survive.
"""
from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

__all__ = ["TrainingInterrupted", "StopSignals"]


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on a signal after saving a checkpoint; ``str()`` is the one line to print and
    ``exit_status`` the process's exit status (128 + the signal number).

    A ``KeyboardInterrupt`` so that code catching ``Exception`` does not swallow it."""

    def __init__(self, signum: int, step: int, out_dir: str) -> None:
        self.signum, self.step, self.out_dir = signum, step, out_dir
        super().__init__(f"interrupted at step {step}, checkpoint saved to {out_dir}; resume with --resume")

    @property
    def exit_status(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return str(self.args[0])


class StopSignals:
    """Context manager: while active, the first SIGINT/SIGTERM sets ``requested`` (the signal number) and
    the second raises ``KeyboardInterrupt``. Outside the main thread it installs nothing (``requested``
    stays None) because Python only lets the main thread set handlers."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Nothing is printed here: the handler may run while the main thread is inside a write to the same
        # stream, and a reentrant write raises. The loop reports the stop when it acts on it.
        if self.requested is not None:
            raise KeyboardInterrupt
        self.requested = signum

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            # None: the previous handler was not installed from Python and cannot be put back; the default
            # action is the closest equivalent.
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
