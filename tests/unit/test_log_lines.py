"""Every line a process logs is one JSON object: structlog's own, and the records of other
libraries through the standard library (faiss's loader, sentence-transformers, asyncio's "Task
exception was never retrieved"), with the bound context and any traceback inside the object."""

from __future__ import annotations

import io
import json
import logging

from actors.runtime.logs import bound, configure_logging, get_logger


def test_structlog_and_foreign_records_are_one_json_object_each() -> None:
    out = io.StringIO()
    configure_logging(stream=out)
    try:
        with bound(run="r1", actor="a1"):
            get_logger("kf.test").info("ours", n=3)
            logging.getLogger("faiss.loader").info("Loading faiss with %s support.", "AVX2")
            try:
                raise ZeroDivisionError("division by zero")
            except ZeroDivisionError:
                logging.getLogger("asyncio").exception("Task exception was never retrieved")
        get_logger("kf.test").debug("below the level")
    finally:
        configure_logging(stream=io.StringIO())  # nothing later writes into this test's buffer
    lines = out.getvalue().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["event"] for r in records] == [
        "ours",
        "Loading faiss with AVX2 support.",
        "Task exception was never retrieved",
    ]
    assert all(r["run"] == "r1" and r["actor"] == "a1" and "timestamp" in r for r in records)
    assert records[0]["n"] == 3
    assert records[1]["logger"] == "faiss.loader"
    assert records[1]["level"] == "info"
    assert records[2]["level"] == "error"
    assert "ZeroDivisionError: division by zero" in records[2]["exception"]
