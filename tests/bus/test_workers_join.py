"""The pull consumers' handler set drains without blocking the event loop."""

from __future__ import annotations

import asyncio
import threading

from actors.runtime.bus.delivery import Workers


def test_join_returns_when_handlers_finished_but_their_callbacks_have_not_run() -> None:
    """Handlers that finished in the same loop step as ``join`` began: their done-callbacks (which
    remove them from the set) are still queued. A join that re-awaited ``gather`` over done tasks
    never yielded and spun for ever with the loop blocked (a run hung 400 s past its budget). Python
    3.12 made that spin possible (its gather completes at once over done tasks); on 3.11 this passes
    either way."""
    outcome: list[str] = []

    async def main() -> None:
        workers = Workers(4)

        async def handler() -> None:
            return None

        for _ in range(3):
            await workers.spawn(handler())
        await asyncio.sleep(0)  # the handlers run and finish; their callbacks queue behind this step
        assert workers.busy == 3
        assert all(t.done() for t in workers._tasks)
        await workers.join()
        outcome.append(f"joined, {workers.busy} left")

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "join spun with the event loop blocked"
    assert outcome == ["joined, 0 left"]
