"""The hot path's raw SQL, written once as named statements: what every pass reads and
what every dispatch locks. Everything else in the store uses the ORM."""

import dataclasses

from access.models import ApiKey, Team
from backends.models import Deployment, Health, Model, Server

from .. import sql
from ..models import WAITING_STATES, Request, State
from ..snapshot import DeploymentView

SERVERS = Server._meta.db_table
DEPLOYMENTS = Deployment._meta.db_table
MODELS = Model._meta.db_table
REQUESTS = Request._meta.db_table
KEYS = ApiKey._meta.db_table
TEAMS = Team._meta.db_table


SERVER_VIEW_SQL = sql.prepared(
    "SELECT id, name, slots, max_llm, max_embedding, max_reranking, max_models, memory_mb,"
    f" enabled, health, cooldown_until, unavailable_since, kind FROM {SERVERS} ORDER BY name"
)
# Every DeploymentView field is the deployment's column of that name, but for its model's.
DEPLOYMENT_VIEW_SQL = sql.prepared(
    "SELECT d.model_id, "
    + ", ".join(
        {"model": "m.name", "model_type": "m.type"}.get(f.name, f"d.{f.name}")
        for f in dataclasses.fields(DeploymentView)
    )
    + f" FROM {DEPLOYMENTS} d JOIN {MODELS} m ON m.id = d.model_id"
    f" JOIN {SERVERS} s ON s.id = d.server_id ORDER BY s.name, m.name"
)
# In key order: with sequential scans off (IN_INDEX_ORDER), a read with no order to give
# an index is planned as a disabled scan, at a cost that has PostgreSQL compile it (JIT,
# 14 ms a read).
MODEL_NAMES_SQL = sql.prepared(f"SELECT id, name FROM {MODELS} ORDER BY id")
# A RequestView's columns but its model's name (the models are read apart: one table to
# plan on every pass, not a join); timestamps as text, which `datetime.fromisoformat`
# parses many times faster than the driver's loader (most of a deep snapshot's cost).
REQUEST_VIEW_SQL = (
    "SELECT r.id, r.model_id, r.priority, r.state, CAST(r.created_at AS TEXT),"
    f" CAST(r.expires_at AS TEXT), r.deployment_id, CAST(r.not_before AS TEXT), r.api_key_id,"
    " r.no_server_grace_s, r.cache_server_id"
    f" FROM {REQUESTS} r"
)
# The API keys and their teams, for fair share and quotas (small tables), and how many
# requests each key has processing (by the index `processing_by_key`: no more entries than
# busy slots; the state written out, so that PostgreSQL can prove the partial index's
# condition).
KEY_VIEW_SQL = sql.prepared(
    "SELECT k.id, k.weight, k.max_processing, k.team_id, t.weight, t.max_processing"
    f" FROM {KEYS} k LEFT JOIN {TEAMS} t ON t.id = k.team_id ORDER BY k.id"
)
PROCESSING_BY_KEY_SQL = (
    f"SELECT r.api_key_id, COUNT(*) FROM {REQUESTS} r"
    f" WHERE r.state = '{State.PROCESSING.value}' GROUP BY r.api_key_id ORDER BY r.api_key_id"
)
WAITING_SQL = f"r.state IN ({sql.marks(len(WAITING_STATES))})"
RANK_SQL = "r.priority, r.created_at, r.id"  # best first, as the policy ranks before aging
AGE_SQL = "r.created_at, r.id"  # oldest first
# The heads are read by walking a partial index of waiting requests in order, stopping at
# the limit. A bitmap or sequential scan would visit every entry the index still holds, and
# the entries of requests that moved on stay until a vacuum removes them: with autovacuum
# off or behind (or no statistics yet, which is when PostgreSQL picks a bitmap scan here),
# every pass read every request that ever waited: 8,500 entries, 2.9 ms, after 8,500.
# An index scan also marks the dead entries it passes, so the next pass skips them.
IN_INDEX_ORDER = [("SET LOCAL enable_bitmapscan = off", []), ("SET LOCAL enable_seqscan = off", [])]
# The head of the line. Not prepared: a cached plan made while the waiting index was
# bloated and the line short sorts the line through the index of states (seen: a Sort over
# `request_state`), and would go on sorting it, grown to 100,000, until the next ANALYZE.
HEAD_SQL = f"{REQUEST_VIEW_SQL} WHERE {WAITING_SQL} ORDER BY {RANK_SQL} LIMIT %s"


def servers_of(deployment_ids: list[int]) -> str:
    return f"SELECT server_id FROM {DEPLOYMENTS} WHERE id IN ({sql.marks(len(deployment_ids))})"


def lock_servers(deployment_ids: list[int]) -> sql.Statement:
    """Lock the servers of these deployments (in id order, so that workers never deadlock);
    their slots, none for a server taken out of service since it was planned for (disabled,
    down, in cooldown): a plan may be as old as the inference whose end it waited for."""
    return (
        sql.prepared(
            f"SELECT id, CASE WHEN enabled AND health NOT IN"
            f" ('{Health.DOWN.value}', '{Health.COOLDOWN.value}') THEN slots ELSE 0 END"
            f" FROM {SERVERS} WHERE id IN ({servers_of(deployment_ids)})"
            f" ORDER BY id{sql.for_update()}"
        ),
        deployment_ids,
    )


def servers_deployments(deployment_ids: list[int]) -> sql.Statement:
    """Then every deployment of those servers, locked too (one found loaded stays loaded
    until commit), with its requests in flight. Run after the servers' lock is held (the
    next statement of the same query), so that a dispatch that held it is counted."""
    return (
        sql.prepared(
            f"SELECT d.id, d.model_id, d.server_id, s.name, d.server_model_id, m.load_options,"
            f" d.load_options, d.load_overrides, d.state, d.in_flight, d.slots"
            f" FROM {DEPLOYMENTS} d JOIN {SERVERS} s ON s.id = d.server_id"
            f" JOIN {MODELS} m ON m.id = d.model_id WHERE d.server_id IN"
            f" ({servers_of(deployment_ids)}) ORDER BY d.id{sql.for_update('d')}"
        ),
        deployment_ids,
    )


def lock_deployments(deployment_ids: list[int]) -> sql.Statement:
    """Lock these deployments (in id order): a writer that frees a slot and ends a request
    locks the slot's deployment first, as a dispatch does (docs/architecture.md)."""
    order = " ORDER BY id" if len(deployment_ids) > 1 else ""
    return (
        sql.prepared(
            f"SELECT id FROM {DEPLOYMENTS} WHERE id IN ({sql.marks(len(deployment_ids))})"
            f"{order}{sql.for_update()}"
        ),
        deployment_ids,
    )
