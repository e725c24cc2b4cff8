"""Stop requests from the outside world: SIGTERM, SIGINT (Ctrl-C), SIGUSR1 and SIGUSR2.

SLURM sends SIGUSR1 (with ``--signal=USR1@<seconds>``) or SIGTERM before it
pre-empts or ends a job, and submitit asks for SIGUSR2; Kubernetes and most
schedulers send SIGTERM; a user presses Ctrl-C. Inside :class:`StopSignals` none
of them interrupts the work in the middle: the handler only notes the signal, the
training loop reads :attr:`StopSignals.requested` at the next step boundary,
saves a checkpoint and raises :class:`Interrupted`. A second Ctrl-C raises
``KeyboardInterrupt`` at once for the impatient.

A Python handler that was installed for the signal before (submitit's, which
requeues the job on SLURM and exits) is not lost but deferred: it travels in
:attr:`Interrupted.handler`, and :meth:`Interrupted.hand_over` runs it once the
checkpoint is safe. Without that, submitit's handler would requeue and exit in
the middle of a step, and the work since the last periodic save would be lost.

:func:`terminate_raises_interrupt` is the simpler form for work that cleans up on
``KeyboardInterrupt`` (the data generators): SIGTERM then behaves like Ctrl-C.
"""

import contextlib
import os
import shlex
import signal
import sys
import threading
from pathlib import Path

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


class Interrupted(Exception):  # noqa: N818 - the word users see
    """A run stopped on a signal after saving its state; ``str()`` says how to resume.

    ``handler`` is the signal's earlier Python handler (see :meth:`StopSignals.deferred`).
    """

    def __init__(self, message: str, signum: int, handler=None):
        super().__init__(message)
        self.signum = signum
        self.handler = handler

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def hand_over(self) -> None:
        """Run the deferred handler now that the state is saved (submitit: requeue, exit).

        Does nothing without one; a handler that returns leaves the caller to exit.
        """
        if self.handler is not None:
            self.handler(self.signum, None)


def rerun_command() -> str:
    """The command line this process was started with (rerunning it resumes).

    In a job that submitit started (``python -m submitit.core._submit FOLDER``, on SLURM),
    the command to rerun is the sweep's, which this process does not know.
    """
    if sys.argv and sys.argv[0].endswith("_submit.py") and os.environ.get("SUBMITIT_EXECUTOR"):
        return "the sweep's lra-train -m command"
    return shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class StopSignals:
    """Context manager noting the first stop signal in :attr:`received`.

    Handlers are only installed from the main thread (Python's rule); elsewhere
    the context does nothing and :attr:`requested` stays False.
    """

    def __init__(self):
        self.received: int | None = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.received is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ""

    def deferred(self):
        """The Python handler the received signal had before this context, if any.

        Python's own Ctrl-C handler (it only raises ``KeyboardInterrupt``) and the
        non-callable dispositions (default, ignore) are not handed on.
        """
        previous = self._previous.get(self.received)
        if callable(previous) and previous is not signal.default_int_handler:
            return previous
        return None

    def _handle(self, signum, frame) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now
        if self.received is None:
            self.received = signum

    def __enter__(self) -> "StopSignals":
        if _in_main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


@contextlib.contextmanager
def terminate_raises_interrupt():
    """Within the block, SIGTERM raises ``KeyboardInterrupt`` as Ctrl-C does."""
    if not _in_main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
