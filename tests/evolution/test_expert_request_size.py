"""What an island sends an expert: experts that read only an experience's outcome and parameters
(the template expert) get the retrieved experiences without their kernel sources."""

from __future__ import annotations

from actors.kinds.island_requests import params_only
from schemas import ExperienceHit
from tests.experience.helpers import record

SOURCE = "import triton\n" + "# a kernel\n" * 300


def test_experiences_for_parameter_readers_drop_only_their_sources() -> None:
    with_source = record().model_copy(update={"source_excerpt": SOURCE, "params": {"pw_warps": 8, "pw_ept": 4}})
    without = record("a record with no source")
    hits = (
        ExperienceHit(experience=with_source, score=0.9, utility=0.7),
        ExperienceHit(experience=without, score=0.5, utility=0.5),
    )
    stripped = params_only(hits)
    assert [h.experience.source_excerpt for h in stripped] == ["", ""]
    assert stripped[0].experience == with_source.model_copy(update={"source_excerpt": ""})
    assert (stripped[0].score, stripped[0].utility) == (0.9, 0.7)
    assert stripped[1] is hits[1]  # nothing to drop: the same hit
    assert len(stripped[0].model_dump_json()) < len(hits[0].model_dump_json()) - len(SOURCE) // 2
