"""The log parser on genuine compiler and runtime messages (``data/manifest.json`` says where each
came from and which category its cause belongs to)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actors.diagnosis.logparse import LogSource, classify_log, parse_log
from schemas import DiagnosisCategory

DATA = Path(__file__).with_name("data")
MANIFEST: list[dict[str, str]] = json.loads((DATA / "manifest.json").read_text())


def _text(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize("entry", MANIFEST, ids=[e["file"].removesuffix(".txt") for e in MANIFEST])
def test_captured_message_is_classified_by_its_cause(entry: dict[str, str]) -> None:
    text = _text(entry["file"])
    finding = classify_log(text)
    assert finding is not None, f"nothing recognised in {entry['file']} ({entry['origin']})"
    assert finding.category is DiagnosisCategory(entry["expected"])
    assert finding.evidence, "a finding must carry the lines it rests on"
    # The first evidence line is quoted from the log itself (clipped lines end in an ellipsis).
    assert finding.evidence[0].rstrip("…") in text


def test_manifest_covers_every_failure_family_with_real_tools() -> None:
    families = {DiagnosisCategory(e["expected"]).family for e in MANIFEST}
    assert families == {"compile", "runtime"}
    local = [e for e in MANIFEST if not e["origin"].startswith("public issue")]
    assert len(local) >= 25
    assert {e["file"].split("_")[0] for e in local} >= {"nvcc", "ptxas", "triton", "torch", "python", "load"}


def test_nvcc_error_points_at_file_line_and_offending_code() -> None:
    finding = classify_log(_text("nvcc_undefined_identifier.txt"))
    assert finding is not None
    assert finding.source is LogSource.NVCC
    assert finding.location == "nvcc_undefined_identifier.cu:3"
    assert "yy[i]" in finding.evidence[1]


def test_triton_compile_error_keeps_kernel_location_code_and_message() -> None:
    finding = classify_log(_text("triton_compile_broadcast.txt"))
    assert finding is not None
    assert finding.source is LogSource.TRITON
    assert finding.location == "kernel line 4:44"
    assert any("a + b" in line for line in finding.evidence)
    assert any("64 and 128" in line for line in finding.evidence)


def test_interpreter_error_points_into_the_kernel_not_the_launch_site() -> None:
    finding = classify_log(_text("triton_interp_name_error.txt"))
    assert finding is not None
    assert finding.location is not None
    assert finding.location.endswith("in name_error_kernel")
    assert any("* scale" in line for line in finding.evidence)


def test_specific_hint_comes_with_messages_that_say_more_than_their_category() -> None:
    cub = classify_log(_text("nvcc_cub_max_removed.txt"))
    arange = classify_log(_text("triton_interp_arange_np2.txt"))
    assert cub is not None
    assert cub.hint is not None
    assert "cuda::maximum" in cub.hint
    assert arange is not None
    assert arange.hint is not None
    assert "next_power_of_2" in arange.hint


def test_compiler_error_outranks_the_build_wrapper_around_it() -> None:
    findings = parse_log(_text("load_inline_cpp_undeclared.txt"))
    categories = [f.category for f in findings]
    assert categories[0] is DiagnosisCategory.COMPILE_TYPE
    assert DiagnosisCategory.COMPILE_OTHER in categories[1:]  # ninja / "Error building extension"
    assert findings[0].specificity > findings[-1].specificity


def test_first_compiler_error_wins_among_equally_specific_ones() -> None:
    log = (
        'k.cu(3): error: identifier "a" is undefined\n    x = a;\n    ^\n\n'
        'k.cu(9): error: identifier "b" is undefined\n    y = b;\n    ^\n'
    )
    finding = classify_log(log)
    assert finding is not None
    assert finding.location == "k.cu:3"


def test_unrecognised_text_gives_no_finding() -> None:
    assert classify_log("all good\n42 tests passed\n") is None
    assert classify_log("") is None
    assert classify_log(None) is None


def test_bare_exception_line_without_traceback_is_read() -> None:
    finding = classify_log("SyntaxError: invalid syntax (candidate.py, line 7)")
    assert finding is not None
    assert finding.category is DiagnosisCategory.COMPILE_SYNTAX
