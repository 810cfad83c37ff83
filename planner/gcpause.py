"""The cyclic garbage collector paused for a stretch of work, and left as it was after (enabled or not).

Two users: the search (:func:`planner.search.plan`), which allocates millions of small, acyclic objects
(actions, heap entries) that the collector would traverse again and again with every cached schedule alive
(measured: a third of the search time), and the profiler's timed calls (:func:`profiler.timing.time_op`), where a
collector pass inside the call is not the op's time."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the collector inside the block; re-enable it after only if it was enabled before."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
