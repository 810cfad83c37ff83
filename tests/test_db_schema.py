"""Database: migrations, the schema check at startup, claiming under concurrency, leases."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from api_support import TINY_DEVICE, make_settings
from sqlalchemy import func, inspect, select

from api import crud, jobqueue, planqueue
from db.migrate import SchemaBehind, check, current, head, upgrade
from db.models import Job, PlanRequest, utcnow
from db.session import make_engine, make_sessionmaker


def test_upgrade_creates_every_table(db_url: str) -> None:
    eng = make_engine(db_url)
    try:
        tables = set(inspect(eng).get_table_names())
        assert {"profiles", "clusters", "plan_requests", "candidates", "jobs", "workers", "results",
                "alembic_version"} <= tables
        assert current(eng) == head()
        check(eng)  # no error at head
    finally:
        eng.dispose()
    assert upgrade(db_url) == head()  # idempotent


def test_app_refuses_a_schema_that_is_behind(raw_db_url: str) -> None:
    from fastapi.testclient import TestClient

    from api.main import create_app

    with pytest.raises(SchemaBehind, match="pipeplan db-upgrade"):
        with TestClient(create_app(make_settings(raw_db_url))):
            pass


def test_sqlite_uses_wal(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'w.db'}"
    upgrade(url)
    eng = make_engine(url)
    try:
        with eng.connect() as c:
            assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        eng.dispose()


def _plan_with_jobs(sessions, n: int) -> list[int]:  # type: ignore[no-untyped-def]
    from api_support import tiny_cluster, tiny_profile

    from planner.cluster import Cluster
    from planner.profile import ModelProfile

    with sessions.begin() as db:
        p, _ = crud.add_profile(db, ModelProfile.model_validate(tiny_profile()))
        c, _ = crud.add_cluster(db, Cluster.model_validate(tiny_cluster()), 1024)
        plan = PlanRequest(profile_id=p.id, cluster_id=c.id, request={"global_batch": 8}, request_hash="x",
                           status="done")
        db.add(plan)
        db.flush()
        planqueue.finish_plan(db, plan.id, {"candidates": [{"label": "c0", "iteration_time": 1.0, "throughput": 8.0}]})
        ids = [crud.create_job(db, {"plan_id": plan.id, "candidate_index": 0, "model": "gpt-tiny",
                                    "iterations": 1, "emulate": False}, 3).id for _ in range(n)]
    return ids


def test_concurrent_claimers_never_share_a_job(db_url: str) -> None:
    """8 threads, each with its own session, claim until the queue is empty: every job exactly once."""
    eng = make_engine(db_url)
    sessions = make_sessionmaker(eng)
    try:
        jobs = _plan_with_jobs(sessions, 40)
        with sessions.begin() as db:
            workers = [crud.register_worker(db, {"name": f"w{i}", "node": "n", "gpus": 0,
                                                 "device_type": TINY_DEVICE})[0].id for i in range(8)]
        claimed: dict[int, list[int]] = {w: [] for w in workers}
        barrier = threading.Barrier(len(workers))
        errors: list[BaseException] = []

        def run(w: int) -> None:
            try:
                barrier.wait()
                for _ in range(200):  # bounded
                    with sessions.begin() as db:
                        job = jobqueue.claim_job(db, w, 30)
                        if job is None:
                            return
                        claimed[w].append(job.id)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=run, args=(w,)) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        got = [j for js in claimed.values() for j in js]
        assert sorted(got) == sorted(jobs), "each job claimed exactly once"
        assert sum(1 for js in claimed.values() if js) >= 2, "several claimers took part"
        with sessions() as db:
            for jid in jobs:
                j = db.get(Job, jid)
                assert j.state == "running" and j.attempts == 1 and j.worker_id in claimed
                assert jid in claimed[j.worker_id]
    finally:
        eng.dispose()


def test_expired_lease_requeues_then_fails_after_max_attempts(db_url: str) -> None:
    eng = make_engine(db_url)
    sessions = make_sessionmaker(eng)
    try:
        (jid,) = _plan_with_jobs(sessions, 1)
        with sessions.begin() as db:
            w = crud.register_worker(db, {"name": "w", "node": "n", "gpus": 0, "device_type": TINY_DEVICE})[0].id
        for attempt in (1, 2, 3):
            with sessions.begin() as db:
                job = jobqueue.claim_job(db, w, 30)
                assert job is not None and job.id == jid and job.attempts == attempt
                # a renewal extends the lease
                job2, cancel = jobqueue.renew_lease(db, jid, w, 60)
                assert not cancel and job2.lease_expires_at > utcnow() + timedelta(seconds=50)
            with sessions.begin() as db:
                assert jobqueue.expire_leases(db) == []  # not expired yet
                assert jobqueue.expire_leases(db, utcnow() + timedelta(seconds=120)) == [jid]
            with sessions() as db:
                j = db.get(Job, jid)
                assert j.state == ("queued" if attempt < 3 else "failed"), (attempt, j.state)
        with sessions() as db:
            j = db.get(Job, jid)
            assert "lease expired" in j.error and [e["event"] for e in j.history].count("lease_expired") == 3
            with pytest.raises(crud.Conflict, match="lease was lost"):
                jobqueue.renew_lease(db, jid, w, 30)
    finally:
        eng.dispose()


def test_cli_db_upgrade_and_seed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from pipeplan.cli import app

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    r = CliRunner().invoke(app, ["db-upgrade", "--url", url])
    assert r.exit_code == 0 and f"at revision {head()}" in r.output, r.output
    r = CliRunner().invoke(app, ["seed", "--url", url, "--no-measure"])  # measuring: tests/test_seed_measured.py
    assert r.exit_code == 0 and "gpt2-medium on A100-SXM4-80GB" in r.output and "bert-48 on P100" in r.output
    from api.seed import EXAMPLES, SEEDS

    seeded = len(list((EXAMPLES / "clusters").glob("*.json"))) + len(SEEDS)
    r = CliRunner().invoke(app, ["seed", "--url", url, "--no-measure"])
    assert r.exit_code == 0 and r.output.count("(already there)") == seeded, r.output
    for cmd in ("serve", "agent"):
        r = CliRunner().invoke(app, [cmd, "--help"])
        assert r.exit_code == 0


def test_calibration_jobs_column_is_filled_from_stored_bodies(raw_db_url: str) -> None:
    """0005 adds clusters.calibration_jobs (list answers label versions from it, not from bodies) and fills
    it for the rows already stored: the jobs of a body's calibration, 0 when it names none, NULL without."""
    import json

    from sqlalchemy import text

    upgrade(raw_db_url, "0004_gang_agents")
    bodies = {1: {"name": "a"}, 2: {"name": "a", "calibration": {"jobs": 3, "compute_scale": 1.2}},
              3: {"name": "a", "calibration": {"compute_scale": 1.1}}}
    eng = make_engine(raw_db_url)
    try:
        with eng.begin() as conn:
            for cid, body in bodies.items():
                conn.execute(text("INSERT INTO clusters (id, content_hash, name, device, gpus, body, created_at, "
                                  "version) VALUES (:id, :h, 'a', 'cpu', 4, :body, '2026-11-23 00:00:00', 1)"),
                             {"id": cid, "h": f"h{cid}", "body": json.dumps(body)})
        assert upgrade(raw_db_url) == head()
        with eng.connect() as conn:
            got = dict(conn.execute(text("SELECT id, calibration_jobs FROM clusters")).all())
    finally:
        eng.dispose()
    assert got == {1: None, 2: 3, 3: 0}



