"""Every message that crosses a process boundary of an isolated run, named here and
nowhere else: the runner (pytest's process) and the judge, the judge and the backend's
process. A message is a dataclass; wire.py encodes it as its kind and its fields, and
decode() refuses a kind or a field it does not know. Standard library alone: the
plugin starts the judge before NumPy is imported.

    runner -> judge      Run (test ids to judge next, in order); the runner ends the
                         judge (and everything of its run) when the run ends
    judge -> runner      Declared or LoadError (once), then Verdicts and Alive
    judge -> backend     Call (one call of a test, with the id its answer must carry), Stop
    backend -> judge     Declared or LoadError (once), then one answer per call:
                         Outputs, Unsupported, Raised, WroteInput or TooLarge

The judge's own start options (JudgeOptions) are given once, on its command line.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

KINDS: dict[str, type] = {}


class ProtocolError(Exception):
    """A message that is not what this protocol says."""


def message(kind: str):
    """Register a message class under its kind (the name that crosses the wire)."""
    def register(cls):
        cls = dataclass(frozen=True)(cls)
        cls.KIND = kind
        cls.FIELDS = tuple(f.name for f in fields(cls))     # read for every message sent
        cls.FIELD_SET = frozenset(cls.FIELDS)               # and received
        KINDS[kind] = cls
        return cls
    return register


def fields_of(msg) -> dict:
    """A message's fields by name (wire.py sends them with its KIND)."""
    return {name: getattr(msg, name) for name in msg.FIELDS}


def decode(kind, values) -> object:
    """The message of this kind with these fields (ProtocolError if it is none)."""
    cls = KINDS.get(kind) if type(kind) is str else None
    if cls is None or type(values) is not dict or values.keys() != cls.FIELD_SET:
        raise ProtocolError(f"not a message of this protocol: "
                            f"{str({'kind': kind, 'fields': values})[:200]}")
    return cls(**values)


# --- the runner and the judge --------------------------------------------------------

@message("run")
class Run:
    tests: list             # test ids (topic/case-id[variant-dtype]), to judge in this order


@message("stop")
class Stop:
    pass


@message("declared")
class Declared:
    declaration: dict       # backend.interface.Declaration.as_dict()
    memory_mib: object      # what the backend's process holds once loaded (None: unknown)
    maps: object


@message("load_error")
class LoadError:
    text: str


@message("verdicts")
class Verdicts:
    verdicts: list          # [test id, verdict (checking/verdict.py)], in the order asked


@message("alive")
class Alive:
    """The judge's heartbeat: a judge silent for longer than judge_proxy.STALLED_SECONDS
    is stopped or stuck, and is replaced."""


# --- the judge and the backend's process ----------------------------------------------

@message("call")
class Call:
    id: int                 # the answer carries it: an answer to another call is refused
    op: str
    arrays: dict            # input name -> ndarray
    params: dict


@message("outputs")
class Outputs:
    call: int
    memory_mib: object      # each answer says what its process holds (the judge replaces
    maps: object            # a process that has grown too much)
    outputs: object         # what the op returned


@message("unsupported")
class Unsupported:
    call: int
    memory_mib: object
    maps: object
    text: str


@message("raised")
class Raised:
    call: int
    memory_mib: object
    maps: object
    text: str
    traceback: str


@message("wrote_input")
class WroteInput:
    call: int
    memory_mib: object
    maps: object
    text: str


@message("too_large")
class TooLarge:
    call: int
    memory_mib: object
    maps: object
    nbytes: int


ANSWERS = (Outputs, Unsupported, Raised, WroteInput, TooLarge)


# --- the judge's start options ---------------------------------------------------------

@dataclass(frozen=True)
class JudgeOptions:
    reference: str                  # --backend
    device: str | None              # --device
    spec_dir: str | None            # --spec-dir
    case_timeout: float             # --case-timeout: seconds all the calls of one test may take
    restart_every: int              # --restart-every
    restart_above_mib: float        # --restart-above
    log_dir: str = ""               # the judge's temporary folder (its logs and its backends')

    @classmethod
    def of(cls, option) -> "JudgeOptions":
        """From a run's options (option(name) gives one's value)."""
        return cls(reference=option("backend"), device=option("device"),
                   spec_dir=option("spec_dir"), case_timeout=option("case_timeout"),
                   restart_every=option("restart_every"),
                   restart_above_mib=option("restart_above"))

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "JudgeOptions":
        return cls(**json.loads(text))
