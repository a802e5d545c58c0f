"""Starting the run's processes and ending them, with the standard library alone (the
plugin starts the judge before NumPy is imported): a process is started in a session of
its own, given one end of a socket pair, and tagged in its environment; ending it ends
everything it started too, whatever those did to escape (a new session, a double fork).

A process is ended with its tree: every process below it (on Linux, from /proc) and
every process that carries its tag (an environment variable every descendant inherits,
which finds those that an ended parent left to init), stopped first so that none can
fork while the others are killed. The judge is also a subreaper (Linux), so that what
a backend process leaves behind is re-parented to the judge, not to init.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from ..model.text import printable

#: each way of a process's socket: the calls sent ahead (backend_proxy.AHEAD_BYTES) and
#: their answers must fit without a write waiting
SOCKET_BYTES = 256 * 1024
#: the tags a process's environment carries: the run's (the judge and everything below
#: it) and one per backend process (that process and everything below it)
RUN_TAG = "ATTENTION_CONFORMANCE_RUN"
BACKEND_TAG = "ATTENTION_CONFORMANCE_BACKEND"
#: names the judge's folder to a backend's process, which reads large arrays there (spill.py)
SPILL_ENV = "ATTENTION_CONFORMANCE_SPILL"


def new_tag() -> str:
    return secrets.token_hex(8)


def start(module: str, arguments: list, log, tag: tuple[str, str], env=None):
    """Start ``python -m attention_conformance.process.MODULE FD *arguments`` in a session
    of its own (Ctrl-C at the terminal is its runner's to handle), writing to log, with
    tag (an environment variable and its value) and env (more of them). Returns (the
    process, this end of the socket pair whose other end is FD)."""
    ours, theirs = socket.socketpair()
    for end in (ours, theirs):      # room for calls sent ahead both ways (macOS: 8 KiB)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BYTES)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BYTES)
    log.seek(0)
    log.truncate()
    command = [sys.executable, "-m", f"attention_conformance.process.{module}",
               str(theirs.fileno()), *arguments]
    proc = subprocess.Popen(command, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, tag[0]: tag[1], **(env or {})})
    theirs.close()
    return proc, ours


def start_backend(options):
    """(process, socket, log, tag) of a fresh backend process (backend_host.py), its log
    in the judge's folder, which it reads large arrays from (spill.py). options:
    protocol.JudgeOptions."""
    log = log_file(options.log_dir or None)
    tag = (BACKEND_TAG, new_tag())
    arguments = [options.reference] + ([options.device] if options.device else [])
    env = {SPILL_ENV: options.log_dir} if options.log_dir else {}
    return (*start("backend_host", arguments, log, tag, env), log, tag)


def start_judge(options):
    """(process, socket, log, tag) of a fresh judge (judge_host.py), in a temporary
    folder of its own, with a fresh run tag. options: protocol.JudgeOptions."""
    log = log_file(log_folder())
    tag = (RUN_TAG, new_tag())
    options = dataclasses.replace(options, log_dir=os.path.dirname(log.name))
    runner = str(os.getpid())           # the judge watches it from its first moment
    return (*start("judge_host", [options.to_json(), runner], log, tag), log, tag)


# --- logs ------------------------------------------------------------------------------

def log_folder() -> str:
    """A judge's temporary folder: its log, and those of the backend processes it starts,
    removed whole by the runner however the judge ended."""
    return tempfile.mkdtemp(prefix="attention-conformance-judge-")


def log_file(directory: str | None = None):
    return tempfile.NamedTemporaryFile(prefix="attention-conformance-backend-", suffix=".log",
                                       dir=directory, delete=False)


def remove_log(log) -> None:
    """Close and delete a process's log (a process still writing it writes to nothing)."""
    try:
        log.close()
        os.unlink(log.name)
    except OSError:
        pass


def remove_folder(log) -> None:
    """Close a judge's log and remove its folder, the backends' logs in it included."""
    log.close()
    shutil.rmtree(os.path.dirname(log.name), ignore_errors=True)


def log_tail(log, size: int = 1500) -> str:
    """The end of a process's log as '; its last output:' and the text ('' if none),
    its control characters shown as escapes (it reaches the user's terminal)."""
    try:
        with open(log.name, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    text = printable(text).strip()
    return f"; its last output:\n{text}" if text else ""


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


# --- ending processes ----------------------------------------------------------------

def state(pid: int) -> str:
    """The kernel's one-letter state of a process (T: stopped; '' where unknown)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""


def _processes() -> dict[int, int]:
    """pid -> parent pid of every process (Linux; {} elsewhere)."""
    parents = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parents[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return parents


def _tagged(parents, tag: tuple[str, str]) -> set[int]:
    marker = f"{tag[0]}={tag[1]}".encode()
    found = set()
    for pid in parents:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.add(pid)
        except OSError:
            pass
    return found


def tree(pid: int | None, tag: tuple[str, str] | None) -> set[int]:
    """pid, every process below it, and every process carrying tag (alive or a zombie)."""
    parents = _processes()
    found = {pid} if pid is not None and (pid in parents or not parents) else set()
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    if tag is not None:
        found |= _tagged(parents, tag)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    found.discard(os.getpid())
    return found


def end_tree(proc: subprocess.Popen | None, tag: tuple[str, str] | None) -> None:
    """SIGKILL a process (reaped), everything below it and everything carrying tag, and
    return once none of them is alive (5 s at most: a process in an uninterruptible
    wait dies when it leaves it). Each round stops what it finds before killing it
    (nothing stopped can fork); the rest of this process's children are reaped."""
    if proc is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)     # its group at once: the common case
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pids = {p for p in tree(proc.pid if proc is not None else None, tag)
                if state(p) not in ("Z", "")}
        if not pids:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        _reap_others(pids - ({proc.pid} if proc is not None else set()))
        time.sleep(0.01)
    if proc is not None:
        proc.wait()


def _reap_others(pids) -> None:
    """Reap those of pids that are this process's own children (a subreaper's adopted
    orphans); a Popen's own process is left to its Popen (which reads its status)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def become_subreaper() -> bool:
    """Orphans of this process's descendants are re-parented to it, not to init (Linux
    PR_SET_CHILD_SUBREAPER); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_orphans(own: set[int]) -> None:
    """Reap this subreaper's children that are not `own` (Popen's): adopted orphans
    that have ended, so that none stays a zombie."""
    for pid, parent in _processes().items():
        if parent == os.getpid() and pid not in own and state(pid) == "Z":
            _reap_others([pid])


def end_with_parent(before_exit=None, every: float = 0.5, parent: int | None = None) -> None:
    """A daemon thread that ends this process once the process that started it (parent,
    if given: its pid, known before this process could look) has gone (killed, say),
    even mid-call: the socket would tell only at the next read. Only before_exit runs
    then (the judge ends the processes it started), no finally block."""
    parent = os.getppid() if parent is None else parent

    def watch():
        while os.getppid() == parent:
            time.sleep(every)
        if before_exit is not None:
            before_exit()
        os._exit(3)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
