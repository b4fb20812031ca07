"""Bring your own model and data: `"package.module:name"` in a scenario names a callable.

    [model]  name = "mypkg.models:resnet"      # (in_channels, image_size, num_classes) -> SplitModel,
                                               # or -> (nn.Module, "name of its final nn.Linear")
    [data]   dataset = "mypkg.data:load"       # () -> (x, y) or {"x", "y", "domain", "domains"}

The module must be importable where the nodes run: installed, on PYTHONPATH, or in the folder
the command runs from (`p2pfl` puts it first on the path, for itself and the nodes it starts).

**A scenario file is code**: a reference runs the function it names in the launcher and in every
node. So a scenario may name only modules next to it (or in the folder the command runs from)
and packages it lists for the purpose, `plugins = ["mypkg"]`; never the standard library,
`builtins` or p2pfl itself, listed or not (`"os:abort"` would otherwise kill the launcher).
Errors name the scenario field: a module that does not import, a name it lacks, a wrong return
type, or the user's own exception with its message and the line of their code that raised it.
"""

from __future__ import annotations

import importlib
import sys
import sysconfig
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from p2pfl.errors import ConfigError


# Never a scenario's to run, listed or not: the standard library (os, subprocess, shutil, ...),
# builtins (eval, exec) and p2pfl's own functions.
NEVER_PLUGINS = frozenset({"builtins", "p2pfl", *sys.stdlib_module_names})


def is_reference(name: str) -> bool:
    return ":" in name


def admit(reference: str, field: str, listed: Sequence[str], folders: Sequence[Path]) -> str:
    """The top-level package of `reference` if a scenario may run its code: listed in the
    scenario's `plugins`, or a module or package in one of `folders` (the scenario's own, the
    working directory); a ConfigError for `field` otherwise, before anything is imported."""
    top = reference.partition(":")[0].split(".")[0]
    if top in NEVER_PLUGINS:
        raise ConfigError(field, f"{reference!r} names {'p2pfl itself' if top == 'p2pfl' else 'the standard library'}"
                                 f" ({top}): a scenario file runs the code it names, so it may name only its own "
                                 "modules and packages it lists in `plugins`")
    if top in listed or any((f / f"{top}.py").is_file() or (f / top / "__init__.py").is_file() for f in folders):
        return top
    raise ConfigError(field, f"{reference!r}: {top} is neither a module next to the scenario nor a package it lists "
                             f"(a scenario file runs the code it names; to allow this one, add plugins = [\"{top}\"])")


def resolve(reference: str, field: str) -> Callable[..., Any]:
    """The callable `module:attribute` names; a ConfigError for `field` when there is none."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConfigError(field, f"expected 'package.module:name', got {reference!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an import error inside the user's module is theirs to read
        raise ConfigError(field, f"cannot import {module_name!r}: {describe_failure(exc)}") from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigError(field, f"module {module_name!r} has no {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(field, f"{reference!r} is a {type(target).__name__}, not a callable")
    return target


def call(reference: str, field: str, **kwargs: Any) -> Any:
    """Resolve `reference` and call it; its own failure becomes a ConfigError naming `field`,
    with the exception's message (file names kept) and the last line of the user's code it ran."""
    function = resolve(reference, field)
    try:
        return function(**kwargs)
    except Exception as exc:
        raise ConfigError(field, f"{reference} failed: {describe_failure(exc)}") from None


def _library_roots() -> list[Path]:
    """Where p2pfl, the standard library and installed packages live: not the user's code."""
    paths = sysconfig.get_paths()
    return [Path(__file__).resolve().parent, *{Path(paths[k]).resolve() for k in ("stdlib", "purelib", "platlib")}]


def describe_failure(exc: BaseException) -> str:
    """`Type: message (at file:line in function: code)`, at the last frame of the user's own code
    (not p2pfl, the standard library or an installed package), where there is one."""
    where = ""
    roots = _library_roots()
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not any(root == Path(f.filename).resolve() or root in Path(f.filename).resolve().parents
                         for root in roots)]
    if frames:
        last = frames[-1]
        where = f" (at {last.filename}:{last.lineno} in {last.name}: {(last.line or '').strip()})"
    return f"{type(exc).__name__}: {exc}{where}"
