"""Summaries by a model: the transcript it reads, its prompts, and its reply.

Compaction hands the summarizer model a plain-text transcript of the history
(:func:`serialize_conversation`), never the messages themselves: a model given
real tool calls tends to continue the conversation instead of describing it.
The prompt (:func:`build_prompt`) wraps that transcript in
``<conversation>`` tags, with the previous summary in ``<previous-summary>``
tags when this is not the first compaction and the lines a hook supplied in an
``<additional-context>`` list, followed by the instructions of the chosen
strategy (``structured`` sections or ``narrative`` prose), or the prompt a hook
supplied in their place.

Images and documents never reach a summarizer: each one is a pointer line in the
transcript (:func:`media_pointer`: what it is, its size or title, and where
``history_read`` opens it), never its bytes, and base64 that a text or a tool
call's arguments carry is left out too (:func:`without_inline_data`). The
compaction's plan hands the summarizer entries whose media parts are already
pointers with their seq (:func:`media_as_pointers`), and the summary lists them
in a ``<media>`` block (:func:`with_media`), so they stay readable through recall.

What comes back is cleaned (:func:`clean_reply`), merged with the summary of a
split turn's first part (:func:`merge_split_turn`), given the lists of files
read and modified (:func:`with_file_tags`), followed by the user's requests
quoted verbatim (:func:`with_user_requests`, clipped beyond their budget by
:func:`clip_request`) and finally shown to the agent's model as a user message
(:func:`render_context_message`).

The prompt texts live in ``app/prompts/*.md``. Their ``{name}`` tokens are
filled by one regex pass that knows only the names it is given, so summaries
and transcripts full of braces are never mistaken for placeholders.

Everything here is pure: no database, no HTTP, no clock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any, Literal

from app.engine.accounting.tokens import image_size
from app.engine.compaction.anchors import clip_keeping_anchors
from app.engine.model import Entry, Part
from app.prompts import load_prompt

Strategy = Literal["structured", "narrative"]
STRATEGIES: tuple[Strategy, ...] = ("structured", "narrative")

DEFAULT_CLIP_CHARS = 2_000
# User and assistant text carry the intent, so it is clipped far later than
# tool output and reasoning; it is still clipped, for the pasted megabyte log.
TEXT_CLIP_FACTOR = 4
# The share of a clipped text kept from its end: the last lines of an output
# (the exit status, the final exception) matter more than its middle.
TAIL_SHARE = 0.2
SHORT_SUMMARY_CHARS = 100
MIN_SUMMARY_CHARS = 20

SPLIT_TURN_SEPARATOR = "\n\n---\n\n**Turn Context (split turn):**\n\n"

_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


def fill(template: str, values: Mapping[str, str]) -> str:
    """``template`` with each ``{name}`` in ``values`` replaced, in a single pass.

    Unknown names are left as they are, and substituted text is never scanned
    again, so a value that contains ``{summary}`` stays as written.
    """
    return _PLACEHOLDER.sub(lambda m: values.get(m[1], m[0]), template)


# --- The transcript ------------------------------------------------------------------


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, keeping its head and a fifth for its tail.

    The cut is marked with ``[... N chars clipped ...]`` on its own line; the
    marker comes on top of ``limit``.
    """
    if len(text) <= limit:
        return text
    tail = int(limit * TAIL_SHARE)
    head = limit - tail
    omitted = len(text) - head - tail
    marker = f"[... {omitted} chars clipped ...]"
    if tail == 0:
        return f"{text[:head]}\n{marker}"
    return f"{text[:head]}\n{marker}\n{text[-tail:]}"


# --- Media: pointers, never bytes ----------------------------------------------------

