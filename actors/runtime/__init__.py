"""The runtime every actor and command stands on: the bus (``bus/``, one typed layer over nats-py,
split by concern), the ``Actor`` base (``base.py``), key-value buckets (``kv.py``), the embedded
``nats-server`` (``nats_server.py``), process plumbing (``process.py``, ``childenv.py``), typed
options (``options.py``), logs, metrics and latency histograms, statistics, the runtime's errors
(``errors.py``), what several actors read from a run (``candidates.py``, ``quota.py``), watching a
live system (``observe.py``), and the GPUs evaluators use (``gpus.py``, ``gpu_claim.py``,
``gpu_usage.py``).

Nothing here imports an actor kind (``actors.kinds``) or a command (``actors.commands``)."""
