"""The migrations are the schema: the same files build SQLite and PostgreSQL, with no drift."""

import json

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, inspect, text

from alembic import command
from backend import migrations
from backend.db.engine import sync_url
from backend.models import Base


def head() -> str | None:
    return ScriptDirectory.from_config(migrations.alembic_config("sqlite://")).get_current_head()


def test_the_migrated_schema_matches_the_models(database_url: str) -> None:
    engine = create_engine(sync_url(database_url))
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
        assert context.get_current_revision() == head()
    engine.dispose()


def test_migrations_go_down_and_up_again(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/roundtrip.db"
    migrations.upgrade(url)
    migrations.upgrade(url)  # a second upgrade changes nothing

    command.downgrade(migrations.alembic_config(url), "base")
    engine = create_engine(sync_url(url))
    assert inspect(engine).get_table_names() == ["alembic_version"]
    engine.dispose()
    migrations.upgrade(url)
    assert migrations.current(url) == head()


def test_intervals_counted_before_0011_are_opened_and_closed_again(tmp_path: object) -> None:
    """0011: the intervals that end at the tick's mark become open ones, with the phase their
    worker was last counted in; going down, they are whole again."""
    url = f"sqlite:///{tmp_path}/open.db"
    config = migrations.alembic_config(url)
    command.upgrade(config, "0010")
    engine = create_engine(sync_url(url))
    interval = (
        "INSERT INTO goodput_intervals (worker_id, worker_name, run_id, workspace_id, "
        "cluster_id, machine_id, pool_id, start_at, end_at, category, held, gpus) VALUES "
        "(:w, :name, 1, 1, 1, :m, NULL, :start, :end, :category, :held, 8)"
    )
    transition = (
        "INSERT INTO state_transitions (run_id, worker_id, transition_at, state, reason, phase, "
        "held_gpus, gpus, machine_id, accounted) VALUES (1, :w, :at, 'Running', '', :phase, 8, "
        "8, :m, 1)"
    )
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO accounting_marks (id, counted_until) VALUES (1, :at)"),
            {"at": "2026-11-02 10:05:00.000000"},
        )
        for w, phase, end in ((1, "running", "10:05"), (2, "ended", "10:03")):
            conn.execute(
                text(transition),
                {"w": w, "at": "2026-11-02 10:00:00.000000", "phase": "waiting", "m": None},
            )
            conn.execute(
                text(transition),
                {"w": w, "at": "2026-11-02 10:01:00.000000", "phase": "running", "m": 7},
            )
            if phase == "ended":
                conn.execute(
                    text(transition),
                    {"w": w, "at": f"2026-11-02 {end}:00.000000", "phase": "ended", "m": None},
                )
            for start, stop, category, held, m in (
                ("10:00", "10:01", "waiting", False, None),
                ("10:01", end, "productive", True, 7),
            ):
                conn.execute(
                    text(interval),
                    {
                        "w": w,
                        "name": f"w-{w}",
                        "m": m,
                        "start": f"2026-11-02 {start}:00.000000",
                        "end": f"2026-11-02 {stop}:00.000000",
                        "category": category,
                        "held": held,
                    },
                )
    command.upgrade(config, "0011")
    with engine.connect() as conn:
        opened = conn.execute(
            text(
                "SELECT worker_id, phase, gpus, phase_machine_id, start_at, category, held, "
                "machine_id FROM goodput_open_intervals"
            )
        ).all()
        closed = conn.execute(
            text("SELECT worker_id, start_at FROM goodput_intervals ORDER BY worker_id, start_at")
        ).all()
    assert [tuple(r) for r in opened] == [
        (1, "running", 8, 7, "2026-11-02 10:01:00.000000", "productive", 1, 7)
    ]
    assert [r[0] for r in closed] == [1, 2, 2]  # worker 2 ended: its intervals stay closed
    command.downgrade(config, "0010")
    with engine.connect() as conn:
        ends = conn.execute(
            text(
                "SELECT worker_id, end_at FROM goodput_intervals WHERE category = 'productive' "
                "ORDER BY worker_id"
            )
        ).all()
    assert [tuple(r) for r in ends] == [
        (1, "2026-11-02 10:05:00.000000"),
        (2, "2026-11-02 10:03:00.000000"),
    ]
    engine.dispose()


