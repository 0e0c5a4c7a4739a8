"""Extraction of candidate sources from model replies: fences, JSON, raw code, refusals."""

from __future__ import annotations

import json

import pytest

from actors.experts.llm.extract import DESCRIPTION_LIMIT, ExtractOutcome, extract
from tests.experts.llm_server import BROKEN_MODELNEW, GOOD_MODELNEW, answer

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize("tag", ["python", "py", "Python3", "", "triton", "cuda"])
def test_fenced_block_with_any_tag_is_extracted(tag: str) -> None:
    found = extract(answer(GOOD_MODELNEW, tag=tag))
    assert found.outcome is ExtractOutcome.CODE
    assert found.sources == (GOOD_MODELNEW,)
    assert found.description == "Fused GELU and scaling into one masked kernel."


def test_tilde_fence_and_indented_fence_are_extracted() -> None:
    tilde = f"Done.\n~~~python\n{GOOD_MODELNEW}~~~\n"
    indented = "1. The code:\n\n" + "\n".join("   " + line for line in answer(GOOD_MODELNEW).splitlines())
    assert extract(tilde).sources == (GOOD_MODELNEW,)
    assert extract(indented).sources == (GOOD_MODELNEW,)


def test_several_alternatives_give_several_sources_without_duplicates() -> None:
    other = GOOD_MODELNEW.replace("BLOCK = 1024", "BLOCK = 2048")
    reply = "Two options.\n" + answer(GOOD_MODELNEW) + "Or larger blocks:\n" + answer(other) + answer(GOOD_MODELNEW)
    found = extract(reply)
    assert found.sources == (GOOD_MODELNEW, other)


def test_solution_split_over_blocks_is_joined() -> None:
    kernel, model = GOOD_MODELNEW.split("class ModelNew")
    model = "import torch.nn as nn\nimport triton\n\n\nclass ModelNew" + model
    unrelated = "def unused_helper():\n    return 1\n"
    reply = f"Kernel:\n```python\n{kernel}```\nUnused:\n```python\n{unrelated}```\nModule:\n```python\n{model}```"
    found = extract(reply)
    assert found.outcome is ExtractOutcome.CODE
    (source,) = found.sources
    assert "def gelu_scale_kernel" in source
    assert source.index("def gelu_scale_kernel") < source.index("class ModelNew")
    assert "unused_helper" not in source


def test_code_that_does_not_compile_is_still_returned() -> None:
    found = extract(answer(BROKEN_MODELNEW))
    assert found.sources == (BROKEN_MODELNEW,)


@pytest.mark.parametrize(
    "payload",
    [
        {"code": GOOD_MODELNEW, "description": "One fused kernel."},
        {"candidates": [{"source": GOOD_MODELNEW, "explanation": "One fused kernel."}]},
        [{"code": f"```python\n{GOOD_MODELNEW}```", "summary": "One fused kernel."}],
    ],
)
def test_structured_json_reply_is_extracted(payload: object) -> None:
    found = extract(json.dumps(payload))
    assert found.outcome is ExtractOutcome.CODE
    assert found.sources == (GOOD_MODELNEW,)
    assert found.description == "One fused kernel."


def test_json_inside_a_json_fence_is_extracted() -> None:
    found = extract("```json\n" + json.dumps({"code": GOOD_MODELNEW}) + "\n```")
    assert found.sources == (GOOD_MODELNEW,)


def test_structured_reply_without_model_new_is_no_code() -> None:
    found = extract(json.dumps({"code": "def f():\n    return 1\n"}))
    assert found.outcome is ExtractOutcome.NO_CODE
    assert "ModelNew" in found.detail


def test_raw_code_without_fences_is_extracted() -> None:
    assert extract(GOOD_MODELNEW).sources == (GOOD_MODELNEW,)
    prefixed = "Here is the module:\n" + GOOD_MODELNEW
    assert extract(prefixed).sources == (GOOD_MODELNEW,)


def test_think_section_drafts_are_ignored() -> None:
    draft = GOOD_MODELNEW.replace("BLOCK = 1024", "BLOCK = 7")
    reply = f"<think>Maybe this:\n```python\n{draft}```\nNo, better blocks.</think>\n" + answer(GOOD_MODELNEW)
    assert extract(reply).sources == (GOOD_MODELNEW,)


def test_blocks_without_model_new_are_no_code() -> None:
    found = extract("Use this helper:\n```python\ndef f(x):\n    return x\n```\n")
    assert found.outcome is ExtractOutcome.NO_CODE
    assert found.detail == "the reply holds 1 code block(s) but none defines class ModelNew"


def test_prose_only_reply_is_no_code() -> None:
    found = extract("You should fuse the kernels and use larger blocks.")
    assert found.outcome is ExtractOutcome.NO_CODE
    assert found.detail == "the reply holds no code"


def test_reply_cut_at_max_tokens_is_no_code() -> None:
    cut = "Here it is.\n```python\n" + GOOD_MODELNEW[: len(GOOD_MODELNEW) // 2 + 40]
    found = extract(cut, finish_reason="length")
    assert found.outcome is ExtractOutcome.NO_CODE
    assert "cut off" in found.detail
    assert extract(cut + "\n", finish_reason="stop").outcome is ExtractOutcome.CODE


@pytest.mark.parametrize(
    "text",
    [
        "I'm sorry, but I can't help with that.",
        "I cannot assist with writing this kernel.",
        "I am unable to provide that code.",
    ],
)
def test_refusal_text_is_recognised(text: str) -> None:
    found = extract(text)
    assert found.outcome is ExtractOutcome.REFUSED
    assert found.detail == text


def test_structured_refusal_is_recognised() -> None:
    found = extract("", refusal="I can't help with that request.")
    assert found.outcome is ExtractOutcome.REFUSED
    assert found.detail == "I can't help with that request."


def test_refusal_words_next_to_code_do_not_hide_the_code() -> None:
    reply = answer(GOOD_MODELNEW, prose="I can't help noticing the old kernel was unmasked; fixed here.")
    assert extract(reply).outcome is ExtractOutcome.CODE


def test_description_is_short_and_plain() -> None:
    prose = "## Changes\n**Fused** the `gelu` and scale. " + "More words follow here. " * 40
    found = extract(answer(GOOD_MODELNEW, prose=prose))
    assert found.description.startswith("Changes Fused the gelu and scale.")
    assert len(found.description) <= DESCRIPTION_LIMIT
    assert "**" not in found.description