MEDIA_OPEN = "<media>"
MEDIA_CLOSE = "</media>"
MEDIA_INTRO = "Images and documents of the history (read one back with history_read):"
# The most media pointers a summary lists (the latest ones).
MAX_MEDIA_POINTERS = 20
_URL_CHARS = 160
_TITLE_CHARS = 120
# A data URL, and a bare run of base64 long enough that it is surely a payload and
# not a word, a hash or a path (those are short, or hold '.', '-', '_').
# Every quantifier before "base64," is bounded, so a text full of "data:;k=" costs
# time linear in its length (unbounded ones backtracked: 38 s for 100 KB); a run starts
# only where no base64 character precedes it (else each one of a long run is a start).
_DATA_URL = re.compile(
    r"data:([\w.+-]{1,127}/[\w.+-]{1,127})?((?:;[\w.+-]{1,64}=[^;,\s]{0,256}){0,8});base64,"
    r"[A-Za-z0-9+/=_-]*"
)
_BASE64_RUN = re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{400,}={0,2}")
# A pointer's label: each of its words on one line, clipped (a file id, a media type or
# a URL is whatever the client sent).
_WORD_CHARS = 160


def _approx_bytes(chars: int) -> str:
    return f"{chars * 3 // 4:,} bytes"


def without_inline_data(text: str) -> str:
    """``text`` with each base64 payload in it (a data URL, or a bare run of 400 or
    more base64 characters mixing digits and both cases) replaced by a short note
    of what it was: a summarizer reads no bytes."""
    if "base64," not in text and len(text) < 400:
        return text

    def data_url(m: re.Match[str]) -> str:
        payload = m[0].split("base64,", 1)[1]
        return f"[{m[1] or 'data'} data omitted, {_approx_bytes(len(payload))}]"

    text = _DATA_URL.sub(data_url, text)

    def run(m: re.Match[str]) -> str:
        chunk = m[0]
        if not (any(c.isdigit() for c in chunk) and chunk.lower() != chunk != chunk.upper()):
            return chunk
        return f"[base64 data omitted, {_approx_bytes(len(chunk))}]"

    return _BASE64_RUN.sub(run, text)


