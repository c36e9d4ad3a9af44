"""Reading the snapshot the policy plans on."""

import functools
from collections import Counter
from collections.abc import Iterable, Iterator

from django.conf import settings

from backends.adapters.registry import stops_loads
from backends.models import ModelType

from .. import sql
from ..load_estimate import model_name, with_expected_loads
from ..models import WAITING_STATES, Request, State
from ..snapshot import (
    DeploymentView,
    KeyView,
    PolicyConfig,
    RequestView,
    ServerView,
    Snapshot,
    TeamView,
)
from .queries import (
    AGE_SQL,
    DEPLOYMENT_VIEW_SQL,
    HEAD_SQL,
    IN_INDEX_ORDER,
    KEY_VIEW_SQL,
    MODEL_NAMES_SQL,
    PROCESSING_BY_KEY_SQL,
    RANK_SQL,
    REQUEST_VIEW_SQL,
    REQUESTS,
    SERVER_VIEW_SQL,
    WAITING_SQL,
)

SNAPSHOT_HEAD = 250  # waiting requests read per ordering; see SnapshotReader
MODEL_HEAD = 50  # and the best of each deployed model's own line
KEY_HEAD = 20  # and of each API key's own line (fair share)
ROWS_PER_READ = 500  # ids in one IN list, within SQLite's limit on parameters


class SnapshotReader:
    """Reads what the policy plans on, pass after pass: every server and deployment, and
    the head of the line. Read as SQL written once, as the ORM would return it (this runs
    on every pass), in one round trip: the servers, the deployments, the best-ranked
    waiting requests and, when the last pass found the line deep, its other heads too."""

    def __init__(self) -> None:
        # The deployed models whose heads the last pass read: the line was deep then.
        self.deep_models: tuple[int, ...] | None = None
        self.deep_keys: tuple[int, ...] = ()  # and the API keys whose heads it read

    def read(self, config: PolicyConfig) -> Snapshot:
        statements = pass_reads()
        if self.deep_models is not None:
            statements.append(_other_heads(self.deep_models, self.deep_keys))
        server_rows, deployment_rows, model_rows, key_rows, processing_rows, head, *other_heads = (
            _read_heads(statements)
        )
        names = dict(model_rows)
        # The best-ranked and the oldest waiting requests: enough to plan every free slot
        # and load, and the oldest are where aging and expiry happen. Deep queues stay cheap.
        requests = {view.id: view for view in _request_views(head, names)}
        if len(requests) < SNAPSHOT_HEAD:  # that was every waiting request
            self.deep_models = None
        else:
            models = tuple(sorted({row[0] for row in deployment_rows}))
            key_ids = tuple(row[0] for row in key_rows)
            if (models, key_ids) != (self.deep_models, self.deep_keys):  # just grown deep, or
                other_heads = _read_heads([_other_heads(models, key_ids)])  # a model or key added
            self.deep_models, self.deep_keys = models, key_ids
            # The other views of the line come as ids, and only the rows not read yet are
            # read in full: most are the same rows.
            ids = list({sql.uuid_of(key) for (key,) in other_heads[0]} - requests.keys())
            for chunk in sql.chunks(ids, ROWS_PER_READ):
                values = sql.keys(Request, chunk)
                rows = sql.fetch(
                    f"{REQUEST_VIEW_SQL} WHERE r.id IN ({sql.marks(len(values))})", values
                )
                requests.update((view.id, view) for view in _request_views(rows, names))
        keys = _key_views(key_rows, processing_rows)
        return Snapshot(
            servers=_server_views(server_rows),
            deployments=with_expected_loads(
                tuple(
                    DeploymentView(*(sql.aware(value) for value in row[1:]))
                    for row in deployment_rows
                ),
                model_name,
            ),
            requests=tuple(requests.values()),
            config=config,
            keys=keys,
            teams=_team_views(key_rows, keys),
            unseen=frozenset() if self.deep_models is None else _unseen(requests.values()),
        )


def _unseen(heads: Iterable[RequestView]) -> frozenset[str]:
    """Of a deep line's heads, the models whose own head was full: more may wait for them."""
    counts = Counter(view.model for view in heads)
    return frozenset(model for model, n in counts.items() if n >= MODEL_HEAD)


def pass_reads() -> list[sql.Statement]:
    """What every pass reads, in this order (a deep line's other heads come after)."""
    return [
        (SERVER_VIEW_SQL, []),
        (DEPLOYMENT_VIEW_SQL, []),
        (MODEL_NAMES_SQL, []),
        (KEY_VIEW_SQL, []),
        (PROCESSING_BY_KEY_SQL, []),
        (HEAD_SQL, [*WAITING_STATES, SNAPSHOT_HEAD]),
    ]


