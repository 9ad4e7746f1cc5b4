"""`scripts:NAME`: Python callables from the configured scripts folder, and only from there.

`scripts:tests.validate-expense` resolves, inside the scripts folder, to
  1. the file `tests/validate-expense.py`, calling its role function
     (`validate` for assertions, `simulate` for simulators, `generate` for generators,
     `respond` for script agents; `main` otherwise), or
  2. the file `tests.py`, calling its function `validate_expense` ('-' becomes '_').
A name never leaves the folder: no absolute paths, no `..`, and symlinks pointing
outside are refused. On a fleet the folder is the worker's own AGENTTEST_SCRIPTS_DIR,
never one a run names (agents/config.py `scripts_path`).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import inspect
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from agenttest_worker.agents.refs import is_valid_name

ScriptRole = Literal["assertion", "simulator", "generator", "agent"]

ROLE_FUNCTIONS: dict[ScriptRole, str] = {
    "assertion": "validate",
    "simulator": "simulate",
    "generator": "generate",
    "agent": "respond",
}


class ScriptError(Exception):
    """A script reference that cannot be resolved or loaded, with a message for the user."""


@dataclass(frozen=True)
class ResolvedScript:
    file: Path
    function: str


def resolve_script(scripts_dir: Path | None, ident: str, role: ScriptRole) -> ResolvedScript:
    """`ident`'s file and function in `scripts_dir`; None is a worker without a scripts
    folder of its own (ProjectConfig.scripts_path), where no script runs."""
    if not is_valid_name(ident):
        raise ScriptError(f"scripts:{ident}: not a valid script name")
    if scripts_dir is None:
        raise ScriptError(
            f"scripts:{ident}: this worker has no scripts folder: set AGENTTEST_SCRIPTS_DIR "
            "on the workers (on a fleet, a run's own scripts_dir is never used)"
        )
    root = scripts_dir.resolve()
    parts = ident.split(".")
    candidates: list[tuple[Path, str | None]] = [
        (root.joinpath(*parts[:-1], parts[-1] + ".py"), None),
    ]
    if len(parts) > 1:
        candidates.append((root.joinpath(*parts[:-2], parts[-2] + ".py"), parts[-1]))
    for file, function in candidates:
        if not file.is_file():
            continue
        real = file.resolve()
        if not real.is_relative_to(root):
            raise ScriptError(f"scripts:{ident}: {file} points outside the scripts folder {root}")
        name = (function or ROLE_FUNCTIONS[role]).replace("-", "_")
        return ResolvedScript(real, name)
    tried = " or ".join(str(f) for f, _ in candidates)
    raise ScriptError(f"scripts:{ident}: no script found (looked for {tried})")


_lock = threading.Lock()
_modules: dict[tuple[Path, float], ModuleType] = {}


def _load_module(file: Path) -> ModuleType:
    key = (file, file.stat().st_mtime)
    with _lock:
        if key in _modules:
            return _modules[key]
        # One name per file (the path's hash keeps scripts/a_b.py and scripts/a/b.py apart).
        digest = hashlib.sha1(str(file).encode()).hexdigest()[:10]
        stem = re.sub(r"\W", "_", file.stem)
        module_name = f"agenttest_scripts.{stem}_{digest}"
        spec = importlib.util.spec_from_file_location(module_name, file)
        if spec is None or spec.loader is None:
            raise ScriptError(f"cannot load {file}")
        module = importlib.util.module_from_spec(spec)
        # The script's folder is importable, so a script may import its helpers.
        folder = str(file.parent)
        if folder not in sys.path:
            sys.path.append(folder)
        # Registered while it runs, as a normal import would be: dataclasses, pickle and
        # typing.get_type_hints look the module up in sys.modules.
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise ScriptError(f"{file}: failed to import: {type(exc).__name__}: {exc}") from exc
        _modules[key] = module
        return module


def load_script(scripts_dir: Path | None, ident: str, role: ScriptRole) -> Callable[..., Any]:
    resolved = resolve_script(scripts_dir, ident, role)
    module = _load_module(resolved.file)
    name = resolved.function
    fn = _defined_function(module, name)
    if fn is None and name == ROLE_FUNCTIONS[role] and not hasattr(module, name):
        fn = _defined_function(module, "main")
    if fn is None:
        found = getattr(module, name, None)
        why = (
            "names starting with _ cannot be referenced"
            if name.startswith("_")
            else "it is not a function defined in that file (an imported name, a class or "
            "another object cannot be referenced)"
            if found is not None
            else "there is no such function"
        )
        raise ScriptError(f"scripts:{ident}: {resolved.file.name} has no function {name}(): {why}")
    return fn


def _defined_function(module: ModuleType, name: str) -> Callable[..., Any] | None:
    """The function `name` that `module` itself defines, or None: a `scripts:` reference
    must not reach what the script imported (`subprocess.call`, `os.system`), a dunder or
    a private helper."""
    if name.startswith("_"):
        return None
    fn = getattr(module, name, None)
    if not inspect.isfunction(fn) or fn.__module__ != module.__name__:
        return None
    return fn


async def call_script(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a script without blocking the event loop (sync scripts run in a thread)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(result):
        return await result
    return result
