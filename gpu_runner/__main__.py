"""``python -m gpu_runner REFERENCE.py CANDIDATE.py [--device cpu|cuda|auto] [--timeout S] [--json]``."""

from __future__ import annotations

from gpu_runner.cli import main

raise SystemExit(main())