def _read_heads(statements: list[sql.Statement]) -> list[list[tuple]]:
    """The rows of each statement, read in index order (IN_INDEX_ORDER) on PostgreSQL: its
    settings hold for the one transaction the statements run in, implicit outside one."""
    if not settings.IS_POSTGRES:
        return sql.fetch_all(statements)
    return sql.fetch_all([*IN_INDEX_ORDER, *statements])[len(IN_INDEX_ORDER) :]


def _server_views(rows: list[tuple]) -> tuple[ServerView, ...]:
    return tuple(
        ServerView(
            id=sid,
            name=name,
            slots=slots,
            capacity={
                ModelType.LLM: max_llm,
                ModelType.EMBEDDING: max_embedding,
                ModelType.RERANKING: max_reranking,
            },
            max_models=max_models,
            memory_mb=memory_mb,
            enabled=bool(enabled),
            health=health,
            cooldown_until=sql.aware(cooldown_until),
            unavailable_since=sql.aware(unavailable_since),
            stops_loads=stops_loads(kind),
        )
        for (
            sid,
            name,
            slots,
            max_llm,
            max_embedding,
            max_reranking,
            max_models,
            memory_mb,
            enabled,
            health,
            cooldown_until,
            unavailable_since,
            kind,
        ) in rows
    )


def _key_views(key_rows: list[tuple], processing_rows: list[tuple]) -> tuple[KeyView, ...]:
    processing = dict(processing_rows)
    return tuple(
        KeyView(
            id=kid,
            weight=weight,
            max_processing=most,
            processing=processing.get(kid, 0),
            team=team,
        )
        for kid, weight, most, team, *_ in key_rows
    )


def _team_views(key_rows: list[tuple], keys: tuple[KeyView, ...]) -> tuple[TeamView, ...]:
    """The teams that have keys, each with what all its keys have processing."""
    teams = {team: (weight, most) for _, _, _, team, weight, most in key_rows if team}
    processing: Counter[int] = Counter()
    for k in keys:
        if k.team is not None:
            processing[k.team] += k.processing
    return tuple(
        TeamView(id=team, weight=weight, max_processing=most, processing=processing[team])
        for team, (weight, most) in teams.items()
    )


def _request_views(rows: list[tuple], names: dict[int, str]) -> Iterator[RequestView]:
    return (_request_view(row, names.get(row[1], "")) for row in rows)


@functools.lru_cache(maxsize=4 * SNAPSHOT_HEAD)
def _request_view(row: tuple, model: str) -> RequestView:
    """The view of a row as read (kept: a deep line's head is mostly the same rows, unchanged,
    pass after pass, and building a view costs more than finding it)."""
    rid, _, priority, state, created, expires, deployment_id, not_before, key, grace, cache = row
    return RequestView(
        id=sql.uuid_of(rid),
        model=model,
        priority=priority,
        state=state,
        created_at=sql.timestamp(created),
        expires_at=sql.timestamp(expires),
        deployment_id=deployment_id,
        not_before=sql.timestamp(not_before),
        api_key=key,
        no_server_grace_s=grace,
        cache_server=cache,
    )


def _other_heads(models: tuple[int, ...], keys: tuple[int, ...] = ()) -> sql.Statement:
    """With a deep line, in one statement, the ids of the oldest waiting requests, of the
    oldest routed ones, and of each deployed model's `MODEL_HEAD` best: a model that can be
    served now is seen now, and does not hide behind a deep line for other models (a long
    load, a server down)."""
    routed = "r.state IN (%s, %s)"
    heads = [
        (WAITING_SQL, AGE_SQL, [*WAITING_STATES], SNAPSHOT_HEAD),
        (routed, AGE_SQL, [State.READY, State.NEEDS_LOADING], SNAPSHOT_HEAD),
    ]
    heads += [
        (f"{WAITING_SQL} AND r.model_id = %s", RANK_SQL, [*WAITING_STATES, m], MODEL_HEAD)
        for m in models
    ]
    # Each key's best: a key's request is seen behind a deep line of another key's (fair
    # share would not find it otherwise).
    heads += [
        (f"{WAITING_SQL} AND r.api_key_id = %s", RANK_SQL, [*WAITING_STATES, k], KEY_HEAD)
        for k in keys
    ]
    # Each head a subquery: SQLite takes no ORDER BY or LIMIT in a UNION's parts themselves.
    statement = " UNION ALL ".join(
        f"SELECT id FROM (SELECT r.id FROM {REQUESTS} r WHERE {where} ORDER BY {order} LIMIT %s)"
        f" AS head{i}"
        for i, (where, order, _, _) in enumerate(heads)
    )
    return statement, [p for _, _, values, limit in heads for p in (*values, limit)]
