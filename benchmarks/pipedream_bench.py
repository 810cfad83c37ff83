"""PipeDream's uneven replication where it wins (issue 17): the front-heavy model of tests/pipedream_front.py on
4 devices of 1 GiB. Prints the best replicated plan and the best uniform plans as the simulator times them
and, with ``--emulate``, the executor's emulated runs of them (compute slept for the profile's times,
communication real; the figures move with the machine's load).

Run: ``python benchmarks/pipedream_bench.py [--emulate] [--iterations 5] [--async]``; ``--async`` adds PipeDream's
asynchronous variant (``pipedream-rr``, weight stashing: the same lists, its stashed versions in memory).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from pipedream_front import front_heavy_profile, request, small_memory_cluster  # noqa: E402

from planner.profile import save_profile  # noqa: E402
from planner.search import plan  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--emulate", action="store_true", help="also run the plans with emulated compute")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--async", dest="allow_async", action="store_true", help="also PipeDream's asynchronous variant")
    args = ap.parse_args()
    prof, cl = front_heavy_profile(), small_memory_cluster()
    res = plan(prof, cl, request().model_copy(update={"allow_async": args.allow_async}))
    rr = next(c for c in res.candidates if c.config.replication)
    stashing = [c for c in res.candidates if c.config.schedule == "pipedream-rr"][:1]
    uniform = [c for c in res.candidates if not c.config.replication]
    for c in stashing:
        print(f"asynchronous: {c.label()}: {c.iteration_time * 1e3:.1f} ms, peak {max(c.memory) / 2**30:.3f} GiB "
              f"(1f1b-rr: {max(rr.memory) / 2**30:.3f} GiB)")
    print(f"best replicated: {rr.label()}: {rr.iteration_time * 1e3:.1f} ms")
    for c in uniform[:3]:
        print(f"uniform: {c.label()}: {c.iteration_time * 1e3:.1f} ms "
              f"(replicated {100 * (1 - rr.iteration_time / c.iteration_time):.1f}% faster)")
    if not args.emulate:
        return
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        save_profile(prof, t / "profile.json")
        (t / "cluster.json").write_text(cl.model_dump_json())
        (t / "plan.json").write_text(json.dumps(res.to_dict()))
        for cand in [rr, *stashing, *uniform[:1]]:
            idx = res.candidates.index(cand)
            subprocess.run([sys.executable, "-m", "pipeplan.cli", "run", "--plan", str(t / "plan.json"),
                            "--candidate", str(idx), "--emulate", str(t / "profile.json"), "--cluster",
                            str(t / "cluster.json"), "--iterations", str(args.iterations),
                            "--out", str(t / "out.json")], check=True, capture_output=True, cwd=ROOT)
            out = json.loads((t / "out.json").read_text())
            m = out["measured"]["iteration_time"]
            print(f"emulated {cand.label()}: {m * 1e3:.1f} ms, predicted {cand.iteration_time * 1e3:.1f} ms, "
                  f"measured/predicted {m / cand.iteration_time:.3f}")


if __name__ == "__main__":
    main()