def _clipped_title(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    title = " ".join(value.split())
    if len(title) > _TITLE_CHARS:
        title = title[: _TITLE_CHARS - 1] + "…"
    return '"' + title.replace('"', "'") + '"'


def _url(value: Any) -> str | None:
    """A URL as a pointer shows it: a data URL never (its media type only), another
    clipped."""
    if not isinstance(value, str) or not value:
        return None
    if value.startswith("data:"):
        return None
    return value if len(value) <= _URL_CHARS else value[: _URL_CHARS - 1] + "…"


def _data_url_type(value: Any) -> str | None:
    if isinstance(value, str) and value.startswith("data:"):
        head = value[5:].split(",", 1)[0].split(";", 1)[0]
        return head or None
    return None


def _size(data: Any) -> str | None:
    if not isinstance(data, str):
        return None
    size = image_size({"data": data}) if not data.startswith("data:") else image_size({"url": data})
    return f"{size[0]}x{size[1]}" if size else None


def _label(*words: str | None) -> str:
    """The words of a pointer's label, each squashed to one line and clipped: a label
    can neither grow with what a client sent nor break the line it is on."""
    out = []
    for word in words:
        if not word or not isinstance(word, str):  # a stored part may hold anything
            continue
        word = " ".join(word[: _WORD_CHARS * 4].split())
        out.append(word if len(word) <= _WORD_CHARS else word[: _WORD_CHARS - 1] + "…")
    return " ".join(out)


def _image_label(part: Part) -> str:
    url = part.get("url")
    media_type = part.get("media_type") or _data_url_type(url)
    size = image_size(part)
    where = _url(url)
    return _label("image", media_type, f"{size[0]}x{size[1]}" if size else None, where)


def _source_label(kind: str, block: Mapping[str, Any]) -> str:
    """An Anthropic ``image`` or ``document`` block (its ``source``: base64, url,
    text, content or file)."""
    source = block.get("source") if isinstance(block.get("source"), Mapping) else {}
    assert isinstance(source, Mapping)
    stype = source.get("type")
    media_type = source.get("media_type") if isinstance(source.get("media_type"), str) else None
    size = _size(source.get("data")) if stype == "base64" and kind == "image" else None
    where = None
    if stype == "url":
        where = _url(source.get("url"))
    elif stype == "file":
        where = f"file {source.get('file_id')}"
    elif stype == "content":
        media_type = media_type or "content"
    return _label(kind, media_type, size, _clipped_title(block.get("title")), where)


def _file_label(file: Mapping[str, Any], kind: str = "document") -> str:
    """An OpenAI ``file`` part's ``file`` (or a Responses ``input_file``)."""
    data = file.get("file_data")
    media_type = _data_url_type(data)
    name = _clipped_title(file.get("filename"))
    where = _url(file.get("file_url"))
    if where is None and isinstance(file.get("file_id"), str):
        where = f"file {file['file_id']}"
    return _label(kind, media_type, name, where)


def block_label(block: Mapping[str, Any]) -> str | None:
    """What a content block or part of either API's wire format is, in a few words,
    when it is media (an image, a document, a file, audio): ``image image/png
    1024x768``, ``document application/pdf "Q3 report"``; None for anything else.
    Never its bytes."""
    kind = block.get("type")
    if kind in ("image", "document"):
        return _source_label(str(kind), block)
    if kind == "image_url":
        image = block.get("image_url")
        url = image.get("url") if isinstance(image, Mapping) else image
        size = _size(url) if isinstance(url, str) and url.startswith("data:") else None
        return _label("image", _data_url_type(url), size, _url(url))
    if kind == "input_image":
        url = block.get("image_url")
        size = _size(url) if isinstance(url, str) and url.startswith("data:") else None
        file_id = block.get("file_id")
        where = _url(url) or (f"file {file_id}" if isinstance(file_id, str) else None)
        return _label("image", _data_url_type(url), size, where)
    if kind == "file" and isinstance(block.get("file"), Mapping):
        return _file_label(block["file"])
    if kind == "input_file":
        return _file_label(block)
    if kind == "input_audio":
        audio = block.get("input_audio")
        fmt = audio.get("format") if isinstance(audio, Mapping) else None
        return _label("audio", fmt if isinstance(fmt, str) else None)
    if kind == "container_upload":
        return _label("file", f"file {block.get('file_id')}")
    if kind == "response_part" and isinstance(block.get("response_part"), Mapping):
        return block_label(block["response_part"])
    return None


def media_label(part: Part) -> str | None:
    """What a stored part is when it is media (an image part, or an opaque block
    that is a document, a file, audio or a Files API image), else None."""
    kind = part.get("type")
    if kind == "image":
        return _image_label(part)
    if kind == "opaque" and isinstance(part.get("block"), Mapping):
        return block_label(part["block"])
    return None


def media_pointer(label: str, seq: int | None = None) -> str:
    """The line that stands for a medium: ``[image image/png 1024x768, seq 42:
    history_read from_seq=42 to_seq=42]``; without a seq, the label alone."""
    if seq is None:
        return f"[{label}]"
    return f"[{label}, seq {seq}: history_read from_seq={seq} to_seq={seq}]"


# The key of each part's words, where base64 could hide.
_TEXT_KEYS = {"text": "text", "reasoning": "text", "tool_call": "arguments"}


def media_as_pointers(entry: Entry, seq: int) -> Entry:
    """``entry`` (stored at ``seq``) as a summarizer reads it: each media part a text
    part holding its :func:`media_pointer`, and base64 in its texts, reasoning and
    tool calls' arguments left out (:func:`without_inline_data`, which keeps JSON
    valid: the note it writes holds no quote). The entry itself when there is
    nothing to change; the stored entry is never changed."""
    parts: list[Part] = []
    changed = False
    for p in entry.parts:
        label = media_label(p)
        if label is not None:
            new: Part = {"type": "text", "text": media_pointer(label, seq)}
        else:
            key = _TEXT_KEYS.get(p["type"], "")
            value = p.get(key) if key else None
            if isinstance(value, str) and (cleaned := without_inline_data(value)) != value:
                new = {**p, key: cleaned}
            else:
                new = p
        changed = changed or new is not p
        parts.append(new)
    return replace(entry, parts=parts) if changed else entry


def media_pointers(entries: Sequence[tuple[int, Entry]]) -> list[str]:
    """The :func:`media_pointer` of every medium in ``entries`` (seq, entry), in order."""
    return [
        media_pointer(label, seq)
        for seq, entry in entries
        for p in entry.parts
        if (label := media_label(p)) is not None
    ]


def carried_media(previous: Sequence[str], new: Sequence[str]) -> list[str]:
    """The pointers a summary lists: the previous summary's, then the new ones, each
    once, the latest :data:`MAX_MEDIA_POINTERS`."""
    merged = list(dict.fromkeys([*previous, *new]))
    return merged[-MAX_MEDIA_POINTERS:]


def with_media(summary: str, pointers: Sequence[str]) -> str:
    """``summary`` followed by its ``<media>`` block (one pointer a line); a block the
    summary already held (echoed by a model) is removed first."""
    text = summary.strip()
    if MEDIA_OPEN in text:
        text = _BLANK_RUNS.sub("\n\n", _MEDIA_BLOCK.sub("", text)).strip()
    if not pointers:
        return text
    block = "\n".join([MEDIA_OPEN, MEDIA_INTRO, *pointers, MEDIA_CLOSE])
    return f"{text}\n\n{block}" if text else block


def _content(parts: Sequence[Part]) -> str:
    pieces: list[str] = []
    for p in parts:
        kind = p.get("type")
        if kind == "text":
            pieces.append(without_inline_data(p["text"]))
        elif (label := media_label(p)) is not None:
            pieces.append(media_pointer(label))
    return "\n".join(pieces)


def render_call(part: Part, limit: int) -> str:
    """One tool call as ``name(key=value, ...)``, the values as compact JSON, clipped."""
    name = part.get("name") or "tool"
    raw = part.get("arguments") or ""
    parsed: Any
    # The standard library, not orjson: orjson reads integers wider than 64 bits
    # as floats, and the transcript must show the values as the agent sent them.
    try:
        parsed = json.loads(raw) if raw.strip() else {}
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        inner = ", ".join(
            f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in parsed.items()
        )
    else:
        inner = raw
    return clip(without_inline_data(f"{name}({inner})"), limit)


def serialize_conversation(entries: Sequence[Entry], clip_chars: int = DEFAULT_CLIP_CHARS) -> str:
    """The history as the labelled plain-text transcript the summarizer reads.

    One block per message, blocks separated by a blank line:
    ``[System]``, ``[User]``, ``[Assistant thinking]``, ``[Assistant]``,
    ``[Assistant tool calls]`` and ``[Tool result <name> <call id>]`` (with
    ``(error)`` when the tool failed). An image or a document becomes its
    :func:`media_pointer` line and base64 in any text is left out
    (:func:`without_inline_data`): no bytes reach a summarizer. Redacted
    reasoning is left out. Tool output, reasoning and tool calls are clipped to
    ``clip_chars`` (head and tail kept); user and assistant text to four times
    that. Tool results get their tool's name from the call they answer when
    the entry does not carry it.
    """
    if clip_chars < 1:
        raise ValueError("clip_chars must be at least 1")
    text_limit = clip_chars * TEXT_CLIP_FACTOR
    call_names: dict[str, str] = {}
    blocks: list[str] = []
    for entry in entries:
        role = entry.role
        if role == "assistant":
            calls: list[str] = []
            for p in entry.parts:
                kind = p.get("type")
                if kind == "reasoning":
                    thought = p.get("text")
                    if thought and thought.strip():
                        thought = without_inline_data(thought)
                        blocks.append(f"[Assistant thinking]: {clip(thought, clip_chars)}")
                elif kind == "tool_call":
                    call_names[p["id"]] = p["name"]
                    calls.append(render_call(p, clip_chars))
            text = _content(entry.parts)
            if text.strip():
                blocks.append(f"[Assistant]: {clip(text, text_limit)}")
            if calls:
                blocks.append("[Assistant tool calls]: " + "; ".join(calls))
        elif role == "tool":
            label = ["Tool result"]
            name = entry.tool_name or call_names.get(entry.tool_call_id or "")
            if name:
                label.append(name)
            if entry.tool_call_id:
                label.append(entry.tool_call_id)
            if entry.is_error:
                label.append("(error)")
            content = _content(entry.parts)
            body = clip(content, clip_chars) if content.strip() else "(no output)"
            blocks.append(f"[{' '.join(label)}]: {body}")
        else:
            content = _content(entry.parts)
            if content.strip():
                tag = "User" if role == "user" else "System"
                blocks.append(f"[{tag}]: {clip(content, text_limit)}")
    return "\n\n".join(blocks)


# --- Prompts -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PromptRequest:
    """One tool-less call to the summarizer: its system prompt and its user prompt."""

    system: str
    prompt: str


def _tagged(tag: str, text: str) -> str:
    # A closing tag inside the text would end the block early and let the rest
    # read as instructions; a backslash keeps it legible and inert.
    inner = text.strip().replace(f"</{tag}>", f"<\\/{tag}>")
    return f"<{tag}>\n{inner}\n</{tag}>"


def _focus(instructions: str | None) -> list[str]:
    if instructions is None or not instructions.strip():
        return []
    return [
        "Additional focus for this summary, requested by the user "
        f"(apply it within the format above):\n{instructions.strip()}"
    ]


ADDITIONAL_CONTEXT_TAG = "additional-context"


def render_additional_context(lines: Sequence[str]) -> str:
    """Extra context lines (a hook's ``context``: docs/events.md) as the
    ``<additional-context>`` list a prompt carries: one ``- `` item a line, a
    line's own line breaks indented under its item; blank lines left out; empty
    when there is none. A closing tag inside a line is made inert."""
    items: list[str] = []
    for line in lines:
        text = line.strip()
        if not text:
            continue
        items.append("- " + "\n  ".join(part.rstrip() for part in text.splitlines()))
    if not items:
        return ""
    return _tagged(ADDITIONAL_CONTEXT_TAG, "\n".join(items))


def build_prompt(
    conversation: str,
    *,
    strategy: Strategy = "structured",
    previous_summary: str | None = None,
    instructions: str | None = None,
    prompt: str | None = None,
    context: Sequence[str] = (),
) -> PromptRequest:
    """The request that summarizes ``conversation`` (a :func:`serialize_conversation`).

    With a non-empty ``previous_summary`` this is an update: the model merges
    the new messages into it and writes one summary in the same format
    (``update.md`` around the strategy's own instructions). ``instructions``
    are the user's extra focus (``/compact <instructions>``).

    ``prompt`` (a hook's: docs/events.md, "Blocking hooks"), when not blank,
    replaces the strategy's instructions: the summary's format and what it must
    say. Everything else stays: the ``<previous-summary>`` and ``<conversation>``
    blocks, ``update.md``'s merge instructions around it on an update, the
    focus. ``context`` lines come as an ``<additional-context>`` list
    (:func:`render_additional_context`) after the conversation, before the
    instructions.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown summary strategy {strategy!r}; expected one of {STRATEGIES}")
    sections: list[str] = []
    body = prompt.strip() if prompt is not None and prompt.strip() else load_prompt(strategy)
    if previous_summary is not None and previous_summary.strip():
        sections.append(_tagged("previous-summary", previous_summary))
        body = fill(load_prompt("update"), {"strategy_instructions": body})
    sections.append(_tagged("conversation", conversation))
    if extra := render_additional_context(context):
        sections.append(extra)
    sections.append(body)
    sections += _focus(instructions)
    return PromptRequest(system=load_prompt("system"), prompt="\n\n".join(sections))


def add_must_name(request: PromptRequest, items: Sequence[str]) -> PromptRequest:
    """``request`` asked again with the things its summary must name: the
    continuity gate's retry (``must_name.md``, one item a line, after the rest of
    the prompt). Unchanged without items."""
    if not items:
        return request
    listed = "\n".join(f"- {item}" for item in items)
    section = fill(load_prompt("must_name"), {"items": listed})
    return PromptRequest(system=request.system, prompt=f"{request.prompt}\n\n{section}")


def build_turn_prefix_prompt(
    conversation: str, instructions: str | None = None, *, context: Sequence[str] = ()
) -> PromptRequest:
    """The request that summarizes the first part of a split turn; the rest is
    kept. ``context`` as for :func:`build_prompt`."""
    sections = [_tagged("conversation", conversation)]
    if extra := render_additional_context(context):
        sections.append(extra)
    sections.append(load_prompt("turn_prefix"))
    sections += _focus(instructions)
    return PromptRequest(system=load_prompt("system"), prompt="\n\n".join(sections))


def build_short_prompt(summary: str) -> PromptRequest:
    """The request for a one-line title of ``summary``, for user interfaces."""
    prompt = f"{_tagged('summary', summary)}\n\n{load_prompt('short')}"
    return PromptRequest(system=load_prompt("system"), prompt=prompt)


# --- Putting the summary together ----------------------------------------------------


def merge_split_turn(history_summary: str, turn_prefix_summary: str) -> str:
    """The summary of the history, then the summary of the split turn's first part."""
    return history_summary.strip() + SPLIT_TURN_SEPARATOR + turn_prefix_summary.strip()


