"""Every NATS subject, stream, consumer and bucket name, built in one place.

Actors never write subject literals; they call these functions. Runs are namespaced
(``kf.<run>.…``) so many runs share one server or cluster.

| subject                          | message              | transport                                |
|----------------------------------|----------------------|------------------------------------------|
| ``kf.<run>.cand.<island>.<cand>``| Candidate            | run stream; evaluators' durable consumer |
| ``kf.<run>.result.<island>``     | EvalResult           | run stream; diagnosers' durable consumer |
| ``kf.<run>.feedback.<island>``   | Feedback             | run stream; one durable per island       |
| ``kf.<run>.elite.<island>``      | EliteAnnouncement    | run stream; migrator's durable consumer  |
| ``kf.<run>.migrant.<island>``    | Migration            | run stream; one durable per island       |
| ``kf.<run>.status.<island>``     | IslandStatus         | run stream                               |
| ``kf.<run>.end``                 | RunEnd               | run stream                               |
| ``kf.<run>.stop``                | RunStop              | run stream; read by the run's controller |
| ``kf.<run>.outcome``             | ExperienceOutcome    | run stream                               |
| ``kf.expert.<name>.generate``    | GenerateRequest→Reply| nats.micro endpoint, queue group         |
| ``kf.exp.query``                 | ExperienceQuery→Hits | nats.micro endpoint                      |
| ``kf.exp.record``                | Experience           | experience stream (source of truth)      |
| ``kf.exp.outcome``               | ExperienceOutcome    | experience stream                        |
| ``kf.exp.batch``                 | ExperienceBatch      | experience stream (what islands write)   |
| ``kf.ctl.<actor-id>``            | Control→ActorInfo    | nats.micro endpoint                      |
| ``kf.dlq.<run>``                 | DeadLetter           | dead-letter stream                       |
"""

from __future__ import annotations

from schemas.base import _check_token

PREFIX = "kf"
ANY = "*"


def _tok(value: str) -> str:
    return value if value in (ANY, ">") else _check_token(value)


def candidates(run: str, island: str = ANY, candidate: str = ANY) -> str:
    """Candidates published by an island for evaluation, one subject per candidate so that any
    actor can fetch a candidate by id (a direct get of the last message on its subject)."""
    return f"{PREFIX}.{_tok(run)}.cand.{_tok(island)}.{_tok(candidate)}"


def results(run: str, island: str = ANY) -> str:
    """Evaluation results."""
    return f"{PREFIX}.{_tok(run)}.result.{_tok(island)}"


def feedback(run: str, island: str = ANY) -> str:
    """Diagnosed feedback addressed to an island."""
    return f"{PREFIX}.{_tok(run)}.feedback.{_tok(island)}"


def elites(run: str, island: str = ANY) -> str:
    """Announcements of new elites."""
    return f"{PREFIX}.{_tok(run)}.elite.{_tok(island)}"


def migrants(run: str, island: str = ANY) -> str:
    """Migrations addressed to an island."""
    return f"{PREFIX}.{_tok(run)}.migrant.{_tok(island)}"


def island_status(run: str, island: str = ANY) -> str:
    """Island progress reports."""
    return f"{PREFIX}.{_tok(run)}.status.{_tok(island)}"


def run_end(run: str) -> str:
    """The end of a run."""
    return f"{PREFIX}.{_tok(run)}.end"


def run_stop(run: str) -> str:
    """An operator's request that the run stop (``kfoundry runs stop``)."""
    return f"{PREFIX}.{_tok(run)}.stop"


def run_all(run: str) -> str:
    """Every subject of one run (the run stream's filter, and a tap's default)."""
    return f"{PREFIX}.{_tok(run)}.>"


def expert_generate(name: str) -> str:
    """Generate endpoint of an expert service."""
    return f"{PREFIX}.expert.{_tok(name)}.generate"


EXPERIENCE_QUERY = f"{PREFIX}.exp.query"
"""Experience retrieval endpoint of the curator."""
EXPERIENCE_RECORD = f"{PREFIX}.exp.record"
"""Experience records (source of truth of the library)."""
EXPERIENCE_OUTCOME = f"{PREFIX}.exp.outcome"
"""Utility updates of experiences."""
EXPERIENCE_BATCH = f"{PREFIX}.exp.batch"
"""Records and outcomes written together (``ExperienceBatch``), as islands write them."""


def control(actor_id: str) -> str:
    """Control endpoint of one actor."""
    return f"{PREFIX}.ctl.{_tok(actor_id)}"


def dead_letters(run: str = ANY) -> str:
    """Dead letters of a run (``_`` for actors outside any run)."""
    return f"{PREFIX}.dlq.{_tok(run)}"


NO_RUN = "_"
"""The run token used by actors that serve no particular run (experts, curator)."""

LOG_PREFIX = "kflog"
"""Log lines live under their own root, outside every run's ``kf.<run>.>`` subjects."""


def logs(run: str = ANY, actor: str = ANY) -> str:
    """One process's log lines: the run it serves (``_`` for none) and its actor id."""
    return f"{LOG_PREFIX}.{_tok(run)}.{_tok(actor)}"


# Streams, consumers and buckets.


def run_stream(run: str) -> str:
    """The JetStream stream holding every message of one run (its event log)."""
    return f"KF_RUN_{_check_token(run)}"


EXPERIENCE_STREAM = "KF_EXPERIENCE"
"""Experience records and outcomes, shared by all runs."""
LOG_STREAM = "KF_LOGS"
"""Every actor process's log lines (``logs``), kept a week (``kfoundry logs RUN`` reads them)."""

DLQ_STREAM = "KF_DLQ"
"""Dead letters of all runs."""
ADVISORY_STREAM = "KF_ADVISORIES"
"""Max-delivery advisories of the server, kept so that none is lost."""
MAX_DELIVERIES_ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>"
"""Subject of the server's max-delivery advisories."""

EVALUATORS = "evaluators"
"""Durable consumer shared by every evaluator of a run."""
DIAGNOSERS = "diagnosers"
"""Durable consumer shared by every diagnoser of a run."""
MIGRATORS = "migrators"
"""Durable consumer of elite announcements shared by the migrators of a run."""


def island_feedback_consumer(island: str) -> str:
    """Durable consumer of one island's feedback."""
    return f"feedback-{_check_token(island)}"


def island_migrant_consumer(island: str) -> str:
    """Durable consumer of one island's migrants."""
    return f"migrant-{_check_token(island)}"


RUNS_BUCKET = "kf_runs"
"""KV bucket: run id → RunSpec."""
EXPERTS_BUCKET = "kf_experts"
"""KV bucket: expert name → ExpertConfig."""
ARCHIVE_BUCKET = "kf_archives"
"""KV bucket: ``<run>.<island>`` → island state, so an island restart keeps its archive."""
PROMPTS_BUCKET = "kf_prompts"
"""KV bucket: ``<run>.<role>`` → the evolved meta-prompt sections of LLM experts."""


def archive_key(run: str, island: str) -> str:
    """Key of an island's saved state in the archive bucket."""
    return f"{_check_token(run)}.{_check_token(island)}"
