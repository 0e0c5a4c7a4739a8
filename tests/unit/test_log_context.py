"""Per-message log context: ``actors.runtime.logs.bound`` binds ids for a block and restores what was there."""

from __future__ import annotations

import asyncio

import pytest
import structlog
from structlog.testing import capture_logs

from actors.runtime.logs import bound

pytestmark = pytest.mark.timeout(10)


def _context() -> dict[str, object]:
    return structlog.contextvars.get_contextvars()


def test_bound_context_is_on_each_line_of_its_block_and_gone_after() -> None:
    structlog.contextvars.clear_contextvars()
    log = structlog.get_logger("test")
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as lines:
        with bound(island="i0", candidate="c1"):
            log.warning("inside")
        log.warning("after")
    assert (lines[0]["island"], lines[0]["candidate"]) == ("i0", "c1")
    assert "island" not in lines[1]
    assert "candidate" not in lines[1]


def test_bound_restores_the_outer_value_of_a_key_it_rebinds() -> None:
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(actor="a1", island="outer")
    try:
        with bound(island="inner", candidate="c2"):
            assert _context() == {"actor": "a1", "island": "inner", "candidate": "c2"}
        assert _context() == {"actor": "a1", "island": "outer"}
    finally:
        structlog.contextvars.clear_contextvars()


def test_bound_restores_the_context_when_the_block_raises() -> None:
    structlog.contextvars.clear_contextvars()
    with pytest.raises(RuntimeError), bound(candidate="c3"):
        raise RuntimeError("handler failed")
    assert _context() == {}


async def test_concurrent_handlers_do_not_see_each_others_ids() -> None:
    seen: dict[str, object] = {}
    both_inside = asyncio.Barrier(2)

    async def handle(candidate: str) -> None:
        with bound(candidate=candidate):
            await both_inside.wait()
            seen[candidate] = _context().get("candidate")

    await asyncio.gather(handle("c4"), handle("c5"))
    assert seen == {"c4": "c4", "c5": "c5"}