def test_running_totals_are_built_from_the_hours_counted_before_0013(tmp_path: object) -> None:
    """0013: every run's running totals from its cells, one row an hour, none skipped."""
    url = f"sqlite:///{tmp_path}/totals.db"
    config = migrations.alembic_config(url)
    command.upgrade(config, "0012")
    engine = create_engine(sync_url(url))
    cell = (
        "INSERT INTO goodput_hours (hour, workspace_id, cluster_id, scope, scope_id, category, "
        "held, gpu_seconds) VALUES (:hour, 1, 1, :scope, :id, :category, :held, :seconds)"
    )
    with engine.begin() as conn:
        for hour, scope, scope_id, category, held, seconds in (
            ("10", "run", 5, "waiting", False, 600.0),
            ("10", "run", 5, "productive", True, 1200.0),
            ("13", "run", 5, "idle", True, 3600.0),  # 11 and 12 without cells
            ("10", "workspace", 1, "productive", True, 1200.0),  # not a run: no totals
            ("11", "run", 6, "productive", True, 7.5),
        ):
            conn.execute(
                text(cell),
                {
                    "hour": f"2026-11-02 {hour}:00:00.000000",
                    "scope": scope,
                    "id": scope_id,
                    "category": category,
                    "held": held,
                    "seconds": seconds,
                },
            )
    command.upgrade(config, "0013")
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT run_id, hour, last, waiting_not_held, productive_held, idle_held "
                "FROM goodput_run_totals ORDER BY run_id, hour"
            )
        ).all()
    assert [tuple(r) for r in rows] == [
        (5, "2026-11-02 10:00:00.000000", 0, 600.0, 1200.0, 0.0),
        (5, "2026-11-02 11:00:00.000000", 0, 600.0, 1200.0, 0.0),
        (5, "2026-11-02 12:00:00.000000", 0, 600.0, 1200.0, 0.0),
        (5, "2026-11-02 13:00:00.000000", 1, 600.0, 1200.0, 3600.0),
        (6, "2026-11-02 11:00:00.000000", 1, 0.0, 7.5, 0.0),
    ]
    engine.dispose()


def test_cluster_machine_tokens_made_before_0015_become_legacy_join_tokens(
    tmp_path: object,
) -> None:
    """0015: a cluster's machine token keeps its digest as a legacy join token (it works until
    an admin revokes it); user tokens stay where they are. Going down, it is a machine token
    again."""
    url = f"sqlite:///{tmp_path}/legacy.db"
    config = migrations.alembic_config(url)
    command.upgrade(config, "0014")
    engine = create_engine(sync_url(url))
    token = (
        "INSERT INTO api_tokens (token_hash, prefix, name, kind, user_id, organization_id, "
        "workspace_id, cluster_id, created_at, revoked_at) VALUES (:hash, 'astx_abc', :name, "
        ":kind, NULL, 1, NULL, :cluster, '2026-11-02 10:00:00.000000', :revoked)"
    )
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO organizations (id, name, created_at) "
                "VALUES (1, 'o', '2026-11-02 10:00:00')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO clusters (id, organization_id, name, created_at) "
                "VALUES (1, 1, 'local', '2026-11-02 10:00:00')"
            )
        )
        for digest, name, kind, cluster, revoked in (
            ("a" * 64, "local", "agent", 1, None),
            ("b" * 64, "gone", "agent", 1, "2026-11-02 11:00:00.000000"),
            ("c" * 64, "script", "user", None, None),
        ):
            conn.execute(
                text(token),
                {
                    "hash": digest,
                    "name": name,
                    "kind": kind,
                    "cluster": cluster,
                    "revoked": revoked,
                },
            )
    command.upgrade(config, "0015")
    with engine.connect() as conn:
        joined = conn.execute(
            text(
                "SELECT token_hash, name, cluster_id, legacy, expires_at, uses_left, revoked_at "
                "FROM join_tokens ORDER BY token_hash"
            )
        ).all()
        kept = conn.execute(text("SELECT token_hash, kind FROM api_tokens")).all()
    assert [tuple(r) for r in joined] == [
        ("a" * 64, "local", 1, 1, None, None, None),
        ("b" * 64, "gone", 1, 1, None, None, "2026-11-02 11:00:00.000000"),
    ]
    assert [tuple(r) for r in kept] == [("c" * 64, "user")]
    command.downgrade(config, "0014")
    with engine.connect() as conn:
        back = conn.execute(text("SELECT token_hash, kind FROM api_tokens ORDER BY token_hash"))
        assert [tuple(r) for r in back] == [
            ("a" * 64, "agent"),
            ("b" * 64, "agent"),
            ("c" * 64, "user"),
        ]
    engine.dispose()


