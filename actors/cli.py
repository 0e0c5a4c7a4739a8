"""``kfoundry``'s entry point at its public path: ``python -m actors.cli`` and the ``kfoundry``
script (``actors.cli:main``) both land here. The commands themselves live in ``actors.commands``
(the parser and the dispatch in :mod:`actors.commands.cli`)."""

from __future__ import annotations

from actors.commands.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
