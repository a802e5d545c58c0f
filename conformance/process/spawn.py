"""Starting the suite's processes with nothing imported but the standard library: a
backend's (worker.py), and the judge's (judge_process.py), which starts the backend's
first thing. The plugin starts the judge this way as soon as the options are known,
before the runner's own imports (NumPy, the spec, the checks), so that the framework's
import begins as early as it can. isolation.py and judge.py take the processes over."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection

#: the attribute of pytest's config that holds a judge started early
EARLY_ATTR = "_attention_conformance_early_judge"
#: each way of a process's socket: isolation.AHEAD_BYTES of calls sent ahead, and their
#: answers, must fit without a write waiting
SOCKET_BYTES = 256 * 1024


def log_file(directory: str | None = None):
    """A temporary log for a process's output (in `directory`: the judge's folder)."""
    return tempfile.NamedTemporaryFile(prefix="attention-conformance-backend-", suffix=".log",
                                       dir=directory, delete=False)


def log_folder() -> str:
    """A judge's temporary folder: its log, and those of the backend's processes it
    starts, removed whole by the runner (judge.py) however the judge ended."""
    return tempfile.mkdtemp(prefix="attention-conformance-judge-")


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
    return _spawn("backend_host", [reference] + ([] if device is None else [device]), log)


def launch_judge(options: dict, log):
    """Start a judge process writing to log, a log_file() of a log_folder() (options:
    judge_options()); it starts the backend's process, with its log in the same folder,
    loads the spec, and declares the backend. Returns (the process, this end of its
    socket)."""
    options = {**options, "log_dir": os.path.dirname(log.name)}
    return _spawn("judge_host", [json.dumps(options)], log)


def remove_folder(log):
    """Close a judge's log and remove its folder, the backend's logs in it included."""
    log.close()
    shutil.rmtree(os.path.dirname(log.name), ignore_errors=True)


def _spawn(module: str, arguments: list, log):
    """A process of its own session (a Ctrl-C at the terminal is its runner's to handle),
    given one end of a socket pair as its first argument."""
    ours, theirs = socket.socketpair()
    for end in (ours, theirs):      # room for calls sent ahead both ways (macOS: 8 KiB)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BYTES)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BYTES)
    log.seek(0)
    log.truncate()
    command = [sys.executable, "-m", f"attention_conformance.process.{module}", str(theirs.fileno()),
               *arguments]
    proc = subprocess.Popen(command, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    theirs.close()
    return proc, Connection(ours.detach())


def end_with_parent(every: float = 0.5) -> None:
    """A daemon thread that ends this process once the process that started it has gone
    (killed, say), even mid-call: the socket would tell only at the next read."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(every)
        os._exit(3)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def kill_group(proc):
    """SIGKILL the process and everything it started (its own session), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def stop(proc, conn, wait: float) -> bool:
    """Has a process told to stop ended? After `wait` seconds it is killed (wait > 0)."""
    try:
        proc.wait(timeout=wait) if wait else None
    except subprocess.TimeoutExpired:
        pass
    if proc.poll() is None:
        if not wait:
            return False
        kill_group(proc)
    conn.close()
    return True


def ending(code: int | None) -> str:
    """How a process ended, from its exit status (None: it did not, and was killed)."""
    if code is None:
        return "its process stopped answering and was killed"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "?"
        return f"its process was killed by signal {name} ({-code})"
    return f"its process exited with code {code}"


def log_tail(log) -> str:
    """The end of a process's log, as '; its last output:' and the text ('' if none)."""
    try:
        with open(log.name, "rb") as f:
            text = f.read()[-1500:].decode(errors="replace").strip()
    except OSError:
        return ""
    return f"; its last output:\n{text}" if text else ""


def judge_options(option) -> dict:
    """What the judge's process is started with, from a run's options (option(name) gives
    one's value): the backend, its device, when its process is replaced, the spec folder."""
    return {"reference": option("backend"), "device": option("device"),
            "restart_every": option("restart_every"), "restart_above_mib": option("restart_above"),
            "spec_dir": option("spec_dir")}


def start_early(config, options: dict):
    """Start the judge's process (and so the backend's) before pytest has configured the
    run (nothing waits for its load); judge.take_early() makes it the run's Judge. Killed
    at the config's cleanup if nothing took it (a usage error, --help)."""
    log = log_file(log_folder())
    proc, conn = launch_judge(options, log)
    setattr(config, EARLY_ATTR, (options, (proc, conn, log)))

    def cleanup():
        if config.__dict__.pop(EARLY_ATTR, None) is not None:
            proc.terminate()            # it stops the backend's process
            stop(proc, conn, wait=2)
            remove_folder(log)
    config.add_cleanup(cleanup)
