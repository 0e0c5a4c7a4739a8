"""Errors of the actor runtime.

``Retry``, ``Drop`` and ``Poison`` are control flow for handlers of JetStream work: the base
actor maps them to a nak with delay, a term (acknowledged, discarded on purpose), and a
dead letter. Any other exception from a handler counts as a failure: the message is nak'ed with
backoff and, at its last delivery, dead-lettered.
"""

from __future__ import annotations


class KfError(Exception):
    """Root of every error Kernel Foundry raises on purpose."""


class ConfigError(KfError):
    """A configuration value is invalid; the message names it."""


class RunIdTaken(ConfigError):
    """A new run was given the id of a run the NATS server already knows (registered, or with
    messages in its stream): refused, so that nothing of the first run is overwritten."""

    def __init__(self, run_id: str, holder: str) -> None:
        super().__init__(f"run id {run_id} is already used ({holder}); choose another --run-id")
        self.run_id = run_id
        self.holder = holder
        """What holds the id: the other run's state, age and task."""


class TaskRefused(KfError):
    """The task cannot be evaluated on this machine (e.g. one evaluation needs more memory than
    the device or host has); the message says what it needs. ``kfoundry`` exits with status 3."""

    exit_code = 3
    said = False
    """Whether its line was already said (``kfoundry run`` says it when the run stops on it)."""


class TaskInvalid(TaskRefused):
    """The task itself does not work (its ``get_inputs``, constructor or forward fails, or its
    outputs are not tensors): the user's file, not this machine. ``kfoundry`` exits with status 2,
    as for any other bad input."""

    exit_code = 2


class NatsServerError(KfError):
    """The embedded NATS server could not be found or started."""


class BusError(KfError):
    """A bus operation failed (connection lost, request timed out, no responders)."""


class RequestTimeout(BusError):
    """A request got no reply in time."""

    def __init__(self, subject: str, timeout: float) -> None:
        super().__init__(f"no reply on {subject} within {timeout:.1f} s")
        self.subject = subject
        self.timeout = timeout


class NoResponders(BusError):
    """Nobody serves the subject of a request."""

    def __init__(self, subject: str) -> None:
        super().__init__(f"no actor serves {subject}")
        self.subject = subject


class RemoteError(BusError):
    """A micro endpoint answered with an error instead of a reply."""

    def __init__(self, subject: str, code: str, description: str) -> None:
        super().__init__(f"{subject} answered error {code}: {description}")
        self.subject = subject
        self.code = code
        self.description = description


class HandlerSignal(KfError):
    """Base of the control-flow exceptions a handler raises to steer its message."""


class Retry(HandlerSignal):
    """Redeliver the message later (nak with ``delay_s``)."""

    def __init__(self, reason: str, delay_s: float = 1.0) -> None:
        super().__init__(reason)
        self.delay_s = delay_s


class Drop(HandlerSignal):
    """Discard the message on purpose (term); it is counted, not dead-lettered."""


class Poison(HandlerSignal):
    """The message can never be handled: dead-letter it with this reason and term it."""


def refusal_in(exc: BaseException | None) -> TaskRefused | None:
    """The :class:`TaskRefused` inside ``exc`` (however deep in exception groups), if any."""
    if isinstance(exc, TaskRefused):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = refusal_in(inner)
            if found is not None:
                return found
    return None