def test_0017_keeps_every_webhook_delivery_on_sqlite(tmp_path: object) -> None:
    """0017 widens webhooks.secret, which SQLite does by rebuilding webhooks: the drop of the
    old table cascades to its deliveries, which must come back whole, and also going down."""
    url = f"sqlite:///{tmp_path}/deliveries.db"
    config = migrations.alembic_config(url)
    command.upgrade(config, "0016")
    engine = create_engine(sync_url(url))
    at = "2026-11-02 10:00:00.000000"
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO organizations (id, name, created_at) VALUES (1, 'o', :at)"),
            {"at": at},
        )
        conn.execute(
            text(
                "INSERT INTO workspaces (id, organization_id, name, created_at) "
                "VALUES (1, 1, 'w', :at)"
            ),
            {"at": at},
        )
        conn.execute(
            text(
                "INSERT INTO events (id, organization_id, kind, reason, data, created_at) "
                "VALUES (5, 1, 'run.state', 'r', '{}', :at)"
            ),
            {"at": at},
        )
        conn.execute(
            text(
                "INSERT INTO webhooks (id, workspace_id, url, secret, kinds, cursor, horizon, "
                "created_at) VALUES (3, 1, 'https://example.com/h', 's3cret', '[]', 5, 5, :at)"
            ),
            {"at": at},
        )
        conn.execute(
            text(
                "INSERT INTO webhook_deliveries (id, webhook_id, event_id, attempts, "
                "next_attempt_at, created_at, last_error) VALUES (7, 3, 5, 2, :at, :at, 'failed')"
            ),
            {"at": at},
        )
    deliveries = "SELECT id, webhook_id, event_id, attempts, last_error FROM webhook_deliveries"
    command.upgrade(config, "0017")
    with engine.connect() as conn:
        assert [tuple(r) for r in conn.execute(text(deliveries))] == [(7, 3, 5, 2, "failed")]
        secret = conn.execute(text("SELECT secret FROM webhooks")).scalar_one()
    assert secret != "s3cret"  # encrypted on the way up
    command.downgrade(config, "0016")
    with engine.connect() as conn:
        assert [tuple(r) for r in conn.execute(text(deliveries))] == [(7, 3, 5, 2, "failed")]
        assert conn.execute(text("SELECT secret FROM webhooks")).scalar_one() == "s3cret"
    engine.dispose()


AT = "2026-11-02 10:05:00.000000"


