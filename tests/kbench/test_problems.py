"""Problem specs and the KernelBench layout: what ``--problems`` selects, and the one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.kbench.errors import LayoutError, ProblemSpecError
from actors.kbench.problems import DEV_SUBSET, dev_problems, level_dir, parse_spec, select


def _checkout(root: Path, level: int, numbers: range, nested: bool = False) -> Path:
    folder = (root / "KernelBench" if nested else root) / f"level{level}"
    folder.mkdir(parents=True)
    for n in numbers:
        (folder / f"{n}_Op{n}.py").write_text("# problem\n")
    (folder / "README.md").write_text("not a problem\n")
    return root


def test_numbers_and_ranges_are_merged_sorted_and_deduplicated() -> None:
    assert parse_spec("9,1,2,5-7,6", level=1) == (1, 2, 5, 6, 7, 9)
    assert parse_spec(" 3 ", level=2) == (3,)
    assert parse_spec("4-4", level=1) == (4,)


def test_dev_selects_the_development_subset_of_the_level() -> None:
    assert parse_spec("dev", level=3) == DEV_SUBSET[3]
    assert parse_spec("DEV,1", level=3) == (1, *DEV_SUBSET[3])
    assert len(DEV_SUBSET[1]) == 30
    assert len(DEV_SUBSET[2]) == 25
    assert len(DEV_SUBSET[3]) == 18
    assert parse_spec("dev", level=1)[:5] == (2, 3, 4, 6, 8)


def test_all_means_every_problem() -> None:
    assert parse_spec("all", level=1) == ()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty item"),
        ("1,,2", "empty item"),
        ("1-x", "cannot read '1-x'"),
        ("7-3", "runs backwards"),
        ("0,1", "start at 1"),
        ("all,3", "cannot be combined"),
        ("-2", "cannot read"),
    ],
)
def test_bad_specs_are_refused_with_the_reason(spec: str, message: str) -> None:
    with pytest.raises(ProblemSpecError) as err:
        parse_spec(spec, level=1)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_dev_on_a_level_without_a_subset_is_refused() -> None:
    with pytest.raises(ProblemSpecError) as err:
        parse_spec("dev", level=4)
    assert "no development subset for level 4" in str(err.value)


def test_select_finds_files_in_either_layout(tmp_path: Path) -> None:
    flat = _checkout(tmp_path / "flat", 1, range(1, 11))
    nested = _checkout(tmp_path / "repo", 1, range(1, 11), nested=True)
    for root in (flat, nested):
        picked = select(root, 1, "2,5-6")
        assert [(p.number, p.name, p.level) for p in picked] == [(2, "2_Op2", 1), (5, "5_Op5", 1), (6, "6_Op6", 1)]
        assert all(p.path.is_file() for p in picked)
    assert [p.number for p in select(flat, 1, "all")] == list(range(1, 11))


def test_select_names_problems_the_level_lacks(tmp_path: Path) -> None:
    root = _checkout(tmp_path, 1, range(1, 6))
    with pytest.raises(ProblemSpecError) as err:
        select(root, 1, "4-7")
    assert "level 1 has no problem 6, 7 (it has 1-5)" in str(err.value)


def test_dev_problems_of_a_full_level(tmp_path: Path) -> None:
    root = _checkout(tmp_path, 3, range(1, 51))
    assert [p.number for p in dev_problems(root, 3)] == list(DEV_SUBSET[3])


def test_bad_directories_and_levels_are_refused(tmp_path: Path) -> None:
    with pytest.raises(LayoutError) as missing:
        level_dir(tmp_path / "nope", 1)
    assert "not a directory" in str(missing.value)
    with pytest.raises(LayoutError) as empty:
        level_dir(tmp_path, 1)
    assert "not a KernelBench checkout" in str(empty.value)
    _checkout(tmp_path, 1, range(1, 3))
    with pytest.raises(LayoutError) as other:
        level_dir(tmp_path, 2)
    assert "has no level2/ (it has level1)" in str(other.value)
    with pytest.raises(LayoutError) as zero:
        level_dir(tmp_path, 0)
    assert "levels start at 1" in str(zero.value)
