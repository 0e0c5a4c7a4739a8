"""Getting candidate sources out of a model's reply.

A reply may hold: fenced blocks (backticks or tildes, any language tag, possibly an unclosed
last fence), several alternative solutions, one solution split over several blocks (helpers in
one, ``ModelNew`` in the next), a structured-output JSON object (``{"code": ...}`` or a list of
candidates), raw code with no fence at all, a ``<think>`` section of a reasoning model, or a
refusal. :func:`extract` turns any of these into an :class:`Extraction`: the complete sources
that define ``ModelNew`` (the evaluator judges whether they compile), or a typed reason why there
are none.
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from actors.llm.redact import shorten
from schemas.task import parse_module

_MODEL_NEW = re.compile(r"^[ \t]*class[ \t]+ModelNew\b", re.MULTILINE)
_FENCE = re.compile(r"^[ \t]{0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
_THINK = re.compile(r"<think>.*?(</think>|\Z)", re.DOTALL | re.IGNORECASE)
_CODE_START = re.compile(r"^(import|from)[ \t]+\S", re.MULTILINE)
_REFUSAL = re.compile(
    r"\bI(\s+can(no|')t|\s+am\s+(not\s+able|unable)|'m\s+(not\s+able|unable)|\s+won't|\s+will\s+not"
    r"|\s+must\s+decline)(\s+to)?\s+(help|assist|provide|comply|do\s+that|write|create)"
    r"|\bI'm\s+sorry,?\s+but\s+I\b",
    re.IGNORECASE,
)
_REFUSAL_MAX_CHARS = 800
_CODE_KEYS = ("code", "source", "python", "kernel")
_LIST_KEYS = ("candidates", "solutions", "kernels", "variants")
_PROSE_KEYS = ("description", "explanation", "summary", "rationale")
DESCRIPTION_LIMIT = 240


class ExtractOutcome(StrEnum):
    """What an extraction found."""

    CODE = "code"
    NO_CODE = "no_code"
    REFUSED = "refused"


@dataclass(frozen=True)
class Extraction:
    """The sources found in one reply (best first), or why there are none."""

    outcome: ExtractOutcome
    sources: tuple[str, ...] = ()
    description: str = ""
    """The reply's prose, shortened: what the model says it changed."""
    detail: str = ""
    """Why there is no code (plain language), when there is none."""


@dataclass(frozen=True)
class _Block:
    info: str
    body: str
    closed: bool


def extract(text: str, *, refusal: str | None = None, finish_reason: str | None = None) -> Extraction:
    """The candidate sources of a reply's text (see the module docstring for what is handled)."""
    if refusal and not text.strip():
        return Extraction(ExtractOutcome.REFUSED, detail=shorten(refusal.strip(), 200))
    visible = _THINK.sub("", text)
    structured = _from_json(visible)
    if structured is not None:
        return structured
    blocks, prose = _split_fences(visible)
    truncated = finish_reason == "length"
    if blocks:
        sources = _from_blocks(blocks, truncated)
    elif _MODEL_NEW.search(visible):
        sources = _from_raw(visible)
        prose = "" if sources else visible
    else:
        sources = []
    description = describe(prose)
    if sources:
        return Extraction(ExtractOutcome.CODE, sources=tuple(_dedupe(sources)), description=description)
    if not blocks and _REFUSAL.search(visible[:_REFUSAL_MAX_CHARS]) and len(visible) <= _REFUSAL_MAX_CHARS:
        return Extraction(ExtractOutcome.REFUSED, description=description, detail=shorten(visible.strip(), 200))
    return Extraction(ExtractOutcome.NO_CODE, description=description, detail=_why_none(blocks, truncated))


def describe(prose: str) -> str:
    """The first sentences of the prose, markdown stripped, at most ``DESCRIPTION_LIMIT`` long."""
    lines = [re.sub(r"^\s*(#+|[-*+](?=\s)|\d+[.)](?=\s))\s*", "", line) for line in prose.splitlines()]
    flat = re.sub(r"\s+", " ", " ".join(line for line in lines if line.strip())).strip()
    flat = flat.replace("**", "").replace("__", "").replace("`", "")
    sentences = re.split(r"(?<=[.!?])\s+", flat)
    out = ""
    for sentence in sentences:
        if out and len(out) + len(sentence) + 1 > DESCRIPTION_LIMIT:
            break
        out = f"{out} {sentence}".strip()
        if len(out) >= DESCRIPTION_LIMIT // 2:
            break
    return shorten(out, DESCRIPTION_LIMIT)


