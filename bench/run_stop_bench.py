"""Where the seconds after a run's deadline go: a ``kfoundry run`` on the quickstart task with
no-op evaluators and a wall-clock budget, timed from its deadline to the process's exit.

Prints, relative to the deadline (the run's ``started_at`` plus ``--seconds``): when the run
noticed it, when each kind of actor began draining and had stopped (the slowest of its kind),
when the results were written, and when the process exited. Read from the run's ``run.log``
(JSON lines with timestamps) and ``report.json``.

Run: ``python -m bench.run_stop_bench [--seconds 12] [--islands 2]``. The machine is shared:
run it twice.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

TASK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"
MILESTONES = {
    "run ending": "the run noticed its end",
    "run ended, writing results": "writing results",
    "results written": "results written",
}


def _at(line: dict[str, object]) -> float:
    return datetime.fromisoformat(str(line["timestamp"]).replace("Z", "+00:00")).timestamp()


def timeline(run_dir: Path, seconds: float, exited_at: float) -> list[tuple[float, str]]:
    """(seconds after the deadline, what happened), in time order."""
    report = json.loads((run_dir / "report.json").read_text())
    deadline = float(report["started_at"]) + seconds
    draining: dict[str, float] = {}
    stopped: dict[str, float] = {}
    rows: list[tuple[float, str]] = []
    for text in (run_dir / "run.log").read_text().splitlines():
        if not text.startswith("{"):
            continue
        line = json.loads(text)
        event = str(line.get("event", ""))
        kind = str(line.get("actor") or "").split("-")[0]
        at = _at(line) - deadline
        if event in MILESTONES:
            rows.append((at, MILESTONES[event]))
        elif event.startswith("actor draining") and at > -1.0:
            draining[kind] = min(draining.get(kind, at), at)
        elif event == "actor stopped" and at > -1.0:
            stopped[kind] = max(stopped.get(kind, at), at)
    rows += [(at, f"{kind} began draining") for kind, at in draining.items()]
    rows += [(at, f"{kind} stopped (slowest of its kind)") for kind, at in stopped.items()]
    rows.append((exited_at - deadline, f"process exited ({report['evaluated']} evaluated)"))
    return sorted(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=12.0, help="the run's wall-clock budget")
    parser.add_argument("--islands", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        env = {**os.environ, "KFOUNDRY_HOME": str(Path(tmp) / "home")}
        command = [
            sys.executable, "-m", "actors.cli", "run", str(TASK),
            "--seconds", f"{args.seconds:g}", "--candidates", "1000000", "--islands", str(args.islands),
            "--runner", "noop", "--run-dir", str(run_dir), "--quiet",
        ]  # fmt: skip
        subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        exited_at = time.time()
        rows = timeline(run_dir, args.seconds, exited_at)
    out = sys.stdout
    out.write(f"\n{'after the deadline (s)':>24}  event\n")
    for at, what in rows:
        out.write(f"{at:>+24.2f}  {what}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
