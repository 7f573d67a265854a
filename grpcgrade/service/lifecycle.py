"""A serving process's life: how it is tuned at start (files, memory maps, the GIL's switch interval, the
garbage collector) and how long it may take to exit. The server's process and its HTTP face processes
(`http.process`) both serve clients on an event loop and are held to the same drain bound."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import resource
import sys
import threading

log = logging.getLogger("grpcgrade.service.server")


#: How long past `--grace` the process may take to exit: the faces' ends, the workers' stop, the exit
#: itself. Kubernetes' terminationGracePeriodSeconds (deploy/k8s) leaves room for preStop + grace + this.
SHUTDOWN_MARGIN_SECONDS = 3.0
#: Workers' time to finish what they hold at exit, within the margin.
POOL_PATIENCE_SECONDS = 1.0


def exit_deadline(seconds: float) -> threading.Timer:
    """A timer that ends the process (status 0) if it is still there `seconds` from now: a grading thread
    (a synchronous grader in the server process, a sandbox's wait) or a stuck worker's join would otherwise
    hold the interpreter's exit past the grace period the orchestrator was promised."""

    def force() -> None:
        still = [t.name for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
        log.warning("exiting %.1f s after the drain began; still running: %s", seconds, ", ".join(still) or "-")
        logging.shutdown()
        os._exit(0)

    timer = threading.Timer(seconds, force)
    timer.daemon = True
    timer.start()
    return timer


#: glibc's `mallopt` parameter for the size from which an allocation gets its own memory map.
M_MMAP_THRESHOLD = -3
LARGE_ALLOCATION_BYTES = 1024 * 1024


def return_large_buffers_to_the_os() -> None:
    """Large answers (a chunk's serialized results, up to the message limit) get their own memory maps, so
    the memory goes back to the system when they are freed: a call ended for a stalled reader leaves
    nothing behind. glibc otherwise raises this threshold to the largest buffer freed (up to 32 MiB) and
    keeps later ones on its heap, where freed memory stays in the process. Not glibc: nothing to do."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, LARGE_ALLOCATION_BYTES)


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit, and return it. Every HTTP and gRPC
    connection, every sandbox's pipes and every worker's take descriptors; the soft limit is often 1,024
    (systemd, many shells) where the hard one is far higher, and running out fails whatever asks next (a
    new client, a sandbox). Workers and sandboxes started later inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, OPEN_FILES_WANTED)
        with contextlib.suppress(ValueError, OSError):  # some platforms refuse RLIM_INFINITY or above nr_open
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


#: How long a thread holding the GIL keeps it while the event loop waits for it (CPython's default: 5 ms).
#: A thread parsing a large HTTP body (http.limits) would otherwise delay each of the loop's steps by up
#: to 5 ms, and a gRPC call takes several: measured, gRPC calls answered during such a parse went from
#: 57-86/s to 180-220/s with this.
GIL_SWITCH_SECONDS = 0.0005

#: The garbage collector's thresholds (CPython's: 700, 10, 10). A collection holds the GIL, so the event
#: loop, throughout, and a full one walks every object not frozen at start-up. At 700 allocations a young
#: collection, a 100k-sample HTTP batch's objects were promoted fast enough to set off full collections of
#: 85-170 ms of CPU one after another (800 ms in all for two such requests); at 10,000 the worst was a
#: 50 ms one (420 ms in all), and the batches were answered twice as fast (`bench --http-stall`).
GC_THRESHOLDS = (10_000, 10, 10)

#: The soft open-files limit asked for when the hard limit is unlimited.
OPEN_FILES_WANTED = 1 << 20


def tune_process() -> int:
    """The start-up settings of a serving process (see each constant); returns its open-files limit."""
    return_large_buffers_to_the_os()
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
    return raise_open_files_limit()


def settle_heap(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> None:
    """Once serving: the start-up's objects (modules, graders, tables) out of every later full collection,
    and the collector's thresholds (`GC_THRESHOLDS`, or a face process's own)."""
    gc.freeze()
    gc.set_threshold(*thresholds)
