"""Key-value buckets of the fabric: run specs, expert configs, island states, evolved prompts."""

from __future__ import annotations

import asyncio
import contextlib
import time

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from actors.runtime.bus import Bus, settled, transient
from actors.runtime.errors import ConfigError
from actors.runtime.logs import get_logger
from schemas import ExpertConfig, RunSpec, subjects

log = get_logger(__name__)


async def bucket(bus: Bus, name: str, *, history: int = 8) -> KeyValue:
    """Open a bucket, creating it on first use (asked again while the server cannot answer)."""
    return await settled(f"opening bucket {name}", lambda: _bucket(bus, name, history))


async def _bucket(bus: Bus, name: str, history: int) -> KeyValue:
    try:
        return await bus.js.key_value(name)
    except nats.js.errors.BucketNotFoundError:
        try:
            return await bus.js.create_key_value(bucket=name, history=history, replicas=bus.replicas())
        except nats.js.errors.BadRequestError as exc:
            if transient(exc):
                raise  # not placed yet: asked again by ``settled``
            return await bus.js.key_value(name)  # created by someone else in the meantime


async def _get(kv: KeyValue, bucket_name: str, key: str) -> KeyValue.Entry | None:
    """``key``'s entry, ``None`` if absent; asked again while the server cannot answer."""
    try:
        return await settled(f"reading {key!r} from bucket {bucket_name}", lambda: kv.get(key))
    except nats.js.errors.KeyNotFoundError:
        return None


async def put_run(bus: Bus, spec: RunSpec) -> None:
    """Register a run (its spec) under its id, over any entry it has: for tests and tools that set a
    run up by hand. ``kfoundry run`` registers with :func:`create_run`, which never overwrites."""
    kv = await bucket(bus, subjects.RUNS_BUCKET)
    # A bucket just made on a fresh cluster may have no stream leader yet ("no response from
    # stream"); writing the same spec again is harmless.
    await settled(f"registering run {spec.run_id}", lambda: kv.put(spec.run_id, spec.to_bytes()))


async def create_run(bus: Bus, spec: RunSpec) -> bool:
    """Register a new run under its id only if the id is free: a compare-and-set, so of two runs
    started at once with one id exactly one registers. Returns whether this spec is registered
    (``False``: another run holds the id, and its entry is left as it was)."""
    kv = await bucket(bus, subjects.RUNS_BUCKET)
    value = spec.to_bytes()

    async def create() -> bool:
        try:
            await kv.create(spec.run_id, value)
        except nats.js.errors.KeyWrongLastSequenceError:
            # Taken, or taken by this very spec in an attempt whose answer was lost (asked again).
            entry = await _get(kv, subjects.RUNS_BUCKET, spec.run_id)
            return entry is not None and entry.value == value
        return True

    return await settled(f"registering run {spec.run_id}", create)


async def get_run(bus: Bus, run_id: str) -> RunSpec:
    """The spec of a registered run; ``ConfigError`` naming the run if there is none."""
    kv = await bucket(bus, subjects.RUNS_BUCKET)
    entry = await _get(kv, subjects.RUNS_BUCKET, run_id)
    if entry is None:
        raise ConfigError(f"no run {run_id!r} is registered on this NATS server (bucket {subjects.RUNS_BUCKET})")
    if entry.value is None:
        raise ConfigError(f"run {run_id!r} was deleted")
    return RunSpec.model_validate_json(entry.value)


async def wait_for_run(bus: Bus, run_id: str, *, wait_s: float, stop: asyncio.Event | None = None) -> RunSpec:
    """The spec of ``run_id``, waiting up to ``wait_s`` seconds for it to be registered (an actor
    started before ``kfoundry run``). ``ConfigError`` in one line when the wait ends without it;
    ``wait_s`` 0 fails at once. Returns early (``ConfigError``) when ``stop`` is set."""
    kv = await bucket(bus, subjects.RUNS_BUCKET)
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            entry = await kv.get(run_id)
            if entry.value:
                return RunSpec.model_validate_json(entry.value)
        except nats.js.errors.KeyNotFoundError:
            pass
        except (TimeoutError, nats.errors.Error) as exc:
            log.warning("run registry unreadable, retrying", run=run_id, error=f"{type(exc).__name__}: {exc}")
        left = deadline - time.monotonic()
        if left <= 0:
            waited = f" within {wait_s:g} s" if wait_s else ""
            raise ConfigError(
                f"no run {run_id!r} was registered on this NATS server{waited}: start it with `kfoundry run` "
                "(or give --wait-for-run SECONDS)"
            )
        if stop is not None and stop.is_set():
            raise ConfigError(f"stopped while waiting for run {run_id!r} to be registered")
        if not said:
            log.info("waiting for the run to be registered", run=run_id, seconds=wait_s)
            said = True
        # The registry is a KV bucket on the server: poll it (a watch would need the same retries).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(0.5, left)):
                if stop is not None:
                    await stop.wait()
                else:
                    await asyncio.sleep(left)


async def put_expert_config(bus: Bus, config: ExpertConfig) -> int:
    """Store (or change) an expert's configuration; running experts pick it up live."""
    kv = await bucket(bus, subjects.EXPERTS_BUCKET)
    return int(await settled(f"storing expert {config.name}", lambda: kv.put(config.name, config.to_bytes())))


async def get_expert_config(bus: Bus, name: str) -> ExpertConfig | None:
    """An expert's stored configuration, if any."""
    kv = await bucket(bus, subjects.EXPERTS_BUCKET)
    entry = await _get(kv, subjects.EXPERTS_BUCKET, name)
    return ExpertConfig.model_validate_json(entry.value) if entry is not None and entry.value else None


async def delete_expert_config(bus: Bus, name: str) -> bool:
    """Remove an expert's stored configuration, its history too; whether there was one."""
    kv = await bucket(bus, subjects.EXPERTS_BUCKET)
    if await get_expert_config(bus, name) is None:
        return False
    await settled(f"removing expert {name}", lambda: kv.purge(name))
    return True


async def list_expert_configs(bus: Bus) -> list[ExpertConfig]:
    """Every stored expert configuration, by name."""
    kv = await bucket(bus, subjects.EXPERTS_BUCKET)
    try:
        names = await kv.keys()
    except nats.js.errors.NoKeysError:
        return []
    configs = [await get_expert_config(bus, name) for name in sorted(names)]
    return [c for c in configs if c is not None]


async def save_text(bus: Bus, bucket_name: str, key: str, text: str) -> None:
    """Save a state blob (an island's brain, evolved prompts)."""
    kv = await bucket(bus, bucket_name)
    await kv.put(key, text.encode())


async def load_text(bus: Bus, bucket_name: str, key: str) -> str | None:
    """A saved state blob, if any."""
    kv = await bucket(bus, bucket_name)
    entry = await _get(kv, bucket_name, key)
    return entry.value.decode() if entry is not None and entry.value else None
