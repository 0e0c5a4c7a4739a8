"""The ``kfoundry`` commands and the run they control: the parser and dispatch (``cli.py``;
``actors/cli.py`` is its public entry point), ``kfoundry run`` (``run.py``) above the run
controller (``controller.py``, with ``progress.py``, ``run_stream.py``, ``signature.py`` and the
run's verdict, ``outcome.py``), ``kfoundry actor`` (``actor.py``) and the launcher both use
(``launch.py``). ``kfoundry bench`` lives in ``actors.kbench``."""
