"""Starting a backend's process (worker.py) with nothing imported but the standard
library: the plugin starts it this way as soon as the options are known, before the
runner's own imports (NumPy, the spec, the checks), so that the framework's import in
that process begins as early as it can. isolation.py takes the process over."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection

#: the attribute of pytest's config that holds a process started early
EARLY_ATTR = "_attention_conformance_early_backend"


def log_file():
    return tempfile.NamedTemporaryFile(prefix="attention-conformance-backend-", suffix=".log",
                                       delete=False)


def remove_log(log):
    """Close and delete a backend process's log (a process still writing it goes on
    writing to the deleted file)."""
    try:
        log.close()
        os.unlink(log.name)
    except OSError:
        pass


def launch(reference: str, device: str | None, log):
    """Start a backend process writing to log; it loads the backend and declares it.
    Returns (the process, this end of its socket)."""
    ours, theirs = socket.socketpair()
    log.seek(0)
    log.truncate()
    command = [sys.executable, "-m", "attention_conformance.worker",
               str(theirs.fileno()), reference]
    if device is not None:
        command.append(device)
    proc = subprocess.Popen(command, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    theirs.close()
    return proc, Connection(ours.detach())


def kill_group(proc):
    """SIGKILL the process and everything it started (its own session), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def isolation_options(option) -> dict:
    """IsolatedBackend's keywords from a run's options; option(name) gives one's value."""
    return {"device": option("device"), "restart_every": option("restart_every"),
            "restart_above_mib": option("restart_above")}


def start_early(config, reference: str, device: str | None, **options):
    """Start a backend's process before pytest has configured the run (nothing waits for
    its load); isolation.take_early() makes it the run's IsolatedBackend. Killed at the
    config's cleanup if nothing took it (a usage error, --help)."""
    log = log_file()
    proc, conn = launch(reference, device, log)
    setattr(config, EARLY_ATTR, (reference, device, options, (proc, conn, log)))

    def cleanup():
        if config.__dict__.pop(EARLY_ATTR, None) is not None:
            kill_group(proc)
            conn.close()
            remove_log(log)
    config.add_cleanup(cleanup)
