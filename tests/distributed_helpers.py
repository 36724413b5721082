"""Run a function on W CPU processes joined by a gloo process group, and collect what each rank
returns; for the tests of torch.distributed use (imported as `from distributed_helpers import
...`).

Design, for a 2-core host and a pytest that must never hang:

* spawn (not fork): a forked child would inherit the parent's OpenMP pool and autograd threads.
  Each child pays an interpreter + ``import torch`` + the extension, so a caller should run many
  cases per spawn (the worker gets a list of case names and returns a dict).
* A file:// rendezvous in a fresh temporary directory: no free-port search, hence no race with
  another process grabbing the port between the search and the bind.
* ``torch.set_num_threads(1)`` in every child: W processes on 2 cores would otherwise
  oversubscribe them many times over.
* Results travel through files (``torch.save`` per rank), not a Queue: a child blocked writing a
  large result into a full pipe never exits, and a parent joining it would wait forever.
* A hard deadline: the parent waits on the children's sentinels; when one fails (exception or
  signal) or the deadline passes, it kills every child (the others are usually blocked in a
  collective waiting for the failed one) and raises with the child's formatted traceback.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


class WorkerError(RuntimeError):
    """A rank raised (its traceback is in the message), died, or the run timed out."""


def _child(fn, rank, world_size, init_file, out_dir, args, pg_timeout_s):
    torch.set_num_threads(1)
    path = os.path.join(out_dir, f"rank{rank}.pt")
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world_size,
            # A collective waiting for a dead peer fails after this instead of gloo's 30 min;
            # the parent's deadline normally kills it long before.
            timeout=timedelta(seconds=pg_timeout_s),
        )
        result = fn(rank, world_size, *args)
        torch.save({"result": result}, path)
        dist.destroy_process_group()
    except BaseException:
        torch.save({"error": traceback.format_exc()}, path)
        sys.stdout.flush()
        sys.stderr.flush()
        # No destroy_process_group here: with peers blocked in a collective it may block too.
        # The parent kills the peers as soon as it sees this exit.
        os._exit(1)


def _kill_all(procs):
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(10)


def run_workers(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    timeout: float = 120.0,
) -> list[Any]:
    """``[fn(rank, world_size, *args) for each rank]``, each rank in its own spawned process
    inside an initialised gloo process group of ``world_size`` ranks.

    ``fn`` must be picklable by reference (a module-level function of an importable module) and
    its return value saveable by ``torch.save``. Raises WorkerError, after killing every child,
    when a rank raises (the message holds the rank's traceback), dies without a result (e.g. a
    signal), or when ``timeout`` seconds pass.
    """
    ctx = multiprocessing.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="tfgrads_dist_")
    init_file = os.path.join(tmp, "rendezvous")  # must not exist yet: FileStore creates it
    procs = [
        ctx.Process(
            target=_child,
            args=(fn, rank, world_size, init_file, tmp, tuple(args), max(timeout, 10.0)),
            daemon=True,  # a parent that dies anyway takes its children with it
        )
        for rank in range(world_size)
    ]
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        pending = {p.sentinel: rank for rank, p in enumerate(procs)}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                alive = sorted(pending.values())
                raise WorkerError(
                    f"run_workers({getattr(fn, '__name__', fn)}, world_size={world_size}): "
                    f"timed out after {timeout:.0f} s; ranks still running: {alive}"
                )
            for sentinel in multiprocessing.connection.wait(list(pending), timeout=left):
                rank = pending.pop(sentinel)
                procs[rank].join()
                if procs[rank].exitcode != 0:
                    raise WorkerError(_failure(tmp, rank, procs[rank].exitcode))
        results = []
        for rank in range(world_size):
            results.append(torch.load(os.path.join(tmp, f"rank{rank}.pt"))["result"])
        return results
    finally:
        _kill_all(procs)
        shutil.rmtree(tmp, ignore_errors=True)


def _failure(tmp, rank, exitcode):
    path = os.path.join(tmp, f"rank{rank}.pt")
    if os.path.exists(path):
        saved = torch.load(path)
        if "error" in saved:
            return f"rank {rank} raised:\n{saved['error']}"
    return (
        f"rank {rank} exited with code {exitcode} and no result (negative: killed by that "
        "signal; positive: it failed before running the function, see its stderr)"
    )


# Workers for the harness's own tests (here: a child then imports torch alone, not the tests).
def raise_on_rank1_worker(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 fails")
    dist.barrier()  # rank 0 would wait here for ever (gloo: the group's timeout)


def hang_worker(rank, world_size):
    time.sleep(3600)