def insert_run(conn: Connection, id_: int, state: str, reason: str, **columns: object) -> None:
    """A run, as a revision before the one under test left it; ``columns`` add to it."""
    values = {
        "id": id_,
        "workspace_id": 1,
        "cluster_id": 1,
        "name": f"r{id_}",
        "spec": "{}",
        "priority": 50,
        "worker_count": 1,
        "gpus_per_worker": 0,
        "state": state,
        "reason": reason,
        "state_since": AT,
        "created_at": AT,
        **columns,
    }
    insert(conn, "runs", values)


def insert_worker(
    conn: Connection, id_: int, run: int, state: str, reason: str, **columns: object
) -> None:
    """A worker of ``run``, as a revision before the one under test left it."""
    values = {
        "id": id_,
        "run_id": run,
        "rank": 0,
        "name": f"w{id_}",
        "state": state,
        "reason": reason,
        "state_since": AT,
        "gpu_ids": "[]",
        "gpus": 0,
        "attempt": 1,
        "restarts": 0,
        "created_at": AT,
        **columns,
    }
    insert(conn, "workers", values)


def insert(conn: Connection, table: str, values: dict[str, object]) -> None:
    names = ", ".join(values)
    conn.execute(text(f"INSERT INTO {table} ({names}) VALUES (:{', :'.join(values)})"), values)


def test_0022_backfills_the_causes_of_ends_written_before_from_their_sentences(
    tmp_path: object,
) -> None:
    """0022: a worker's cause (its last failure snapshot's) and a run's (where its sentence gave
    advice) are read once from the sentences written before; the server classifies by them
    after."""
    url = f"sqlite:///{tmp_path}/causes.db"
    config = migrations.alembic_config(url)
    command.upgrade(config, "0021")
    engine = create_engine(sync_url(url))
    runs = [
        (
            1,
            "Failed",
            "Worker a-1 failed on gpu-08: OOMKilled: the container exceeded its "
            "memory limit; the gang does not run without it",
        ),
        (2, "Pending", "Restarting in 20s (2/10): Worker b-0 stalled on m: no progress for 5m"),
        (3, "Failed", "Retry budget exhausted after 3/3 restarts"),
        (4, "Pending", "Preempted by higher-priority work (big)"),
        (5, "Running", "2 of 2 workers running"),
        (6, "Failed", "Exceeded its time limit of 1h"),
    ]
    workers = [
        (1, 1, "Failed", "OOMKilled: the container exceeded its memory limit", None),
        (2, 2, "Pending", "Waiting to be placed again: …", '{"reason": "Exited with code 1"}'),
        (3, 3, "Failed", "Waiting for drive d: it is not reachable", None),
        (4, 5, "Running", "Container running", None),
    ]
    with engine.begin() as conn:
        for id_, state, reason in runs:
            insert_run(conn, id_, state, reason)
        for id_, run, state, reason, failure in workers:
            insert_worker(conn, id_, run, state, reason, last_failure=failure)
    command.upgrade(config, "0022")
    with engine.connect() as conn:
        run_causes = conn.execute(text("SELECT id, cause FROM runs ORDER BY id")).all()
        worker_rows = conn.execute(text("SELECT id, cause FROM workers ORDER BY id")).all()
    engine.dispose()
    assert [tuple(r) for r in run_causes] == [
        (1, "oom_killed"),
        (2, "stalled"),
        (3, "retry_budget"),
        (4, "preempted"),
        (5, None),
        (6, "time_limit"),
    ]
    assert [(r[0], r[1]) for r in worker_rows] == [
        (1, "oom_killed"),
        (2, "exited"),
        (3, "not_started"),
        (4, None),
    ]


