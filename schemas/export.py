"""Export the JSON Schema of every wire message into ``schemas/json/``.

Run ``python -m schemas.export`` after changing a message; a test fails while the exported
files are stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from schemas import MESSAGE_TYPES

JSON_DIR = Path(__file__).with_name("json")


def rendered() -> dict[str, str]:
    """File name → JSON Schema text, for every message type."""
    out: dict[str, str] = {}
    for name, cls in sorted(MESSAGE_TYPES.items()):
        schema = cls.model_json_schema(mode="validation")
        out[f"{name}.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def stale(directory: Path = JSON_DIR) -> list[str]:
    """Names of exported files that are missing, different, or no longer a message."""
    want = rendered()
    have = {p.name for p in directory.glob("*.json")} if directory.is_dir() else set()
    bad = [n for n, text in want.items() if not (directory / n).is_file() or (directory / n).read_text() != text]
    bad += sorted(have - set(want))
    return sorted(bad)


def export(directory: Path = JSON_DIR) -> list[str]:
    """Write every schema; remove files of messages that no longer exist. Returns names written."""
    directory.mkdir(parents=True, exist_ok=True)
    want = rendered()
    for name, text in want.items():
        (directory / name).write_text(text)
    for path in directory.glob("*.json"):
        if path.name not in want:
            path.unlink()
    return sorted(want)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--check"]:
        bad = stale()
        if bad:
            sys.stderr.write(f"stale JSON schemas: {', '.join(bad)}; run `python -m schemas.export`\n")
            return 1
        return 0
    names = export()
    sys.stdout.write(f"wrote {len(names)} schemas to {JSON_DIR}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