_FILE_TAGS = re.compile(r"[ \t]*<((?:read|modified)-files|media)>.*?</\1>[ \t]*(?:\n|\Z)", re.S)
_BLANK_RUNS = re.compile(r"\n{3,}")
_MEDIA_BLOCK = re.compile(r"[ \t]*<media>.*?</media>[ \t]*(?:\n|\Z)", re.S)


def strip_file_tags(summary: str) -> str:
    """``summary`` without any ``<read-files>``, ``<modified-files>`` or ``<media>`` blocks."""
    if "-files>" not in summary and MEDIA_OPEN not in summary:
        return summary.strip()
    return _BLANK_RUNS.sub("\n\n", _FILE_TAGS.sub("", summary)).strip()


def with_file_tags(summary: str, read_files: Sequence[str], modified_files: Sequence[str]) -> str:
    """``summary`` followed by the files read and modified, in tags.

    Tags already in ``summary`` (a model may echo them from the previous
    summary) are removed first, so repeated compactions never stack them. Paths
    keep their order, duplicates dropped; a file that was modified is listed as
    modified only. An empty list gets no tag.
    """
    modified = list(dict.fromkeys(p for p in modified_files if p))
    changed = set(modified)
    read = [p for p in dict.fromkeys(read_files) if p and p not in changed]
    tags: list[str] = []
    if read:
        tags.append("<read-files>\n" + "\n".join(read) + "\n</read-files>")
    if modified:
        tags.append("<modified-files>\n" + "\n".join(modified) + "\n</modified-files>")
    text = strip_file_tags(summary)
    block = "\n".join(tags)
    if not block:
        return text
    if not text:
        return block
    return f"{text}\n\n{block}"


