"""The summarizer's prompt templates, shipped as package data.

Each ``*.md`` file is plain text; ``{name}`` tokens in it are filled by
:mod:`app.engine.compaction.summary`, which substitutes only the names it knows, in one
pass, so text that happens to contain braces is never touched.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files


@cache
def load_prompt(name: str) -> str:
    """The text of ``app/prompts/<name>.md``, without surrounding whitespace.

    Read here, once per process, so that the engine that fills the templates
    reads no files itself."""
    return files(__name__).joinpath(f"{name}.md").read_text(encoding="utf-8").strip()
