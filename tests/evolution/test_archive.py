"""The MAP-Elites archive and its descriptors."""

from __future__ import annotations

from actors.evolution.archive import AddStatus, Archive
from actors.evolution.descriptors import DescriptorKind, DescriptorSpace, code_kernel_count, tile_elements
from schemas import Correctness, EvalStatus, ParamValue, Profile
from tests.evolution import factories as f

SPACE = DescriptorSpace.default()
TWO_KERNELS = f.KERNEL + "\n\n@triton.jit\ndef second(x_ptr, BLOCK: tl.constexpr = 256):\n    pass\n"


def test_only_clean_results_enter_the_archive() -> None:
    archive = Archive(SPACE, island="i0")
    cand = f.candidate()
    wrong = f.incorrect(cand, Correctness(trials=5, passed_trials=0, atol=1e-5, rtol=1e-5))
    flagged = f.correct(cand, 0.2, review=("faster than physics",))
    assert archive.add(cand, f.failed(cand)) is AddStatus.NOT_CLEAN
    assert archive.add(cand, wrong) is AddStatus.NOT_CLEAN
    assert archive.add(cand, flagged) is AddStatus.NOT_CLEAN
    assert len(archive) == 0
    assert archive.best() is None
    assert archive.add(cand, f.correct(cand, 0.2)) is AddStatus.NEW_CELL
    assert len(archive) == 1


def test_a_cell_keeps_its_fittest_candidate() -> None:
    archive = Archive(SPACE, island="i0")
    slow, fast, slower = (f.candidate() for _ in range(3))  # same params: same cell
    assert archive.add(slow, f.correct(slow, 0.5)) is AddStatus.NEW_CELL
    assert archive.add(fast, f.correct(fast, 0.25)) is AddStatus.IMPROVED
    assert archive.add(slower, f.correct(slower, 0.4)) is AddStatus.NOT_IMPROVED
    best = archive.best()
    assert best is not None
    assert best.candidate.candidate_id == fast.candidate_id
    assert archive.elite_of(slow.candidate_id) is None
    assert len(archive) == 1
    assert archive.replaced == 1


def test_different_tiles_and_launch_counts_keep_separate_niches() -> None:
    archive = Archive(SPACE, island="i0")
    small = f.candidate(params={"BLOCK_SIZE": 128, "num_warps": 4})
    large = f.candidate(params={"BLOCK_SIZE": 4096, "num_warps": 4})
    fused = f.candidate(params={"BLOCK_SIZE": 128, "num_warps": 4})
    assert archive.add(small, f.correct(small, 0.2, launches=2)) is AddStatus.NEW_CELL
    assert archive.add(large, f.correct(large, 0.9, launches=2)) is AddStatus.NEW_CELL  # worse, own niche
    assert archive.add(fused, f.correct(fused, 0.9, launches=1)) is AddStatus.NEW_CELL
    assert len(archive) == 3
    cells = {e.cell for e in archive.elites()}
    assert len(cells) == 3


def test_descriptors_prefer_measurement_and_fall_back_to_code() -> None:
    cand = f.candidate(source=TWO_KERNELS, params={})
    measured = f.correct(cand, 0.2, launches=1)
    unmeasured = measured.model_copy(update={"profile": Profile()})
    m = SPACE.measure(cand, measured)
    u = SPACE.measure(cand, unmeasured)
    assert (m["launches"], m["launches_from"]) == (1, "measured")
    assert (u["launches"], u["launches_from"]) == (2, "code")
    # the tile is what the source launches with; params only where the source has no constant
    assert u["tile_from"] == "code"
    assert tile_elements({"row_block_r": 1024, "mm_block_m": 64}, TWO_KERNELS) == (256, "code")
    assert tile_elements({"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4}, f.KERNEL) == (64 * 32, "params")
    assert code_kernel_count(TWO_KERNELS) == 2


def test_template_launch_constants_win_over_params_of_other_template_families() -> None:
    source = f.KERNEL + "\n_kf_pw0[(125,)](x, out, BLOCK=2048, num_warps=8, num_stages=1)\n"
    params: dict[str, ParamValue] = {"mm_block_m": 64, "mm_block_n": 64, "row_block_r": 1024, "pw_warps": 8}
    cand = f.candidate(source=source, params=params)
    values = SPACE.measure(cand, f.correct(cand, 0.2))
    assert (values["tile"], values["tile_from"]) == (11.0, "code")
    assert (values["warps"], values["warps_from"]) == (8, "code")


def test_unknown_descriptor_values_fall_into_the_last_bin() -> None:
    space = DescriptorSpace.of(DescriptorKind.WARPS, DescriptorKind.SOL_FRACTION)
    cand = f.candidate(params={})
    res = f.correct(cand, 0.2).model_copy(update={"sol": None})
    cell = space.cell(space.measure(cand, res))
    assert cell == (space.shape[0] - 1, space.shape[1] - 1)


def test_fusion_descriptor_counts_reference_ops_per_launch() -> None:
    space = DescriptorSpace.of(DescriptorKind.FUSION)
    cand = f.candidate()
    values = space.measure(cand, f.correct(cand, 0.2, launches=2), task_ops=6)
    assert values["fusion"] == 3.0


def test_archive_survives_a_json_round_trip_and_keeps_deciding_the_same() -> None:
    archive = Archive(SPACE, island="i0", task_ops=2)
    cands = [f.candidate(params={"BLOCK_SIZE": b, "num_warps": w}) for b in (64, 1024, 8192) for w in (1, 8)]
    for k, c in enumerate(cands):
        archive.add(c, f.correct(c, 0.1 + 0.05 * k))
    restored = Archive.from_json(archive.to_json())
    assert [e.model_dump() for e in restored.elites()] == [e.model_dump() for e in archive.elites()]
    assert restored.offered == archive.offered
    assert restored.task_ops == 2
    probe = f.candidate(params={"BLOCK_SIZE": 1024, "num_warps": 8})
    result = f.correct(probe, 0.12)
    assert restored.add(probe, result) is archive.add(probe, result) is AddStatus.IMPROVED


def test_migrant_elite_is_rehomed_with_its_lineage_and_measured_result() -> None:
    source = Archive(SPACE, island="i0")
    parent = f.candidate()
    child = f.candidate(parent=parent, params={"BLOCK_SIZE": 2048, "num_warps": 8})
    source.add(child, f.correct(child, 0.2))
    elite = source.elites()[0]
    dest = Archive(SPACE, island="i1")
    assert dest.add_elite(elite) is AddStatus.NEW_CELL
    moved = dest.elites()[0]
    assert moved.island == "i1"
    assert moved.candidate.lineage == (parent.candidate_id,)
    assert moved.result is not None
    assert moved.result.status is EvalStatus.CORRECT
    assert dest.add_elite(elite) is AddStatus.NOT_IMPROVED  # the same candidate twice


def test_heatmap_grid_shows_the_best_per_projected_cell() -> None:
    archive = Archive(SPACE, island="i0")
    for warps, ms in ((1, 0.4), (8, 0.2)):  # same launches and tile, different warps
        c = f.candidate(params={"BLOCK_SIZE": 1024, "num_warps": warps})
        archive.add(c, f.correct(c, ms))
    grid = archive.grid()
    filled = [(r, c, v) for r, row in enumerate(grid) for c, v in enumerate(row) if v is not None]
    assert len(filled) == 1  # both project onto one (launches, tile) cell
    assert filled[0][2] == max(e.fitness for e in archive.elites())
    assert 0 < archive.coverage() < 1
