"""Actors of Kernel Foundry, by role: ``runtime/`` (the bus, the ``Actor`` base, KV, the embedded
server, process plumbing, options, logs, metrics), ``kinds/`` (one module per actor kind and its
registry), ``commands/`` (``kfoundry run``, ``actor`` and the others, the controller and the
launcher; ``cli.py`` here is the public entry point). Beside them what single kinds use:
``experts/``, ``llm/``, ``diagnosis/``, ``evolution/``, ``report/`` and ``kbench/``."""
