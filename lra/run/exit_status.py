"""How an entry point ends on an error: the one wrapper every command-line app runs its body in.

A user-facing error (:class:`lra.errors.LRAError`) prints one line, ``error: <what is wrong
and what to do>``, and exits with status 2; a run stopped by a signal
(:class:`lra.run.signals.Interrupted`) prints one line saying how to resume and exits with
128 + the signal number. No JAX here: ``lra-report`` uses it too.
"""

import sys

from lra.errors import LRAError
from lra.run.signals import Interrupted, rerun_command


def report_errors(fn, *args):
    """``fn(*args)``, its user errors and interruptions turned into one line and an exit."""
    try:
        return fn(*args)
    except LRAError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except Interrupted as err:
        print(f"interrupted: {err}: {rerun_command()}", file=sys.stderr, flush=True)
        err.hand_over()
        sys.exit(err.exit_code)