def test_last_version_is_filled_from_the_stored_versions(raw_db_url: str) -> None:
    """0008 adds clusters.last_version (the largest version number a lineage has handed out, on its uploaded row:
    a deleted version's number is not given again) and fills it from the versions stored: 1 where there are none."""
    import json

    from sqlalchemy import text

    upgrade(raw_db_url, "0007_sqlite_ids_never_reused")
    rows = [(1, None, 1), (2, 1, 2), (3, 1, 4), (4, None, 1), (5, None, 1), (6, 5, 2)]
    eng = make_engine(raw_db_url)
    try:
        with eng.begin() as conn:
            for cid, base, version in rows:
                conn.execute(text("INSERT INTO clusters (id, content_hash, name, device, gpus, body, created_at, "
                                  "base_id, version) VALUES (:id, :h, 'a', 'cpu', 4, :body, '2026-12-07 00:00:00', "
                                  ":base, :v)"), {"id": cid, "h": f"h{cid}", "body": json.dumps({"name": "a"}),
                                                  "base": base, "v": version})
        assert upgrade(raw_db_url) == head()
        with eng.connect() as conn:
            got = dict(conn.execute(text("SELECT id, last_version FROM clusters")).all())
    finally:
        eng.dispose()
    assert got == {1: 4, 2: 1, 3: 1, 4: 1, 5: 2, 6: 1}

