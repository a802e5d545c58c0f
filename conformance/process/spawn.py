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

import os
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
#: the longest end_tree() waits for the processes it killed before it looks again for
#: any they started meanwhile
ROUND_SECONDS = 0.01
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_PROC_READ = 1 << 16


def new_tag() -> str:
    """A fresh random tag (secrets.token_hex's bytes: os.urandom; `secrets` itself, with
    the hashlib and random it imports, would delay the judge's start of its backend)."""
    return os.urandom(8).hex()


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
    protocol.JudgeOptions, or its reference, device and log_dir alone."""
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
    import dataclasses          # of a runner, which has imported it already
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
    """The end of a process's log as a line 'its last output:' and the text ('' if none),
    its control characters shown as escapes (it reaches the user's terminal). On lines of
    its own: a failure's first line is its reason, then come the test, case and op."""
    try:
        with open(log.name, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    text = printable(text).strip()
    return f"\nits last output:\n{text}" if text else ""


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
    fields = _stat(pid)
    return fields[0] if fields else ""


def _read(path: str, whole: bool = True) -> bytes:
    """The bytes of a file of /proc, by os.read (a file object costs seven system calls
    a file, this three or four: ending a run reads two files of every process); whole=
    False: one read (a stat line, far shorter than the buffer)."""
    descriptor = os.open(path, os.O_RDONLY | _CLOEXEC)
    try:
        chunks = [os.read(descriptor, _PROC_READ)]
        while whole and chunks[-1]:
            chunks.append(os.read(descriptor, _PROC_READ))
        return b"".join(chunks)
    finally:
        os.close(descriptor)


def _stat(pid) -> tuple[str, int] | None:
    """(state letter, parent pid) of a process, from /proc (None: gone, or no /proc)."""
    try:
        fields = _read(f"/proc/{pid}/stat", whole=False).rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def _processes() -> dict[int, tuple[str, int]]:
    """pid -> (state letter, parent pid) of every process (Linux; {} elsewhere)."""
    found = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            fields = _stat(entry)
            if fields is not None:
                found[int(entry)] = fields
    return found


def _tagged(processes, tag: tuple[str, str]) -> set[int]:
    marker = f"{tag[0]}={tag[1]}".encode()
    found = set()
    for pid in processes:
        try:
            if marker in _read(f"/proc/{pid}/environ").split(b"\0"):
                found.add(pid)
        except OSError:
            pass
    return found


def tree(pid: int | None, tag: tuple[str, str] | None) -> set[int]:
    """pid, every process below it, and every process carrying tag (alive or a zombie)."""
    return set(_tree(pid, tag))


def _tree(pid: int | None, tag: tuple[str, str] | None) -> dict[int, str]:
    """tree(), each process with its state letter ('' where unknown: no /proc)."""
    processes = _processes()
    found = {pid} if pid is not None and (pid in processes or not processes) else set()
    children: dict[int, list[int]] = {}
    for child, (_, parent) in processes.items():
        children.setdefault(parent, []).append(child)
    if tag is not None:
        found |= _tagged(processes, tag)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    found.discard(os.getpid())
    return {p: processes[p][0] if p in processes else "" for p in found}


def end_tree(proc: subprocess.Popen | None, tag: tuple[str, str] | None) -> None:
    """SIGKILL a process (reaped), everything below it and everything carrying tag, and
    return once none of them is alive (5 s at most: a process in an uninterruptible
    wait dies when it leaves it). Each round stops what it finds before killing it
    (nothing stopped can fork), waits ROUND_SECONDS at most for them to end, and looks
    again; the rest of this process's children are reaped."""
    if proc is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)     # its group at once: the common case
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pids = {p for p, letter in _tree(proc.pid if proc is not None else None, tag).items()
                if letter not in ("Z", "")}
        if not pids:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        _wait_ended(pids, min(deadline, time.monotonic() + ROUND_SECONDS))
        _reap_others(pids - ({proc.pid} if proc is not None else set()))
    if proc is not None:
        proc.wait()


def _wait_ended(pids, deadline: float) -> None:
    """Until the deadline at most, wait for processes killed to be zombies or gone (a
    process of 100 MB takes a millisecond or two to end)."""
    while any(state(pid) not in ("Z", "") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.0005)


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
    for pid, (letter, parent) in _processes().items():
        if parent == os.getpid() and pid not in own and letter == "Z":
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
