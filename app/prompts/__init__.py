"""The summarizer's prompt templates, shipped as package data.

Each ``*.md`` file is plain text; ``{name}`` tokens in it are filled by
:mod:`app.engine.summary`, which substitutes only the names it knows, in one
pass, so text that happens to contain braces is never touched.
"""
