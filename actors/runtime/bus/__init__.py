"""The bus: one thin, typed layer over nats-py.

Everything an actor sends or receives goes through here:

- ``publish`` (core) and ``publish_durable`` (JetStream, with a ``Nats-Msg-Id`` dedup id);
- ``request`` (typed request/reply; micro error replies become ``RemoteError``);
- ``subscribe`` (core, bounded concurrent handlers);
- ``consume`` (a JetStream durable pull consumer: explicit ack, ``in_progress`` heartbeats while a
  handler runs, nak with backoff, dead letter at the last delivery, ``Retry``/``Drop``/``Poison``);
- ``serve`` (a typed ``nats.micro`` endpoint with bounded concurrent handlers).

Every payload is validated against its pydantic type. A malformed one never reaches a handler:
it is counted, logged and published to the dead-letter subject ``kf.dlq.<run>`` with the
validation error, and the actor keeps serving.

Shutdown (``close``) loses nothing: stop fetching, let in-hand work ack or nak, unsubscribe pull
subscriptions, drain core and endpoint subscriptions while their handlers finish, drain the
connection.

The bus is split by concern, one module each: :mod:`.calls` (one NATS call, transient failures
asked again), :mod:`.delivery` (deliveries, handler types, consumer specs, bounded workers),
:mod:`.core` (shared state and switches), :mod:`.sending`, :mod:`.receiving`, :mod:`.services`,
:mod:`.streams`, and :mod:`.connection` (``Bus``: connect and close).
"""

from actors.runtime.bus.calls import (
    DESCRIPTION_HEADER,
    MSG_ID_HEADER,
    STATUS_HEADER,
    ConnectionDropped,
    server_has_all,
    settled,
    transient,
)
from actors.runtime.bus.connection import Bus
from actors.runtime.bus.delivery import ConsumerSpec, Delivery, Handler, PullConsumer, ReplyHandler
from actors.runtime.bus.sending import MAX_DROPS, NO_RESPONDERS_RETRY_S, RECONNECT_WAIT_S

__all__ = [
    "DESCRIPTION_HEADER",
    "MAX_DROPS",
    "MSG_ID_HEADER",
    "NO_RESPONDERS_RETRY_S",
    "RECONNECT_WAIT_S",
    "STATUS_HEADER",
    "Bus",
    "ConnectionDropped",
    "ConsumerSpec",
    "Delivery",
    "Handler",
    "PullConsumer",
    "ReplyHandler",
    "server_has_all",
    "settled",
    "transient",
]