def test_0023_moves_gangs_stopping_for_a_drain_to_the_drain_cause(tmp_path: object) -> None:
    """0023: a run stopping for a drain was a preemption "by" 'drain of <machine>'; it becomes
    the cause drain, by the machine, with its workers; a preemption by a run stays one. Going
    down, the old form comes back."""
    url = f"sqlite:///{tmp_path}/drain.db"
    config = migrations.alembic_config(url)
    command.upgrade(config, "0022")
    engine = create_engine(sync_url(url))
    runs = [(1, "preemption", "drain of gpu-07"), (2, "preemption", "big"), (3, "owner", "ann")]
    with engine.begin() as conn:
        for id_, cause, by in runs:
            insert_run(conn, id_, "Running", "", stop_cause=cause, stop_by=by)
            insert_worker(conn, id_, id_, "Stopping", "", stop_cause=cause)

    def rows() -> list[tuple[object, ...]]:
        with engine.connect() as conn:
            return [
                tuple(r)
                for r in conn.execute(
                    text(
                        "SELECT r.id, r.stop_cause, r.stop_by, w.stop_cause FROM runs r "
                        "JOIN workers w ON w.run_id = r.id ORDER BY r.id"
                    )
                )
            ]

    command.upgrade(config, "0023")
    assert rows() == [
        (1, "drain", "gpu-07", "drain"),
        (2, "preemption", "big", "preemption"),
        (3, "owner", "ann", "owner"),
    ]
    command.downgrade(config, "0022")
    assert rows() == [(id_, cause, by, cause) for id_, cause, by in runs]
    engine.dispose()


def test_0024_backfills_what_waiting_runs_and_workers_wait_for_from_their_reasons(
    tmp_path: object,
) -> None:
    """0024: a pending run's wait (the scheduler's sentence), a preparing or pulling run's and
    worker's (the agent's) are read once from the sentences written before; others get none."""
    url = f"sqlite:///{tmp_path}/waits.db"
    config = migrations.alembic_config(url)
    command.upgrade(config, "0023")
    engine = create_engine(sync_url(url))
    runs = [
        (1, "Pending", "No machine fits: local has no ready machine"),
        (2, "Pending", "Queued behind big"),
        (3, "Pending", "Cannot plan workers: 3 workers of 5 GPUs are more than …"),
        (4, "Preparing", "waiting for external secret hf-token"),
        (5, "Pulling", "Pulling image ghcr.io/a/t:v9"),
        (6, "Pending", "Restarting in 10s (1/10): Worker r6-0 failed on m: Exited with code 1"),
        (7, "Running", "1 of 1 workers running"),
    ]
    workers = [(4, "Preparing", "waiting for external secret hf-token"), (5, "Pulling", "x")]
    with engine.begin() as conn:
        for id_, state, reason in runs:
            insert_run(conn, id_, state, reason)
        for id_, state, reason in workers:
            insert_worker(conn, id_, id_, state, reason)
    command.upgrade(config, "0024")
    with engine.connect() as conn:
        run_waits = conn.execute(text("SELECT id, waits_for FROM runs ORDER BY id")).all()
        worker_waits = conn.execute(text("SELECT id, waits_for FROM workers ORDER BY id")).all()
    engine.dispose()
    assert [tuple(r) for r in run_waits] == [
        (1, "machines"),
        (2, "queue"),
        (3, "plan"),
        (4, "secret"),
        (5, "image"),
        (6, None),  # a restart's wait is told by its restart time
        (7, None),
    ]
    assert [tuple(r) for r in worker_waits] == [(4, "secret"), (5, None)]


