"""Finding a backend: built-in name, entry point, package.module:attr or path/file.py:attr."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

from ..backends import BUILTIN
from .interface import declaration_problems

ENTRY_POINT_GROUP = "attention_conformance.backends"


class BackendLoadError(Exception):
    """The backend reference cannot be resolved, imported or instantiated."""


def _entry_points() -> dict:
    # imported here: a built-in name or a module reference never reads the entry points,
    # and importlib.metadata costs each backend process ~8 ms to import
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _import_file(path: Path):
    """Import an adapter file; its folder becomes importable, as for `python path/file.py`."""
    if not path.is_file():
        raise BackendLoadError(f"no such file: {path}")
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.append(folder)     # appended: the adapter's siblings never shadow packages
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    module_name = f"_attention_conformance_adapter_{digest}"     # the same in every process
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def _resolve(reference: str):
    if reference in BUILTIN:
        reference = BUILTIN[reference]
    elif ":" not in reference:
        found = _entry_points().get(reference)
        if found is None:
            known = sorted(BUILTIN) + sorted(_entry_points())
            raise BackendLoadError(f"unknown backend {reference!r}; known: {', '.join(known)};"
                                   " or give package.module:attr or path/file.py:attr")
        return found.load()
    target, _, attr = reference.rpartition(":")
    if target.endswith(".py") or "/" in target or "\\" in target:
        module = _import_file(Path(target))
    else:
        module = importlib.import_module(target)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise BackendLoadError(f"{target} has no attribute {attr!r}") from None


def _takes_device(obj) -> bool:
    try:
        parameters = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):   # no signature to read: let the call say
        return True
    return any(p.name == "device" or p.kind is p.VAR_KEYWORD for p in parameters)


def _instantiate(obj, reference: str, device: str | None = None):
    """A backend object from an object, a class, or a factory taking no arguments (or,
    with a device, one taking ``device=``)."""
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "sdpa")):
        if device is None:
            return obj()
        if not _takes_device(obj):
            raise BackendLoadError(f"backend {reference!r} does not take a device "
                                   f"({getattr(obj, '__qualname__', obj)!s} has no 'device' "
                                   f"parameter): run it without --device {device}")
        return obj(device=device)
    if device is not None:
        raise BackendLoadError(f"backend {reference!r} is an object, already built: it "
                               f"cannot be given --device {device}; name its class or a "
                               "factory taking device= instead")
    return obj


def load_backend(reference: str, device: str | None = None):
    """The backend object named by reference, built for ``device`` when one is given
    (passed as ``device=DEVICE``); BackendLoadError with the reason if not."""
    try:
        backend = _instantiate(_resolve(reference), reference, device)
    except BackendLoadError:
        raise
    except Exception as exc:  # an adapter failing to import is reported once, clearly
        hint = " (is its framework installed?)" if isinstance(exc, ImportError) else ""
        raise BackendLoadError(f"backend {reference!r} failed to load: "
                               f"{type(exc).__name__}: {exc}{hint}") from exc
    missing = [a for a in ("name", "dtypes", "policy") if a not in _declared(backend)]
    if missing:
        raise BackendLoadError(f"backend {reference!r} lacks attribute(s) {', '.join(missing)}"
                               " (see docs/interface.md)")
    problems = declaration_problems(backend)
    if problems:
        raise BackendLoadError(f"backend {reference!r} declares what the interface does not"
                               " allow (see docs/interface.md): " + "; ".join(problems))
    return backend


def _declared(backend) -> set:
    """The attributes the backend really has: its instance's and its classes', not what a
    catch-all __getattr__ makes up."""
    names = set(getattr(backend, "__dict__", {}))
    for cls in type(backend).__mro__:
        names |= set(vars(cls))
    return names