# --- The user's requests, verbatim ----------------------------------------------------

USER_REQUESTS_OPEN = "<user-requests>"
USER_REQUESTS_CLOSE = "</user-requests>"
USER_REQUESTS_INTRO = "The user's requests as written: the first, then the latest (oldest first)."
_USER_REQUESTS = re.compile(r"[ \t]*<user-requests>.*?</user-requests>[ \t]*(?:\n|\Z)", re.S)


@dataclass(frozen=True, slots=True)
class KeptRequest:
    """A user request a summary quotes: its entry's ``seq`` and text, whole, or
    cut by :func:`clip_request` (``clipped``) when it did not fit its budget.
    ``first``: the session's first request."""

    seq: int
    text: str
    first: bool = False
    clipped: bool = False


def render_request(request: KeptRequest) -> str:
    """One quoted request, in ``<request>`` tags that give its seq (and whether it
    is the first, or was clipped). A closing ``</user-requests>`` inside the text
    gets a backslash (``<\\/user-requests>``), so the block always ends where it
    should, and base64 in it is left out (:func:`without_inline_data`); nothing
    else of the text is changed."""
    attrs = f' seq="{request.seq}"'
    if request.first:
        attrs += ' first="true"'
    if request.clipped:
        attrs += ' clipped="true"'
    text = without_inline_data(request.text.strip("\n"))
    text = text.replace(USER_REQUESTS_CLOSE, "<\\/user-requests>")
    return f"<request{attrs}>\n{text}\n</request>"


