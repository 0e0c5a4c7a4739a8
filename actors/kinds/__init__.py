"""The actor kinds: one module each, named for the kind (``island.py``, ``expert.py``,
``evaluator.py``, ``diagnoser.py``, ``migrator.py``, ``curator.py``), with the helpers that serve
one kind beside it and named after it (``island_requests.py``, ``island_experience.py``,
``evaluator_process.py``, ``evaluator_runners.py``). ``registry.py`` is the one place a kind is
registered (``ACTOR_KINDS``): how it is built from ``ActorOptions``.

Kinds stand on ``actors.runtime`` and never import a command (``actors.commands``)."""