def _inputs_at_an_older_revision(eng) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """:func:`_inputs` in plain SQL, for a database at an earlier revision than the models (whose queries name
    every column they map: a column added since is not there yet)."""
    import json

    from sqlalchemy import text

    with eng.begin() as c:
        c.execute(text("INSERT INTO profiles (content_hash, name, device, dtype, source, num_layers, total_params, "
                       "body, created_at) VALUES ('p', 'tiny', 'cpu', 'fp32', 'analytic', 6, 1.0, :b, "
                       "CURRENT_TIMESTAMP)"),
                  {"b": json.dumps({"name": "tiny"})})
        c.execute(text("INSERT INTO clusters (content_hash, name, device, gpus, body, created_at, version) "
                       "VALUES ('c', 'tiny-cluster', 'cpu', 4, :b, CURRENT_TIMESTAMP, 1)"),
                  {"b": json.dumps({"name": "tiny-cluster"})})
        return (c.execute(text("SELECT id FROM profiles")).scalar_one(),
                c.execute(text("SELECT id FROM clusters")).scalar_one())


def _inputs(sessions) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    from api_support import tiny_cluster, tiny_profile

    from planner.cluster import Cluster
    from planner.profile import ModelProfile

    with sessions.begin() as db:
        p, _ = crud.add_profile(db, ModelProfile.model_validate(tiny_profile()))
        c, _ = crud.add_cluster(db, Cluster.model_validate(tiny_cluster()), 1024)
        return p.id, c.id


def test_identical_plan_requests_at_once_make_one_plan(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """4 identical POST /plans at once made 4 plans (a QA walkthrough: 201 202 202 202; 2 of 8 trials): each looked
    the request up, found none, inserted. Here every thread is held between its look-up and its insert until all
    have looked up (the race, every time); the unique index of live plans lets one insert through and
    crud.stored_once answers the others with that row."""
    eng = make_engine(db_url)
    sessions = make_sessionmaker(eng)
    try:
        pid, cid = _inputs(sessions)
        n = 4
        gate = threading.Barrier(n, timeout=30)
        held = threading.local()
        real = planqueue.unfinished_count

        def count_after_all_looked(db) -> int:  # type: ignore[no-untyped-def]
            if not getattr(held, "done", False):  # called between the look-up and the insert
                held.done = True
                gate.wait()
            return real(db)

        monkeypatch.setattr(planqueue, "unfinished_count", count_after_all_looked)
        got: list[tuple[int, bool]] = []
        errors: list[BaseException] = []

        def run() -> None:
            try:
                with sessions() as db:
                    row, created = crud.stored_once(db, lambda: crud.create_plan(
                        db, pid, cid, {"global_batch": 8}, max_gpus=1024, max_unfinished=64))
                    db.commit()
                    got.append((row.id, created))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=run) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        monkeypatch.undo()
        assert len({i for i, _ in got}) == 1 and sorted(c for _, c in got) == [False] * (n - 1) + [True], got
        with sessions() as db:
            assert db.scalar(select(func.count()).select_from(PlanRequest)) == 1
            # a failed plan leaves room for a new one (the index covers the plans not failed)
            planqueue.fail_plan(db, got[0][0], "boom")
            db.commit()
            row, created = crud.create_plan(db, pid, cid, {"global_batch": 8}, max_gpus=1024, max_unfinished=64)
            db.commit()
            assert created and row.id != got[0][0]
    finally:
        eng.dispose()


def test_migration_keeps_duplicate_plans_and_marks_the_older(raw_db_url: str) -> None:
    """Plans stored twice before the unique index (the race above) are kept as they were; of a request's plans not
    failed, the newest (what a repeated request was answered with) stays live, each older one names it in
    duplicate_of; a failed one is left alone."""
    from sqlalchemy import text
    from sqlalchemy.exc import IntegrityError

    upgrade(raw_db_url, "0005_cluster_calibration_jobs")
    eng = make_engine(raw_db_url)
    try:
        pid, cid = _inputs_at_an_older_revision(eng)
        with eng.begin() as c:
            for status, h in (("done", "h"), ("failed", "h"), ("done", "h"), ("queued", "h"), ("done", "k")):
                c.execute(text("INSERT INTO plan_requests (profile_id, cluster_id, request, request_hash, status, "
                               "attempts, created_at) VALUES (:p, :c, '{\"global_batch\": 8}', :h, :s, 1, "
                               "CURRENT_TIMESTAMP)"), {"p": pid, "c": cid, "h": h, "s": status})
        eng.dispose()
        assert upgrade(raw_db_url) == head()
        eng = make_engine(raw_db_url)
        sessions = make_sessionmaker(eng)
        with sessions() as db:
            rows = {r.id: (r.status, r.request_hash, r.duplicate_of) for r in db.scalars(select(PlanRequest))}
            assert rows == {1: ("done", "h", 4), 2: ("failed", "h", None), 3: ("done", "h", 4),
                            4: ("queued", "h", None), 5: ("done", "k", None)}, rows
            assert crud.get_plan(db, 1).request == {"global_batch": 8}  # still readable
        with pytest.raises(IntegrityError):  # a second live plan of a request is refused now
            with sessions.begin() as db:
                db.add(PlanRequest(profile_id=pid, cluster_id=cid, request={}, request_hash="k", status="queued"))
    finally:
        eng.dispose()