def omitted_note(count: int) -> str:
    plural = "s" if count != 1 else ""
    return f"[{count} other request{plural} not quoted here: the history has them]"


def render_user_requests(requests: Sequence[KeptRequest], omitted: int = 0) -> str:
    """The ``<user-requests>`` block: ``requests`` in order (the first request,
    then the latest ones), with a note of the ``omitted`` ones between the first
    and the rest; empty when there is nothing to quote."""
    if not requests:
        return ""
    lines = [USER_REQUESTS_OPEN, USER_REQUESTS_INTRO]
    noted = omitted <= 0
    for request in requests:
        if not noted and not request.first:
            lines.append(omitted_note(omitted))
            noted = True
        lines.append(render_request(request))
    if not noted:
        lines.append(omitted_note(omitted))
    lines.append(USER_REQUESTS_CLOSE)
    return "\n".join(lines)


def strip_user_requests(summary: str) -> str:
    """``summary`` without its ``<user-requests>`` block (a model may echo it; the
    next compaction quotes the requests again from the job's details)."""
    if USER_REQUESTS_OPEN not in summary:
        return summary.strip()
    return _BLANK_RUNS.sub("\n\n", _USER_REQUESTS.sub("", summary)).strip()


def with_user_requests(summary: str, block: str) -> str:
    """``summary`` without any block it held, then ``block`` (a
    :func:`render_user_requests`): last, right before the messages the context
    keeps, where the agent reads on from."""
    text = strip_user_requests(summary)
    if not block:
        return text
    return f"{text}\n\n{block}" if text else block


