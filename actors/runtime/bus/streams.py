"""Streams: the JetStream streams a bus creates (the run's event log, the shared streams) and how
many replicas they get."""

from __future__ import annotations

import os

import nats
import nats.errors
import nats.js.errors
from nats.js.api import (
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from actors.runtime.bus.calls import settled
from actors.runtime.bus.core import BusCore
from actors.runtime.errors import ConfigError
from schemas import subjects


class Streams(BusCore):
    """The streams a bus creates, each created once and left as it is when it exists."""

    def replicas(self) -> int:
        """Replicas for the streams and buckets this bus creates: 3 when the server is one of a
        cluster of three or more (the cluster survives the loss of any one server), else 1;
        ``KF_STREAM_REPLICAS`` overrides."""
        forced = os.environ.get("KF_STREAM_REPLICAS")
        if forced:
            try:
                value = int(forced)
            except ValueError as exc:
                raise ConfigError(f"KF_STREAM_REPLICAS must be 1 to 5, got {forced!r}") from exc
            if not 1 <= value <= 5:
                raise ConfigError(f"KF_STREAM_REPLICAS must be 1 to 5, got {forced!r}")
            return value
        info = getattr(self.nc, "_server_info", None) or {}
        peers = info.get("connect_urls") or []
        return 3 if info.get("cluster") and len(peers) >= 3 else 1

    async def ensure_stream(self, config: StreamConfig) -> None:
        """Create a stream, or leave an existing one of that name as it is (asked again while the
        server cannot answer)."""
        await settled(f"creating stream {config.name}", lambda: self._ensure_stream(config))

    async def _ensure_stream(self, config: StreamConfig) -> None:
        try:
            await self.js.add_stream(config)
        except nats.js.errors.BadRequestError as exc:
            if "already in use" not in str(exc):
                raise
            await self.js.update_stream(config)

    async def ensure_run_stream(self, run_id: str, *, max_age_s: float = 7 * 24 * 3600) -> None:
        """The run's event log: every ``kf.<run>.>`` subject, kept for ``max_age_s``, with direct
        gets (a message by subject without the JSON and base64 of the stream API)."""
        await self.ensure_stream(
            StreamConfig(
                name=subjects.run_stream(run_id),
                subjects=[subjects.run_all(run_id)],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                max_age=max_age_s,
                duplicate_window=15 * 60,
                num_replicas=self.replicas(),
                allow_direct=True,  # diagnosers read each candidate by subject (a direct get)
            )
        )

    async def ensure_log_stream(self) -> None:
        """The actors' log lines (``kflog.<run>.<actor>``): a week of them, 1 GiB at most (the
        oldest go first; ``KF_LOG_STREAM_BYTES`` sets another bound)."""
        raw = os.environ.get("KF_LOG_STREAM_BYTES", str(1 << 30))
        try:
            max_bytes = int(raw)
        except ValueError as exc:
            raise ConfigError(f"KF_LOG_STREAM_BYTES must be a number of bytes, got {raw!r}") from exc
        await self.ensure_stream(
            StreamConfig(
                name=subjects.LOG_STREAM,
                subjects=[f"{subjects.LOG_PREFIX}.>"],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                max_age=7 * 24 * 3600,
                max_bytes=max_bytes,
                discard=DiscardPolicy.OLD,
                num_replicas=self.replicas(),
            )
        )

    async def ensure_shared_streams(self) -> None:
        """Experience (source of truth), dead letters and max-delivery advisories."""
        await self.ensure_stream(
            StreamConfig(
                name=subjects.EXPERIENCE_STREAM,
                subjects=[subjects.EXPERIENCE_RECORD, subjects.EXPERIENCE_OUTCOME, subjects.EXPERIENCE_BATCH],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                duplicate_window=15 * 60,
                num_replicas=self.replicas(),
            )
        )
        await self.ensure_stream(
            StreamConfig(
                name=subjects.DLQ_STREAM,
                subjects=[subjects.dead_letters(">")],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                max_age=30 * 24 * 3600,
                num_replicas=self.replicas(),
            )
        )
        await self.ensure_stream(
            StreamConfig(
                name=subjects.ADVISORY_STREAM,
                subjects=[subjects.MAX_DELIVERIES_ADVISORY],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                max_age=30 * 24 * 3600,
                num_replicas=self.replicas(),
            )
        )
