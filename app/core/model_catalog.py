"""The model catalog this process uses: the engine's built-in one
(:mod:`app.engine.accounting.catalog`) with the operator's overrides and default window
(``COMPACTD_MODEL_CATALOG``, ``COMPACTD_DEFAULT_CONTEXT_WINDOW``).

The settings read and check the override file (:func:`load_overrides`; a bad file
fails the start with one line); each app (and ``compactd worker``) makes its
settings' catalog the process's while it runs (:func:`use`), and the services look
models up through :func:`lookup`. A model found nowhere is logged once per process
(:func:`assumed`), and each session document that relies on the assumption says so.
"""

from __future__ import annotations

import json
import logging
import threading
import tomllib
from pathlib import Path

from app.engine.accounting import catalog

log = logging.getLogger("compactd.catalog")

_active = catalog.BUILT_IN
_logged: set[str] = set()
# Model names come from clients: past this many, no more are remembered (or logged).
MAX_LOGGED_MODELS = 10_000
_lock = threading.Lock()


def load_overrides(path: Path) -> tuple[catalog.Override, ...]:
    """The overrides in ``path``, a JSON or TOML file (by its suffix; TOML unless it
    ends in ``.json``). Raises ValueError with one line that names the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read the model catalog {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"the model catalog {path} is not UTF-8 text") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
        raise ValueError(f"the model catalog {path} is not valid {kind}: {exc}") from None
    try:
        return catalog.parse_overrides(data)
    except ValueError as exc:
        raise ValueError(f"the model catalog {path}: {exc}") from None


def use(active: catalog.Catalog) -> catalog.Catalog:
    """Make ``active`` the process's catalog; returns the one it replaces."""
    global _active
    previous, _active = _active, active
    return previous


def current() -> catalog.Catalog:
    return _active


def lookup(model: str) -> catalog.ModelSpec:
    """``model``'s entry in the process's catalog."""
    return catalog.lookup(model, _active)


def assumed(model: str, spec: catalog.ModelSpec) -> None:
    """Log, once per model name and process, that ``model`` is in no catalog and
    ``spec``'s window is assumed."""
    if model in _logged or len(_logged) >= MAX_LOGGED_MODELS:
        return
    with _lock:
        if model in _logged:
            return
        _logged.add(model)
    log.warning(
        "model %r is not in the catalog: assuming a context window of %d tokens and %d "
        "output tokens; give the session its context_window, or name the model in "
        "COMPACTD_MODEL_CATALOG (or set COMPACTD_DEFAULT_CONTEXT_WINDOW)",
        model,
        spec.context_window,
        spec.max_output_tokens,
        extra={"model": model, "context_window": spec.context_window},
    )