def test_a_delete_racing_a_plan_names_what_is_in_use(db_url: str) -> None:
    """A profile delete racing a plan's insert answered 409 'conflicts with stored data: FOREIGN KEY constraint
    failed'. The count of its plans misses one stored meanwhile (here: a count that never matches), and the foreign
    key's refusal is now a Conflict naming the profile."""
    from db.models import Profile

    eng = make_engine(db_url)
    sessions = make_sessionmaker(eng)
    try:
        pid, cid = _inputs(sessions)
        with sessions.begin() as db:
            crud.create_plan(db, pid, cid, {"global_batch": 8}, max_gpus=1024, max_unfinished=64)
        with sessions() as db:
            with pytest.raises(crud.Conflict, match=f"^profile {pid} is used by a plan stored meanwhile; delete is "
                                                    "refused to keep it valid$"):
                crud._delete_unused(db, Profile, "profile", PlanRequest.attempts + 10**6, pid)
    finally:
        eng.dispose()


def _profile_doc(name: str) -> object:
    from api_support import tiny_profile

    from planner.profile import ModelProfile

    return ModelProfile.model_validate({**tiny_profile(), "name": name})


def test_a_deleted_profiles_or_clusters_id_is_never_handed_out_again(db_url: str) -> None:
    """On SQLite, deleting the newest profile (or cluster) and uploading another gave the new one the deleted id:
    a link or a script's id that meant the deleted one named the new one (migration 0007: AUTOINCREMENT)."""
    from api_support import tiny_cluster

    from planner.cluster import Cluster

    eng = make_engine(db_url)
    sessions = make_sessionmaker(eng)
    try:
        with sessions.begin() as db:
            a, _ = crud.add_profile(db, _profile_doc("a"))
            b, _ = crud.add_profile(db, _profile_doc("b"))
            k, _ = crud.add_cluster(db, Cluster.model_validate({**tiny_cluster(), "name": "k"}), 1024)
            ids = (a.id, b.id, k.id)
        with sessions.begin() as db:
            crud.delete_profile(db, ids[1])
            crud.delete_cluster(db, ids[2])
        with sessions.begin() as db:
            c, _ = crud.add_profile(db, _profile_doc("c"))
            m, _ = crud.add_cluster(db, Cluster.model_validate({**tiny_cluster(), "name": "m"}), 1024)
            assert c.id > ids[1] and m.id > ids[2], (ids, c.id, m.id)
    finally:
        eng.dispose()