def clip_request(text: str, max_tokens: int, count: Callable[[str], int]) -> str:
    """``text`` within ``max_tokens`` (as ``count`` counts them), unchanged when it fits.

    Otherwise cut by :func:`app.engine.compaction.anchors.clip_keeping_anchors`, the one
    rule that keeps a request's anchors: whole lines, chosen by priority (the
    opening line; error lines; lines naming a task term first, or a path; other
    lines naming a term; then the rest from the head and the tail inwards), in
    their original order, each run of left-out lines marked ``[... N lines
    omitted ...]``; when no line fits, the head cut to size. That rule counts
    characters: the character budget starts at the text's own characters per
    token and shrinks until the result is within ``max_tokens``.
    """
    if max_tokens <= 0:
        return ""
    total = count(text)
    if total <= max_tokens:
        return text
    chars = min(len(text) - 1, len(text) * max_tokens // total)
    while chars > 0:
        clipped = clip_keeping_anchors(text, chars)
        tokens = count(clipped)
        if tokens <= max_tokens:
            return clipped
        chars = min(chars - 1, chars * max_tokens * 19 // (tokens * 20))
    return ""


def sources_line(start_seq: int, end_seq: int, compaction_id: str | None = None) -> str:
    """The line after a summary that says where what it replaced is: entries
    ``start_seq`` to ``end_seq``, which the agent's recall tools still reach."""
    which = f" or compaction={compaction_id}" if compaction_id else ""
    return (
        f"The entries it replaced (seq {start_seq} to {end_seq}) are still stored: search "
        f"them with the history_search tool and read them back with history_read "
        f"(from_seq={start_seq}{which})."
    )


def render_context_message(summary: str, sources: str = "") -> str:
    """The user message that stands for the compacted history in the agent's context;
    ``sources``: the line that says where what it replaced is (:func:`sources_line`)."""
    return fill(load_prompt("context"), {"summary": summary.strip(), "sources": sources}).strip()


def summary_from_context_message(text: str) -> str | None:
    """The summary inside a :func:`render_context_message` text, or None if it is not one."""
    before, _, after = load_prompt("context").partition("{summary}")
    closing = after.partition("{sources}")[0].strip()  # the closing tag
    body = text.strip()
    end = body.rfind(closing)
    if not body.startswith(before) or end < len(before):
        return None
    return body[len(before) : end].strip()


# --- The model's reply ---------------------------------------------------------------

_THINK = re.compile(r"\A<think(?:ing)?>.*?</think(?:ing)?>\s*", re.S | re.I)
_FENCE = re.compile(r"\A```[\w+.-]*[ \t]*\n(.*?)\n?[ \t]*```\Z", re.S)
_SUMMARY_TAGS = re.compile(r"\A<summary>\s*(.*?)\s*</summary>", re.S | re.I)
_PREAMBLE = re.compile(
    r"\A(?:(?:sure|certainly|okay|ok)[,.!]?\s+)?here(?:'s| is)\b[^\n]{0,80}?\bsummary\b[^\n]*:[ \t]*\n",
    re.I,
)
_REFUSAL = re.compile(
    r"\A(?:I'm sorry|I am sorry|I apologi[sz]e|I can(?:'|no)t|I'm unable|I am unable"
    r"|I'm not able|I am not able|As an AI)\b",
    re.I,
)
_TRANSCRIPT_LABEL = re.compile(r"^\[(?:User|Assistant|Tool result)[^\]\n]*\]:", re.M)
_REFUSAL_MAX_CHARS = 1_000
# Instruction lines this long are never written by chance: a reply holding
# several of them verbatim is the prompt echoed back, not a summary.
_ECHO_LINE_CHARS = 40
_ECHO_LINES = 3


@cache
def _prompt_lines() -> tuple[str, ...]:
    names = ("system", "structured", "narrative", "update", "turn_prefix", "short", "must_name")
    lines = {
        line.strip()
        for name in names
        for line in load_prompt(name).splitlines()
        if len(line.strip()) >= _ECHO_LINE_CHARS
    }
    return tuple(sorted(lines))


def _unwrap(text: str) -> str:
    previous = None
    while text != previous:
        previous = text
        text = _THINK.sub("", text).strip()
        text = _PREAMBLE.sub("", text).strip()
        if m := _FENCE.match(text):
            text = m[1].strip()
        if m := _SUMMARY_TAGS.match(text):
            text = m[1].strip()
    return text


def _echoes_prompt(text: str) -> bool:
    if "<conversation>" in text or "</conversation>" in text or "<previous-summary>" in text:
        return True
    if len(_TRANSCRIPT_LABEL.findall(text)) >= _ECHO_LINES:
        return True
    return sum(1 for line in _prompt_lines() if line in text) >= _ECHO_LINES


def clean_reply(text: str) -> str | None:
    """The summary in a model's reply, or None when the reply is not a usable summary.

    Removes surrounding whitespace, a leading ``<think>`` block, a "Here is the
    summary:" line, and a code fence or ``<summary>`` tags around the whole
    reply. None for a reply shorter than 20 characters, a refusal, or one that
    echoes the prompt or the transcript instead of summarizing it.
    """
    body = _unwrap(text.strip())
    if len(body) < MIN_SUMMARY_CHARS:
        return None
    if len(body) <= _REFUSAL_MAX_CHARS and _REFUSAL.match(body):
        return None
    if _echoes_prompt(body):
        return None
    return body


_TITLE_NOISE = re.compile(
    r"\A(?:#+\s*|[*_`\"'\u201c\u2018]+|title:\s*)+|[*_`\"'\u201d\u2019]+\Z", re.I
)


def clean_short_reply(text: str) -> str | None:
    """The one-line title in a model's reply, at most 100 characters, or None.

    Takes the first non-empty line, drops markdown, quotes, a ``Title:`` label
    and a final period; a longer line is cut at a word and ends with ``…``.
    """
    body = _THINK.sub("", text.strip())
    line = next((ln.strip() for ln in body.splitlines() if ln.strip()), "")
    line = " ".join(_TITLE_NOISE.sub("", line).split()).rstrip(".").strip()
    if len(line) < 3 or _REFUSAL.match(line):
        return None
    if len(line) > SHORT_SUMMARY_CHARS:
        cut = line[: SHORT_SUMMARY_CHARS - 1]
        space = cut.rfind(" ")
        if space >= SHORT_SUMMARY_CHARS // 2:
            cut = cut[:space]
        line = cut.rstrip(" ,;:-") + "…"
    return line
