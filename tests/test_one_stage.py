"""Every schedule that runs on one pipeline device trains exactly like single-process training (or, for
PipeDream's asynchronous schedules, like weight stashing computed in one process). One stage holds the
embedding and the LM head, whose weights are one Parameter there (tied; on several stages they are copies
whose gradients are summed), which two paths got wrong: zero-bubble's split backward left the embedding's
part of the tied weight's gradient out, and the stashed reference listed the head's name nowhere."""

from __future__ import annotations

from one_rank import one_rank

from planner.schedules import ALL_SCHEDULES


def test_every_one_device_schedule_equals_one_process() -> None:
    out = one_rank("""
        from executor.plan import PlanError
        from planner.schedules import ALL_SCHEDULES
        for schedule in ALL_SCHEDULES:
            for recompute in (False, True):
                try:
                    plan = RunPlan.direct(schedule, 1, 4, model="gpt-tiny", iterations=2, recompute=recompute,
                                          **({"chunks": 2} if schedule == "interleaved" else {}))
                    plan.validate(1)
                except PlanError as e:  # chimera needs two devices; no recomputation with weight stashing
                    print(schedule, recompute, "not valid:", e)
                    continue
                check = run_plan(plan, 0, 1, check=True)["check"]
                print(schedule, recompute, "ok" if check["ok"] else "FAILED", check["message"])
    """)
    lines = out.strip().splitlines()
    assert not [line for line in lines if "FAILED" in line], out
    ran = {tuple(line.split()[:2]) for line in lines if line.split()[2] == "ok"}
    assert ("zb-h1", "False") in ran and ("pipedream", "False") in ran and ("pipedream-rr", "False") in ran
    assert len(ran) >= 2 * len(ALL_SCHEDULES) - 8, out  # chimera both ways, the three stashing ones recomputing
