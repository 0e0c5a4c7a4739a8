"""The base of every wire message: frozen, strict, versioned, self-describing.

Every message that crosses a NATS subject derives from :class:`Message`. Each concrete class
sets a ``type`` literal (its wire name) so a tap or a dead-letter reader can decode any payload
without knowing the subject, and carries ``schema_version`` so readers can refuse what they do
not understand.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict

SCHEMA_VERSION = 2
"""The version of the wire contract. Raised on any incompatible change to a message.

- 2: diagnosers send ``Feedback`` without its candidate (the island has it); islands write their
  experience records and outcomes as ``ExperienceBatch`` on ``kf.exp.batch``. Version 1 messages
  (a stream written by an older version) are still read."""
READABLE_VERSIONS = (1, 2)
"""The versions this code reads: its own and the older ones whose messages it still understands."""

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _check_token(value: str) -> str:
    if not _TOKEN.match(value):
        raise ValueError(
            f"{value!r} is not a valid id: use 1-64 letters, digits, '-' or '_' "
            "(it becomes part of NATS subjects and stream names)"
        )
    return value


Token = Annotated[str, AfterValidator(_check_token)]
"""An identifier that is safe inside a NATS subject token and a stream name."""


def new_id() -> str:
    """A fresh random identifier (32 hex characters)."""
    return uuid.uuid4().hex


def now() -> float:
    """Wall-clock time in seconds since the epoch, as every ``*_at`` field holds it."""
    return time.time()


class Model(BaseModel):
    """A frozen, strict value object used inside messages."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
        ser_json_inf_nan="strings",
    )


class Message(Model):
    """A message that travels on its own over NATS."""

    schema_version: Literal[1, 2] = 2
    """Version of the wire contract this message was written against (see ``SCHEMA_VERSION``;
    ``READABLE_VERSIONS`` are read)."""

    def to_bytes(self) -> bytes:
        """The JSON encoding sent on the wire."""
        return self.model_dump_json().encode()