def _split_fences(text: str) -> tuple[list[_Block], str]:
    blocks: list[_Block] = []
    prose: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opener = _FENCE.match(lines[i])
        if opener is None:
            prose.append(lines[i])
            i += 1
            continue
        fence = opener.group("fence")
        body: list[str] = []
        i += 1
        closed = False
        while i < len(lines):
            line = lines[i].strip()
            if line.startswith(fence[0] * len(fence)) and not line.strip(fence[0]):
                closed = True
                i += 1
                break
            body.append(lines[i])
            i += 1
        text_body = textwrap.dedent("\n".join(body))
        blocks.append(_Block(info=opener.group("info").strip().lower(), body=text_body, closed=closed))
    return blocks, "\n".join(prose)


def _from_blocks(blocks: list[_Block], truncated: bool) -> list[str]:
    sources: list[str] = []
    helpers: list[_Block] = []
    for block in blocks:
        if not block.closed and truncated and not _parses(block.body):
            continue  # cut off at max_tokens: certainly broken
        if _MODEL_NEW.search(block.body):
            sources.append(_with_helpers(block.body, helpers))
            helpers = []
        elif _parses(block.body):
            helpers.append(block)
    return sources


def _with_helpers(body: str, helpers: list[_Block]) -> str:
    """Prepend the earlier blocks that define names the ``ModelNew`` block uses but lacks."""
    if not helpers:
        return body
    try:
        used = _names_used(parse_module(body))
        own = _names_defined(parse_module(body))
    except SyntaxError:
        needed = helpers if "import " not in body else []
    else:
        needed = [h for h in helpers if (_names_defined(parse_module(h.body)) - own) & used]
    return "\n\n".join([*(h.body for h in needed), body])


def _names_defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _names_used(tree: ast.Module) -> set[str]:
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def _parses(source: str) -> bool:
    try:
        parse_module(source)
    except SyntaxError:
        return False
    return True


def _from_raw(text: str) -> list[str]:
    if _parses(text):
        return [text]
    start = _CODE_START.search(text)
    if start is None:
        return []
    code = text[start.start() :]
    return [code] if _MODEL_NEW.search(code) else []


def _from_json(text: str) -> Extraction | None:
    stripped = text.strip()
    fenced = re.fullmatch(r"(`{3,}|~{3,})[ \t]*json[ \t]*\n(?P<body>.*)\n[ \t]*\1[ \t]*", stripped, re.DOTALL)
    if fenced is not None:
        stripped = fenced.group("body").strip()
    if not stripped.startswith(("{", "[")):
        return None
    try:
        data: Any = json.loads(stripped)
    except json.JSONDecodeError:
        return None
    items = data if isinstance(data, list) else [data]
    listed = False
    if isinstance(data, dict):
        for key in _LIST_KEYS:
            if isinstance(data.get(key), list):
                items, listed = data[key], True
                break
    sources: list[str] = []
    prose: list[str] = []
    for item in items:
        if isinstance(item, str):
            sources.extend(_unfence(item))
        elif isinstance(item, dict):
            sources.extend(s for key in _CODE_KEYS if isinstance(item.get(key), str) for s in _unfence(item[key]))
            prose.extend(str(item[key]) for key in _PROSE_KEYS if isinstance(item.get(key), str))
    if listed:
        prose.extend(str(data[key]) for key in _PROSE_KEYS if isinstance(data.get(key), str))
    sources = [s for s in sources if _MODEL_NEW.search(s)]
    description = describe("\n".join(prose))
    if sources:
        return Extraction(ExtractOutcome.CODE, sources=tuple(_dedupe(sources)), description=description)
    return Extraction(
        ExtractOutcome.NO_CODE,
        description=description,
        detail="structured reply carries no source defining ModelNew",
    )


def _unfence(code: str) -> list[str]:
    blocks, _ = _split_fences(code)
    return [b.body for b in blocks] if blocks else [code]


def _dedupe(sources: list[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for source in sources:
        clean = source.strip("\n").rstrip() + "\n"
        if clean not in seen:
            seen.add(clean)
            out.append(clean)
    return out


def _why_none(blocks: list[_Block], truncated: bool) -> str:
    if not blocks:
        return "the reply holds no code"
    if truncated and not blocks[-1].closed:
        return "the reply was cut off at max_tokens inside its code block"
    return f"the reply holds {len(blocks)} code block(s) but none defines class ModelNew"