def test_migration_0007_keeps_every_row_id_and_reference(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The SQLite rebuild (tables others refer to, foreign keys off meanwhile) keeps each profile's and cluster's
    id, the plans' and the calibrated version's references and the indexes; a downgrade gives the tables back."""
    from sqlalchemy import text

    from db.migrate import downgrade

    url = f"sqlite:///{tmp_path / 'pipeplan.db'}"
    upgrade(url, "0006_plan_requests_live_unique")
    eng = make_engine(url)
    pid, cid = _inputs_at_an_older_revision(eng)
    with eng.begin() as c:
        c.execute(text("INSERT INTO clusters (content_hash, name, device, gpus, body, created_at, base_id, version) "
                       "SELECT 'v2', name, device, gpus, body, created_at, id, 2 FROM clusters WHERE id = :c"),
                  {"c": cid})
        c.execute(text("INSERT INTO plan_requests (profile_id, cluster_id, request, request_hash, status, attempts, "
                       "created_at) VALUES (:p, :c, '{}', 'h', 'done', 1, CURRENT_TIMESTAMP)"), {"p": pid, "c": cid})
        before = {t: c.execute(text(f"SELECT * FROM {t} ORDER BY id")).all()
                  for t in ("profiles", "clusters", "plan_requests")}
        indexes = {t: sorted(i["name"] for i in inspect(c).get_indexes(t)) for t in ("profiles", "clusters")}
    eng.dispose()
    assert upgrade(url, "0007_sqlite_ids_never_reused") == "0007_sqlite_ids_never_reused"
    eng = make_engine(url)
    try:
        with eng.begin() as c:
            assert {t: c.execute(text(f"SELECT * FROM {t} ORDER BY id")).all() for t in before} == before
            assert {t: sorted(i["name"] for i in inspect(c).get_indexes(t)) for t in indexes} == indexes
            assert c.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1  # the app's connections: on again
            assert c.exec_driver_sql("PRAGMA foreign_key_check").all() == []
            for t in ("profiles", "clusters"):
                assert "AUTOINCREMENT" in c.execute(text("SELECT sql FROM sqlite_master WHERE name = :t"),
                                                    {"t": t}).scalar()
            with pytest.raises(Exception, match="FOREIGN KEY"):  # the plans' reference is enforced still
                c.execute(text("DELETE FROM profiles WHERE id = :p"), {"p": pid})
    finally:
        eng.dispose()
    assert downgrade(url) == "0006_plan_requests_live_unique"
    eng = make_engine(url)
    try:
        with eng.begin() as c:
            assert {t: c.execute(text(f"SELECT * FROM {t} ORDER BY id")).all() for t in before} == before
            sql = c.execute(text("SELECT sql FROM sqlite_master WHERE name = 'profiles'")).scalar()
            assert "AUTOINCREMENT" not in sql
    finally:
        eng.dispose()


def test_next_version_of_a_cluster_deleted_meanwhile_is_a_conflict(db_url: str) -> None:
    """A calibration whose uploaded cluster is deleted between reading its lineage and numbering the new version
    answers 409 naming it (the UPDATE ... RETURNING finds no row), not a 500; else it numbers past the largest."""
    from sqlalchemy import text

    from api.calibration import next_version
    from db.models import ClusterRow

    eng = make_engine(db_url)
    sessions = make_sessionmaker(eng)
    try:
        _, cid = _inputs(sessions)
        with sessions.begin() as db:
            base = db.get(ClusterRow, cid)
            assert next_version(db, base) == 2 and next_version(db, base) == 3  # each number handed out once
        with sessions() as db:
            base = db.get(ClusterRow, cid)
            with eng.begin() as other:  # another request deletes it meanwhile
                other.execute(text("DELETE FROM clusters WHERE id = :c"), {"c": cid})
            with pytest.raises(crud.Conflict, match=f"^cluster {cid} was deleted meanwhile"):
                next_version(db, base)
    finally:
        eng.dispose()


def test_a_plan_whose_api_died_at_each_of_its_starts_fails_instead_of_running_again(db_url: str) -> None:
    """A plan whose lease ran out (its API died while it ran) is queued again -- until it has been started
    ``max_attempts`` times: a plan that takes its API down (memory past the machine's, a crash) did so again at
    every restart, for ever. Then it fails, saying why; a plan released by a stopping API is not counted."""
    from api_support import tiny_cluster, tiny_profile

    from planner.cluster import Cluster
    from planner.profile import ModelProfile

    eng = make_engine(db_url)
    sessions = make_sessionmaker(eng)
    try:
        with sessions.begin() as db:
            p, _ = crud.add_profile(db, ModelProfile.model_validate(tiny_profile()))
            c, _ = crud.add_cluster(db, Cluster.model_validate(tiny_cluster()), 1024)
            plan = PlanRequest(profile_id=p.id, cluster_id=c.id, request={"global_batch": 8}, request_hash="y")
            db.add(plan)
            db.flush()
            pid = plan.id
        later = utcnow() + timedelta(seconds=120)
        for attempt in (1, 2, 3):
            with sessions.begin() as db:
                assert planqueue.start_plan(db, pid, f"api-{attempt}", 30)
            if attempt == 2:  # a stopping API gives it back, uncounted, and it is started again
                with sessions.begin() as db:
                    assert planqueue.release_plan(db, pid, "api-2")
                    assert planqueue.start_plan(db, pid, "api-2b", 30)
            with sessions.begin() as db:  # the API dies: nobody renews
                assert planqueue.requeue_expired_plans(db) == []  # not yet
                assert planqueue.requeue_expired_plans(db, later, max_attempts=3) == [pid]
                row = db.get(PlanRequest, pid)
                assert (row.status, row.attempts, row.runner) == ("queued" if attempt < 3 else "failed", attempt,
                                                                  None)
        with sessions.begin() as db:
            row = db.get(PlanRequest, pid)
            assert "at each of its 3 starts" in row.error and row.finished_at is not None
            assert planqueue.queued_plans(db) == []
    finally:
        eng.dispose()
