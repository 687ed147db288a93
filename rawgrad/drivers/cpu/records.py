"""The CPU command record format and the layout of the processor's shared control block.

Every command is one or more 64-byte records of eight little-endian uint64 words:

    word 0      opcode
    words 1..7  operands (unused ones are zero)

| opcode | operands | meaning |
|---|---|---|
| NOP | - | nothing (also pads the ring so a multi-record command never wraps) |
| EXEC | fn, x, nargs, narg_records, y, z | run `fn(args, start, end)` over [0, x*y*z) (the 3-D global size |
| | | as one linear range, x fastest) split across the workers; the argument words follow in |
| | | the next `narg_records` records, `args` points at them |
| WAIT | signal address, value | stall until `*signal >= value` (unsigned) |
| SIGNAL | signal address, value | store-release `value` after all prior work |
| TIMESTAMP | slot address | store CLOCK_MONOTONIC in ns |
| COPY | dst, src, nbytes | memmove; split across the workers in chunks when the ranges do not overlap |
| MEMORY_BARRIER | - | a full fence |
| RUN_BLOCK | block address, record count | run the records of a bound block, then go on with the ring |
| QUIT | - | stop the workers |
"""
from __future__ import annotations

from enum import IntEnum

__all__ = ["CTX", "CTX_BYTES", "Op", "RECORD_BYTES", "RECORD_WORDS", "WORKER_ARG_WORDS"]

# A record is one cache line: eight 64-bit words.
RECORD_WORDS = 8
RECORD_BYTES = RECORD_WORDS * 8


class Op(IntEnum):
    """Record opcodes; NOP is zero so zeroed memory reads as padding."""

    NOP = 0
    EXEC = 1
    WAIT = 2
    SIGNAL = 3
    TIMESTAMP = 4
    COPY = 5
    MEMORY_BARRIER = 6
    RUN_BLOCK = 7
    QUIT = 8


# Word offsets into the control block shared by the host and the workers. Fields written by different
# parties sit on different 64-byte cache lines (multiples of 8 words) so they do not false-share.
class CTX:
    WRITE_INDEX = 0  # records the host has published (host writes; futex word of the front end)
    FRONTEND_SLEEPING = 1  # non-zero while the front end sleeps on WRITE_INDEX
    HOST_WAITERS = 2  # host threads asleep on a signal's value word (a SIGNAL record then wakes it)
    READ_INDEX = 8  # records the front end has retired (front end writes)
    JOB_GENERATION = 16  # bumped for every parallel job (futex word of the workers)
    WORKERS_SLEEPING = 17  # workers asleep on JOB_GENERATION
    JOB_FN = 24  # the parallel job: kernel entry point, its args pointer and its item count
    JOB_ARGS = 25
    JOB_N = 26
    JOBS_DONE = 32  # shares of the current job that have finished
    JOB_CLAIM = 56  # (job generation low 32 bits << 32) | next unclaimed share: claimed by CAS
    STOP = 40  # non-zero: every thread leaves its loop
    FAULT = 41  # non-zero: the opcode of a record the front end did not understand
    RING = 48  # configuration written once before the threads start: ring address,
    RING_MASK = 49  # ring capacity in records minus one (capacity is a power of two),
    THREADS = 50  # and the number of worker threads including the front end
    WORKER_ARGS = 64  # per thread: (control block address, thread index)


# Words per thread in the WORKER_ARGS table.
WORKER_ARG_WORDS = 2
# Threads the control block has room for; CPU_THREADS beyond this is refused.
MAX_THREADS = 256
CTX_BYTES = (CTX.WORKER_ARGS + WORKER_ARG_WORDS * MAX_THREADS) * 8