def test_0025_webhooks_that_asked_for_run_state_still_get_deletions(tmp_path: object) -> None:
    """0025: a deletion was a run.state event; since it is run.deleted, a webhook that named
    run.state gets run.deleted too ('run' and no kinds name it already). Going down, back."""
    url = f"sqlite:///{tmp_path}/hooks.db"
    config = migrations.alembic_config(url)
    command.upgrade(config, "0024")
    engine = create_engine(sync_url(url))
    hooks = [
        (1, ["run.state"]),
        (2, ["run.state", "alert"]),
        (3, ["run"]),
        (4, []),
        (5, ["alert.firing"]),
        (6, ["run.state", "run.deleted"]),
    ]
    with engine.begin() as conn:
        for id_, kinds in hooks:
            conn.execute(
                text(
                    "INSERT INTO webhooks (id, workspace_id, url, secret, kinds, cursor, "
                    "horizon, created_at) VALUES (:id, 1, 'https://example.com/h', 's', :kinds, "
                    "0, 0, '2026-11-02 10:05:00.000000')"
                ),
                {"id": id_, "kinds": json.dumps(kinds)},
            )

    def kinds() -> list[tuple[int, list[str]]]:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, kinds FROM webhooks ORDER BY id")).all()
            return [(r[0], json.loads(r[1])) for r in rows]

    command.upgrade(config, "0025")
    assert kinds() == [
        (1, ["run.state", "run.deleted"]),
        (2, ["run.state", "alert", "run.deleted"]),
        (3, ["run"]),
        (4, []),
        (5, ["alert.firing"]),
        (6, ["run.state", "run.deleted"]),
    ]
    command.downgrade(config, "0024")
    assert kinds() == [(i, k if i != 6 else ["run.state"]) for i, k in hooks]
    engine.dispose()


def test_0036_moves_each_runs_slurm_bookkeeping_out_of_its_specification(
    tmp_path: object,
) -> None:
    """0036 (issue 38): a run's spec["slurm"] (its job, submitted or imported, and how many of
    its changes were written) becomes its slurm_runs row, and leaves the spec: Run again then
    submits the spec as a run's. Going down, it comes back."""
    url = f"sqlite:///{tmp_path}/slurm.db"
    config = migrations.alembic_config(url)
    command.upgrade(config, "0035")
    engine = create_engine(sync_url(url))
    submitted = {"job_id": "12", "account": "nlp", "submitted": True, "applied": 3}
    imported = {"job_id": "13", "job_name": "a|b", "account": "nlp", "user": "ana",
                "partition": "gpu", "priority": 4294901759}  # fmt: skip
    specs = {
        1: {"name": "r1", "command": ["python", "train.py"], "slurm": submitted},
        2: {"name": "r2", "workers": 1, "slurm": imported},  # (before "applied" was kept)
        3: {"name": "r3", "command": ["true"]},  # an agent's run
    }
    with engine.begin() as conn:
        for id_, spec in specs.items():
            job = spec.get("slurm", {}).get("job_id")
            insert_run(conn, id_, "Running", "", spec=json.dumps(spec), external_id=job)

    def rows() -> tuple[list[tuple[object, ...]], dict[int, object]]:
        with engine.connect() as conn:
            kept = [
                tuple(r)
                for r in conn.execute(
                    text(
                        "SELECT run_id, job_id, submitted, job_name, account, user, partition, "
                        "qos, priority, cancelled_by, applied FROM slurm_runs ORDER BY run_id"
                    )
                )
            ]
            found = conn.execute(text("SELECT id, spec FROM runs ORDER BY id"))
            return kept, {id_: json.loads(spec) for id_, spec in found}

    command.upgrade(config, "0036")
    kept, found = rows()
    assert kept == [
        (1, "12", 1, "", "nlp", "", "", "", None, None, 3),
        (2, "13", 0, "a|b", "nlp", "ana", "gpu", "", 4294901759, None, None),
    ]
    assert found == {
        1: {"name": "r1", "command": ["python", "train.py"]},
        2: {"name": "r2", "workers": 1},
        3: specs[3],
    }
    command.downgrade(config, "0035")
    with engine.connect() as conn:
        back = {i: json.loads(s) for i, s in conn.execute(text("SELECT id, spec FROM runs"))}
    assert back[3] == specs[3] and back[1]["slurm"]["job_id"] == "12"
    assert back[1]["slurm"]["submitted"] and back[1]["slurm"]["applied"] == 3
    assert back[2]["slurm"]["job_name"] == "a|b" and back[2]["slurm"]["priority"] == 4294901759
    engine.dispose()
