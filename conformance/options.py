"""The options of a certification run, one row each: the pytest plugin declares every row
(plugin.py), and the command line's `certify` declares the rows it forwards (cli.py), so
that both read one name, type, default and help.

Each row says what `certify` does with it: FORWARDED (certify declares it and hands it
to pytest), PASSTHROUGH (certify does not parse it: it reaches pytest with the rest of
certify's unknown options) or OWN (certify gives it a form of its own: the positional
BACKEND, the global --spec-dir). Imports nothing but the standard library: pytest loads
the plugin, and so this module, in every run of every project installed beside it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

FORWARDED, PASSTHROUGH, OWN = "forwarded", "passthrough", "own"

PROFILES = ("quick", "long", "scale", "all")
#: the spec's dtype names (model/dtypes.py's DTYPES, which needs NumPy; a test holds
#: the two equal)
DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
#: a backend's process that has grown by this many MiB since its load is replaced: a
#: leak, not a case (a quick case needs tens of MiB); a restart costs a framework's import
RESTART_ABOVE_MIB = 4096.0


def not_negative(kind, least=0):
    """An option's type: a number of that kind, `least` or more (a least of 0: 0 turns
    the option off)."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not value >= least:              # NaN included
            floor = "0 (off)" if least == 0 else least
            raise argparse.ArgumentTypeError(f"must be {floor} or more, not {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


@dataclass(frozen=True)
class Option:
    flag: str
    help: str
    certify: str = FORWARDED
    default: object = None
    type: object = None
    choices: tuple | None = None
    action: str | None = None       # "append" (repeatable) or "store_true"
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")

    def kwargs(self, default=True) -> dict:
        """Keyword arguments of argparse's add_argument (and pytest's addoption); with
        default=False, no default: an option not given is None (certify's rows)."""
        given = {"help": self.help, "type": self.type, "choices": self.choices,
                 "action": self.action, "metavar": self.metavar}
        if default or self.action == "store_true":
            given["default"] = self.default
        return {k: v for k, v in given.items() if v is not None}

    def argv(self, value) -> list[str]:
        """The pytest arguments that give this option the value (none for None, [], False)."""
        if value is None or value is False or value == []:
            return []
        if self.action == "store_true":
            return [self.flag]
        values = value if self.action == "append" else [value]
        return [word for v in values for word in (self.flag, str(v))]


OPTIONS = (
    Option("--backend", "backend to certify: numpy | torch | jax | tensorflow | onnxruntime"
           " | onnx-reference | paddle | an entry point name | package.module:attr |"
           " path/file.py:attr", certify=OWN),
    Option("--device", "build the backend with device=DEVICE (torch: cpu, cuda, cuda:N; jax:"
           " cpu, gpu); default: the backend's own (the CPU for the built-in ones); a device"
           " the machine lacks is a load error, never the CPU", metavar="DEVICE"),
    Option("--spec-dir", "case files to run (default: the spec the package carries, or"
           " $ATTENTION_CONFORMANCE_SPEC/cases)", certify=OWN),
    Option("--profile", "quick (default) skips the long-sequence and scale cases; long runs"
           " only the long ones, scale only the largest (128k-token prefill, million-key"
           " decode, 65,544 heads); all runs every case", default="quick", choices=PROFILES),
    Option("--dtype", "run only this dtype (repeatable)", action="append",
           choices=DTYPE_NAMES),
    Option("--expected-failures", "an expected-failures file for this backend (repeatable)",
           default=[], action="append", metavar="FILE"),
    Option("--report", "write this backend's results, BACKEND.json and BACKEND.md, into DIR",
           metavar="DIR"),
    Option("--case-timeout", "seconds all the calls of one test may take together before"
           " it is failed as hung (default 120, ten times that for a case of the scale profile; 0:"
           " no limit)", certify=PASSTHROUGH, default=120.0, type=not_negative(float),
           metavar="S"),
    Option("--in-process", "run the backend in the runner's own process (for debugging: not"
           " isolated, so a crash ends the run and the backend can reach the checks)",
           certify=PASSTHROUGH, default=False, action="store_true"),
    Option("--restart-above", "start a fresh backend process once its memory has grown by MIB"
           f" since it loaded (default {RESTART_ABOVE_MIB:g}; 0: never for that)",
           certify=PASSTHROUGH, default=RESTART_ABOVE_MIB, type=not_negative(float),
           metavar="MIB"),
    Option("--restart-every", "also start a fresh backend process every N calls (default 0:"
           " only for memory, a crash or a timeout)", certify=PASSTHROUGH, default=0,
           type=not_negative(int), metavar="N"),
)


BY_FLAG = {o.flag: o for o in OPTIONS}


def rows(certify: str) -> list[Option]:
    """The rows that certify treats this way (FORWARDED, PASSTHROUGH or OWN)."""
    return [o for o in OPTIONS if o.certify == certify]


def forwarded_argv(args) -> list[str]:
    """The pytest arguments of every FORWARDED option that certify's args give."""
    return [word for o in rows(FORWARDED) for word in o.argv(getattr(args, o.dest, None))]


def passthrough_text() -> str:
    """certify's help line about the plugin's options it leaves to pytest."""
    flags = ", ".join(o.flag + (f" {o.metavar}" if o.metavar else "") for o in rows(PASSTHROUGH))
    return f"the runner's other options pass through to pytest: {flags} (pytest --help)"
