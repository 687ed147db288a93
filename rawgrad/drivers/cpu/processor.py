"""The native command processor of the CPU device, generated as LLVM IR.

Thread 0 is the front end: it reads records from the ring in order and executes them; for EXEC and
large COPY records it publishes a parallel job cut into T equal shares of [0, n). Every thread (the front
end included) claims shares with a compare-and-swap until none is left, and the front end waits at a
barrier (an atomic count of finished shares) before the next record. A worker that is slow to wake only
means the front end runs its share. Only the front end reads the ring, so its read index is exactly what
the host may overwrite.

Sleeping: the front end spins a little on an empty ring (FRONTEND_SPIN_NS, on the clock), then registers as
asleep and futex-waits on the write index; `rg_doorbell` (called by the host after writing records)
publishes the new write index and wakes it only when it is registered. Workers do the same on the job
generation counter. The host waits for a signal with `rg_host_wait`: it spins HOST_SPIN_NS, then counts
itself in HOST_WAITERS and futex-waits on the signal's value word; a SIGNAL record stores the value and
wakes that word when a host waiter is counted; the front end wakes the read index word the same way after
each record it retires (a host waits on it before patching a bound block whose last run is still queued).
Both sides of each handshake use sequentially consistent accesses (store the flag/index/value, then load the
other), so a wake-up cannot be lost; every futex wait still has a timeout as a second line of defence.
"""
from __future__ import annotations

import platform
from string import Template

from rawgrad.drivers.cpu.records import CTX, RECORD_BYTES, Op

__all__ = ["DOORBELL_SYMBOL", "HOST_WAIT_SYMBOL", "THREAD_ENTRY_SYMBOL", "processor_ir"]

THREAD_ENTRY_SYMBOL = "rg_thread_main"
DOORBELL_SYMBOL = "rg_doorbell"
HOST_WAIT_SYMBOL = "rg_host_wait"

# futex(2) syscall numbers (asm/unistd_64.h on x86-64, asm-generic/unistd.h on aarch64).
SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}
# linux/futex.h: FUTEX_WAIT = 0, FUTEX_WAKE = 1, FUTEX_PRIVATE_FLAG = 128 (waiters are in this process).
FUTEX_WAIT_PRIVATE = 128
FUTEX_WAKE_PRIVATE = 129
# Wake every waiter (INT_MAX, as futex(2) suggests).
FUTEX_WAKE_ALL = 2**31 - 1
# A futex sleep wakes after this long even without a wake-up (a safety net, not the normal path).
FUTEX_TIMEOUT_NS = 50_000_000
# linux/time.h CLOCK_MONOTONIC: the same clock Python's time.monotonic_ns reads.
CLOCK_MONOTONIC = 1
NS_PER_S = 1_000_000_000
# How long an idle front end and idle workers spin before they sleep, measured on the clock (an iteration
# count would mean ~40 us on one CPU and ~400 us on another: a CPU-relax hint costs 10-140 cycles). Long
# enough to catch the next submission of a host that submits back to back (a TinyJit replay loop, an eager
# loop: tens of us of Python apart), short enough that an idle device stops competing for the cores soon
# (on a busy machine every spinning thread is one more runnable thread).
FRONTEND_SPIN_NS = 100_000
WORKER_SPIN_NS = 50_000
# A host waiting on a signal (`rg_host_wait`) spins this long before it sleeps on the signal's futex word
# (a SIGNAL record wakes it): a small kernel finishes within it, and the sleep costs a wake-up otherwise.
HOST_SPIN_NS = 30_000
# While spinning, every this many CPU-relax hints (~1-3 us) the spinner reads the clock (a vDSO read, ~20
# ns) and yields the core (sched_yield, ~1 us when nothing else wants it). The yield is what keeps a spin
# cheap on a busy machine: a thread woken onto the core of the host (or of the front end) would otherwise
# spin there for its whole budget while the thread it waits for cannot run (issue 21: 50 us per doorbell
# on a loaded 2-core machine, the woken front end spinning on the host's core).
SPIN_CLOCK_EVERY = 64
# Spin iterations (each one CPU-relax hint) of a WAIT record before it naps, and of the barrier before it
# yields: a WAIT long enough for a short kernel on another device, the barrier for balanced shares.
WAIT_SPINS = 4096
BARRIER_SPINS = 4096
# A WAIT record sleeps between polls, doubling from the first nap up to the cap: the cap bounds both
# the wake-up latency and the cost of a device idling on a signal nobody writes.
WAIT_NAP_START_NS = 10_000
WAIT_NAP_CAP_NS = 1_000_000
# COPY records are split across the workers in chunks of this many bytes (large enough that a chunk
# costs far more than the split, small enough that a few MiB spread over all cores).
COPY_CHUNK_BYTES = 256 * 1024
# Bits of a futex word (the kernel compares 32-bit values).
FUTEX_WORD_MASK = 0xFFFFFFFF

# The CPU-relax hint per architecture: x86 PAUSE, aarch64 YIELD (hint #1).
_RELAX = {
    "x86_64": ("declare void @llvm.x86.sse2.pause()", "call void @llvm.x86.sse2.pause()"),
    "aarch64": ("declare void @llvm.aarch64.hint(i32)", "call void @llvm.aarch64.hint(i32 1)"),
}
_MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}

_IR = Template(r"""
declare i64 @syscall(i64, ...)
declare i32 @sched_yield()
declare i32 @nanosleep(ptr, ptr)
declare i32 @clock_gettime(i32, ptr)
declare void @llvm.memmove.p0.p0.i64(ptr, ptr, i64, i1)
$RELAX_DECL

define internal void @relax() {
  $RELAX_CALL
  ret void
}

define internal void @futex_wait(ptr %addr, i64 %expected) {
  call void @futex_wait_ns(ptr %addr, i64 %expected, i64 $FUTEX_TIMEOUT_NS)
  ret void
}

; futex-wait on the low 32 bits of *addr while they equal those of %expected, at most %ns (< 1 s)
define internal void @futex_wait_ns(ptr %addr, i64 %expected, i64 %ns) {
  %ts = alloca [2 x i64], align 8
  store i64 0, ptr %ts, align 8
  %nsp = getelementptr inbounds i64, ptr %ts, i64 1
  store i64 %ns, ptr %nsp, align 8
  %lo = and i64 %expected, $FUTEX_WORD_MASK
  %r = call i64 (i64, ...) @syscall(i64 $SYS_FUTEX, ptr %addr, i64 $FUTEX_WAIT_PRIVATE, i64 %lo, ptr %ts)
  ret void
}

; Spin (CPU-relax hints) until *addr differs from %old or %spin_ns have passed; returns the last value read.
define internal i64 @spin_until_change(ptr %addr, i64 %old, i64 %spin_ns) {
entry:
  %t0 = call i64 @now_ns()
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %relaxed], [%i1, %clock]
  %v = load atomic i64, ptr %addr acquire, align 8
  %ch = icmp ne i64 %v, %old
  br i1 %ch, label %done, label %spin
spin:
  call void @relax()
  %i1 = add i64 %i, 1
  %m = and i64 %i1, $SPIN_CLOCK_MASK
  %chk = icmp eq i64 %m, 0
  br i1 %chk, label %clock, label %relaxed
relaxed:
  br label %loop
clock:
  %yy = call i32 @sched_yield()
  %t = call i64 @now_ns()
  %el = sub i64 %t, %t0
  %over = icmp uge i64 %el, %spin_ns
  br i1 %over, label %done, label %loop
done:
  ret i64 %v
}

define internal void @futex_wake(ptr %addr, i64 %count) {
  %r = call i64 (i64, ...) @syscall(i64 $SYS_FUTEX, ptr %addr, i64 $FUTEX_WAKE_PRIVATE, i64 %count)
  ret void
}

define internal void @sleep_ns(i64 %ns) {
  %ts = alloca [2 x i64], align 8
  %sec = udiv i64 %ns, $NS_PER_S
  %nsec = urem i64 %ns, $NS_PER_S
  store i64 %sec, ptr %ts, align 8
  %nsp = getelementptr inbounds i64, ptr %ts, i64 1
  store i64 %nsec, ptr %nsp, align 8
  %r = call i32 @nanosleep(ptr %ts, ptr null)
  ret void
}

define internal i64 @now_ns() {
  %ts = alloca [2 x i64], align 8
  %r = call i32 @clock_gettime(i32 $CLOCK_MONOTONIC, ptr %ts)
  %sec = load i64, ptr %ts, align 8
  %nsp = getelementptr inbounds i64, ptr %ts, i64 1
  %nsec = load i64, ptr %nsp, align 8
  %s = mul i64 %sec, $NS_PER_S
  %t = add i64 %s, %nsec
  ret i64 %t
}

define internal void @wait_value(ptr %ctx, ptr %sig, i64 %value) {
entry:
  %stopp = getelementptr inbounds i64, ptr %ctx, i64 $STOP
  br label %loop
loop:
  %spins = phi i64 [0, %entry], [%spins1, %spin], [%spins, %nap]
  %napns = phi i64 [$WAIT_NAP_START_NS, %entry], [%napns, %spin], [%napnext, %nap]
  %cur = load atomic i64, ptr %sig acquire, align 8
  %ok = icmp uge i64 %cur, %value
  br i1 %ok, label %done, label %check
check:
  %stop = load atomic i64, ptr %stopp monotonic, align 8
  %st = icmp ne i64 %stop, 0
  br i1 %st, label %done, label %choose
choose:
  %more = icmp ult i64 %spins, $WAIT_SPINS
  br i1 %more, label %spin, label %nap
spin:
  call void @relax()
  %spins1 = add i64 %spins, 1
  br label %loop
nap:
  call void @sleep_ns(i64 %napns)
  %dbl = shl i64 %napns, 1
  %big = icmp ugt i64 %dbl, $WAIT_NAP_CAP_NS
  %napnext = select i1 %big, i64 $WAIT_NAP_CAP_NS, i64 %dbl
  br label %loop
done:
  ret void
}

define internal void @copy_kernel(ptr %args, i64 %start, i64 %end) {
  %dst = load i64, ptr %args, align 8
  %srcp = getelementptr inbounds i64, ptr %args, i64 1
  %src = load i64, ptr %srcp, align 8
  %np = getelementptr inbounds i64, ptr %args, i64 2
  %n = load i64, ptr %np, align 8
  %lo = mul i64 %start, $COPY_CHUNK_BYTES
  %hi0 = mul i64 %end, $COPY_CHUNK_BYTES
  %over = icmp ugt i64 %hi0, %n
  %hi = select i1 %over, i64 %n, i64 %hi0
  %len = sub i64 %hi, %lo
  %d = add i64 %dst, %lo
  %dp = inttoptr i64 %d to ptr
  %s = add i64 %src, %lo
  %sp = inttoptr i64 %s to ptr
  call void @llvm.memmove.p0.p0.i64(ptr %dp, ptr %sp, i64 %len, i1 false)
  ret void
}

; Claim shares of job `gen` one at a time (compare-and-swap on JOB_CLAIM) and run them until none is
; left or the job is no longer `gen`. Any thread may run any share, so a worker that is slow to wake (or
; descheduled on a busy machine) does not hold the launch up: the front end takes its share instead.
define internal void @participate(ptr %ctx, ptr %fn, ptr %args, i64 %n, i64 %shares, i64 %gen) {
entry:
  %claimp = getelementptr inbounds i64, ptr %ctx, i64 $JOB_CLAIM
  %donep = getelementptr inbounds i64, ptr %ctx, i64 $JOBS_DONE
  %mygen = and i64 %gen, $FUTEX_WORD_MASK
  br label %claim
claim:
  %c = load atomic i64, ptr %claimp acquire, align 8
  %cgen = lshr i64 %c, 32
  %same = icmp eq i64 %cgen, %mygen
  br i1 %same, label %check, label %done
check:
  %s = and i64 %c, $FUTEX_WORD_MASK
  %left = icmp ult i64 %s, %shares
  br i1 %left, label %cas, label %done
cas:
  %c1 = add i64 %c, 1
  %pair = cmpxchg ptr %claimp, i64 %c, i64 %c1 acq_rel acquire
  %won = extractvalue { i64, i1 } %pair, 1
  br i1 %won, label %run, label %claim
run:
  %a = mul i64 %n, %s
  %start = udiv i64 %a, %shares
  %s1 = add i64 %s, 1
  %b = mul i64 %n, %s1
  %end = udiv i64 %b, %shares
  %has = icmp ult i64 %start, %end
  br i1 %has, label %call, label %finish
call:
  call void %fn(ptr %args, i64 %start, i64 %end)
  br label %finish
finish:
  %z = atomicrmw add ptr %donep, i64 1 release
  br label %claim
done:
  ret void
}

define internal void @run_parallel(ptr %ctx, ptr %fn, ptr %args, i64 %n) {
entry:
  %tp = getelementptr inbounds i64, ptr %ctx, i64 $THREADS
  %T = load i64, ptr %tp, align 8
  %one = icmp ule i64 %T, 1
  %tiny = icmp ule i64 %n, 1
  %solo = or i1 %one, %tiny
  br i1 %solo, label %inline, label %fanout
inline:
  %empty = icmp eq i64 %n, 0
  br i1 %empty, label %done, label %callall
callall:
  call void %fn(ptr %args, i64 0, i64 %n)
  br label %done
fanout:
  %fnp = getelementptr inbounds i64, ptr %ctx, i64 $JOB_FN
  store ptr %fn, ptr %fnp, align 8
  %argsp = getelementptr inbounds i64, ptr %ctx, i64 $JOB_ARGS
  store ptr %args, ptr %argsp, align 8
  %np = getelementptr inbounds i64, ptr %ctx, i64 $JOB_N
  store i64 %n, ptr %np, align 8
  %donep = getelementptr inbounds i64, ptr %ctx, i64 $JOBS_DONE
  store atomic i64 0, ptr %donep monotonic, align 8
  %genp = getelementptr inbounds i64, ptr %ctx, i64 $JOB_GENERATION
  %oldgen = load atomic i64, ptr %genp monotonic, align 8
  %gen = add i64 %oldgen, 1
  %gen32 = and i64 %gen, $FUTEX_WORD_MASK
  %claim0 = shl i64 %gen32, 32
  %claimp = getelementptr inbounds i64, ptr %ctx, i64 $JOB_CLAIM
  store atomic i64 %claim0, ptr %claimp release, align 8
  store atomic i64 %gen, ptr %genp seq_cst, align 8
  %sleepp = getelementptr inbounds i64, ptr %ctx, i64 $WORKERS_SLEEPING
  %sl = load atomic i64, ptr %sleepp seq_cst, align 8
  %any = icmp ne i64 %sl, 0
  br i1 %any, label %wake, label %own
wake:
  call void @futex_wake(ptr %genp, i64 $FUTEX_WAKE_ALL)
  br label %own
own:
  call void @participate(ptr %ctx, ptr %fn, ptr %args, i64 %n, i64 %T, i64 %gen)
  br label %bloop
bloop:
  %spins = phi i64 [0, %own], [%spins1, %bspin], [%spins, %byield]
  %d = load atomic i64, ptr %donep acquire, align 8
  %all = icmp eq i64 %d, %T
  br i1 %all, label %done, label %bwait
bwait:
  %more = icmp ult i64 %spins, $BARRIER_SPINS
  br i1 %more, label %bspin, label %byield
bspin:
  call void @relax()
  %spins1 = add i64 %spins, 1
  br label %bloop
byield:
  %y = call i32 @sched_yield()
  br label %bloop
done:
  ret void
}

define internal void @worker_loop(ptr %ctx, i64 %tid) {
entry:
  %genp = getelementptr inbounds i64, ptr %ctx, i64 $JOB_GENERATION
  %sleepp = getelementptr inbounds i64, ptr %ctx, i64 $WORKERS_SLEEPING
  %stopp = getelementptr inbounds i64, ptr %ctx, i64 $STOP
  %fnp = getelementptr inbounds i64, ptr %ctx, i64 $JOB_FN
  %argsp = getelementptr inbounds i64, ptr %ctx, i64 $JOB_ARGS
  %np = getelementptr inbounds i64, ptr %ctx, i64 $JOB_N
  %tp = getelementptr inbounds i64, ptr %ctx, i64 $THREADS
  br label %wait
wait:
  ; the generation starts at 0 in the fresh control block: starting from 0 rather than from a load
  ; means a job published before this thread got scheduled is still seen as new
  %seen = phi i64 [0, %entry], [%seen, %spin], [%seen, %slept], [%g, %finish]
  %spun = phi i64 [0, %entry], [1, %spin], [1, %slept], [0, %finish]
  %g = load atomic i64, ptr %genp acquire, align 8
  %new = icmp ne i64 %g, %seen
  br i1 %new, label %job, label %idle
idle:
  %stop = load atomic i64, ptr %stopp monotonic, align 8
  %st = icmp ne i64 %stop, 0
  br i1 %st, label %exit, label %idle2
idle2:
  %more = icmp eq i64 %spun, 0
  br i1 %more, label %spin, label %sleep
spin:
  %sv = call i64 @spin_until_change(ptr %genp, i64 %seen, i64 $WORKER_SPIN_NS)
  br label %wait
sleep:
  %x = atomicrmw add ptr %sleepp, i64 1 seq_cst
  %g2 = load atomic i64, ptr %genp seq_cst, align 8
  %same = icmp eq i64 %g2, %seen
  br i1 %same, label %dosleep, label %slept
dosleep:
  call void @futex_wait(ptr %genp, i64 %seen)
  br label %slept
slept:
  %y = atomicrmw sub ptr %sleepp, i64 1 seq_cst
  br label %wait
job:
  %fn = load ptr, ptr %fnp, align 8
  %args = load ptr, ptr %argsp, align 8
  %n = load i64, ptr %np, align 8
  %T = load i64, ptr %tp, align 8
  call void @participate(ptr %ctx, ptr %fn, ptr %args, i64 %n, i64 %T, i64 %g)
  br label %finish
finish:
  br label %wait
exit:
  ret void
}

define internal void @run_block(ptr %ctx, ptr %blk, i64 %count) {
entry:
  %stopp = getelementptr inbounds i64, ptr %ctx, i64 $STOP
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i2, %body]
  %more = icmp ult i64 %i, %count
  br i1 %more, label %check, label %done
check:
  %stop = load atomic i64, ptr %stopp monotonic, align 8
  %st = icmp ne i64 %stop, 0
  br i1 %st, label %done, label %body
body:
  %off = mul i64 %i, $RECORD_BYTES
  %rec = getelementptr inbounds i8, ptr %blk, i64 %off
  %n = call i64 @exec_record(ptr %ctx, ptr %rec)
  %i2 = add i64 %i, %n
  br label %loop
done:
  ret void
}

define internal i64 @exec_record(ptr %ctx, ptr %rec) {
entry:
  %op = load i64, ptr %rec, align 8
  %p1 = getelementptr inbounds i64, ptr %rec, i64 1
  %a1 = load i64, ptr %p1, align 8
  %p2 = getelementptr inbounds i64, ptr %rec, i64 2
  %a2 = load i64, ptr %p2, align 8
  %p3 = getelementptr inbounds i64, ptr %rec, i64 3
  %a3 = load i64, ptr %p3, align 8
  %p4 = getelementptr inbounds i64, ptr %rec, i64 4
  %a4 = load i64, ptr %p4, align 8
  %x1 = inttoptr i64 %a1 to ptr
  %x2 = inttoptr i64 %a2 to ptr
  switch i64 %op, label %bad [
    i64 $OP_NOP, label %nop
    i64 $OP_EXEC, label %exec
    i64 $OP_WAIT, label %wait
    i64 $OP_SIGNAL, label %signal
    i64 $OP_TIMESTAMP, label %timestamp
    i64 $OP_COPY, label %copy
    i64 $OP_MEMORY_BARRIER, label %barrier
    i64 $OP_RUN_BLOCK, label %block
    i64 $OP_QUIT, label %quit
  ]
nop:
  ret i64 1
exec:
  ; a 3-D global size (x in word 2, y and z in words 5 and 6) runs as one linear range, x fastest
  %p5 = getelementptr inbounds i64, ptr %rec, i64 5
  %gy = load i64, ptr %p5, align 8
  %p6 = getelementptr inbounds i64, ptr %rec, i64 6
  %gz = load i64, ptr %p6, align 8
  %gxy = mul i64 %a2, %gy
  %gxyz = mul i64 %gxy, %gz
  %args = getelementptr inbounds i8, ptr %rec, i64 $RECORD_BYTES
  call void @run_parallel(ptr %ctx, ptr %x1, ptr %args, i64 %gxyz)
  %cnt = add i64 %a4, 1
  ret i64 %cnt
wait:
  call void @wait_value(ptr %ctx, ptr %x1, i64 %a2)
  ret i64 1
signal:
  store atomic i64 %a2, ptr %x1 seq_cst, align 8
  %hwp = getelementptr inbounds i64, ptr %ctx, i64 $HOST_WAITERS
  %hw = load atomic i64, ptr %hwp seq_cst, align 8
  %hwany = icmp ne i64 %hw, 0
  br i1 %hwany, label %signalwake, label %signaldone
signalwake:
  call void @futex_wake(ptr %x1, i64 $FUTEX_WAKE_ALL)
  br label %signaldone
signaldone:
  ret i64 1
timestamp:
  %t = call i64 @now_ns()
  store atomic i64 %t, ptr %x1 release, align 8
  ret i64 1
copy:
  %d1 = sub i64 %a1, %a2
  %o1 = icmp ult i64 %d1, %a3
  %d2 = sub i64 %a2, %a1
  %o2 = icmp ult i64 %d2, %a3
  %ov = or i1 %o1, %o2
  br i1 %ov, label %copyserial, label %copypar
copyserial:
  call void @llvm.memmove.p0.p0.i64(ptr %x1, ptr %x2, i64 %a3, i1 false)
  ret i64 1
copypar:
  %nc0 = add i64 %a3, $COPY_CHUNK_LESS_ONE
  %nc = udiv i64 %nc0, $COPY_CHUNK_BYTES
  call void @run_parallel(ptr %ctx, ptr @copy_kernel, ptr %p1, i64 %nc)
  ret i64 1
barrier:
  fence seq_cst
  ret i64 1
block:
  call void @run_block(ptr %ctx, ptr %x1, i64 %a2)
  ret i64 1
quit:
  %qp = getelementptr inbounds i64, ptr %ctx, i64 $STOP
  store atomic i64 1, ptr %qp seq_cst, align 8
  ret i64 1
bad:
  %fp = getelementptr inbounds i64, ptr %ctx, i64 $FAULT
  store atomic i64 %op, ptr %fp seq_cst, align 8
  ret i64 1
}

define internal void @frontend_loop(ptr %ctx) {
entry:
  %wp = getelementptr inbounds i64, ptr %ctx, i64 $WRITE_INDEX
  %fsp = getelementptr inbounds i64, ptr %ctx, i64 $FRONTEND_SLEEPING
  %rp = getelementptr inbounds i64, ptr %ctx, i64 $READ_INDEX
  %stopp = getelementptr inbounds i64, ptr %ctx, i64 $STOP
  %ringp = getelementptr inbounds i64, ptr %ctx, i64 $RING
  %ring = load ptr, ptr %ringp, align 8
  %maskp = getelementptr inbounds i64, ptr %ctx, i64 $RING_MASK
  %mask = load i64, ptr %maskp, align 8
  %r0 = load atomic i64, ptr %rp acquire, align 8
  br label %loop
loop:
  %r = phi i64 [%r0, %entry], [%r, %spin], [%r, %slept], [%r2, %work], [%r2, %retirewake]
  %spun = phi i64 [0, %entry], [1, %spin], [1, %slept], [0, %work], [0, %retirewake]
  %stop = load atomic i64, ptr %stopp acquire, align 8
  %st = icmp ne i64 %stop, 0
  br i1 %st, label %exit, label %poll
poll:
  %w = load atomic i64, ptr %wp acquire, align 8
  %empty = icmp eq i64 %w, %r
  br i1 %empty, label %idle, label %work
idle:
  %more = icmp eq i64 %spun, 0
  br i1 %more, label %spin, label %sleep
spin:
  %sw = call i64 @spin_until_change(ptr %wp, i64 %r, i64 $FRONTEND_SPIN_NS)
  br label %loop
sleep:
  store atomic i64 1, ptr %fsp seq_cst, align 8
  %w2 = load atomic i64, ptr %wp seq_cst, align 8
  %same = icmp eq i64 %w2, %r
  br i1 %same, label %dosleep, label %slept
dosleep:
  call void @futex_wait(ptr %wp, i64 %r)
  br label %slept
slept:
  store atomic i64 0, ptr %fsp seq_cst, align 8
  br label %loop
work:
  %slot = and i64 %r, %mask
  %off = mul i64 %slot, $RECORD_BYTES
  %rec = getelementptr inbounds i8, ptr %ring, i64 %off
  %cnt = call i64 @exec_record(ptr %ctx, ptr %rec)
  %r2 = add i64 %r, %cnt
  store atomic i64 %r2, ptr %rp seq_cst, align 8
  %rhwp = getelementptr inbounds i64, ptr %ctx, i64 $HOST_WAITERS
  %rhw = load atomic i64, ptr %rhwp seq_cst, align 8
  %rhwany = icmp ne i64 %rhw, 0
  br i1 %rhwany, label %retirewake, label %loop
retirewake:
  ; a host may be asleep on the read index (a bound block's previous run must retire before it is patched)
  call void @futex_wake(ptr %rp, i64 $FUTEX_WAKE_ALL)
  br label %loop
exit:
  ; an empty job wakes every worker so it sees STOP even if it is about to sleep
  %np = getelementptr inbounds i64, ptr %ctx, i64 $JOB_N
  store i64 0, ptr %np, align 8
  %genp = getelementptr inbounds i64, ptr %ctx, i64 $JOB_GENERATION
  %g = atomicrmw add ptr %genp, i64 1 seq_cst
  call void @futex_wake(ptr %genp, i64 $FUTEX_WAKE_ALL)
  ret void
}

define ptr @$THREAD_ENTRY(ptr %warg) {
entry:
  %ctx = load ptr, ptr %warg, align 8
  %tidp = getelementptr inbounds i64, ptr %warg, i64 1
  %tid = load i64, ptr %tidp, align 8
  %fe = icmp eq i64 %tid, 0
  br i1 %fe, label %front, label %worker
front:
  call void @frontend_loop(ptr %ctx)
  ret ptr null
worker:
  call void @worker_loop(ptr %ctx, i64 %tid)
  ret ptr null
}

; The host's wait for *sig >= value: spin HOST_SPIN_NS, then sleep on the value's futex word (counted in
; HOST_WAITERS, so a SIGNAL record wakes it) in slices, until the value is reached (returns 1) or
; %timeout_ns have passed (returns 0). Called without the GIL (cffi releases it around the call).
define i64 @$HOST_WAIT(ptr %ctx, ptr %sig, i64 %value, i64 %timeout_ns) {
entry:
  %t0 = call i64 @now_ns()
  %spinbudget = icmp ult i64 %timeout_ns, $HOST_SPIN_NS
  %spinns = select i1 %spinbudget, i64 %timeout_ns, i64 $HOST_SPIN_NS
  br label %spin
spin:
  %i = phi i64 [0, %entry], [%i1, %spinnext], [%i1, %spinclock]
  %c = load atomic i64, ptr %sig acquire, align 8
  %ok = icmp uge i64 %c, %value
  br i1 %ok, label %reached, label %spinrelax
spinrelax:
  call void @relax()
  %i1 = add i64 %i, 1
  %m = and i64 %i1, $SPIN_CLOCK_MASK
  %chk = icmp eq i64 %m, 0
  br i1 %chk, label %spinclock, label %spinnext
spinnext:
  br label %spin
spinclock:
  %yy = call i32 @sched_yield()
  %ts = call i64 @now_ns()
  %els = sub i64 %ts, %t0
  %spent = icmp uge i64 %els, %spinns
  br i1 %spent, label %block, label %spin
block:
  %hwp = getelementptr inbounds i64, ptr %ctx, i64 $HOST_WAITERS
  %x = atomicrmw add ptr %hwp, i64 1 seq_cst
  br label %bloop
bloop:
  %cb = load atomic i64, ptr %sig seq_cst, align 8
  %okb = icmp uge i64 %cb, %value
  br i1 %okb, label %leave1, label %btime
btime:
  %tb = call i64 @now_ns()
  %elb = sub i64 %tb, %t0
  %late = icmp uge i64 %elb, %timeout_ns
  br i1 %late, label %leave0, label %bsleep
bsleep:
  %rem = sub i64 %timeout_ns, %elb
  %big = icmp ugt i64 %rem, $FUTEX_TIMEOUT_NS
  %slice = select i1 %big, i64 $FUTEX_TIMEOUT_NS, i64 %rem
  call void @futex_wait_ns(ptr %sig, i64 %cb, i64 %slice)
  br label %bloop
leave1:
  %y1 = atomicrmw sub ptr %hwp, i64 1 seq_cst
  br label %reached
leave0:
  %y0 = atomicrmw sub ptr %hwp, i64 1 seq_cst
  ret i64 0
reached:
  ret i64 1
}

define void @$DOORBELL(ptr %ctx, i64 %w) {
entry:
  %wp = getelementptr inbounds i64, ptr %ctx, i64 $WRITE_INDEX
  store atomic i64 %w, ptr %wp seq_cst, align 8
  %fsp = getelementptr inbounds i64, ptr %ctx, i64 $FRONTEND_SLEEPING
  %s = load atomic i64, ptr %fsp seq_cst, align 8
  %asleep = icmp ne i64 %s, 0
  br i1 %asleep, label %wake, label %done
wake:
  call void @futex_wake(ptr %wp, i64 1)
  br label %done
done:
  ret void
}
""")


def host_machine() -> str:
    m = platform.machine().lower()
    return _MACHINE_ALIASES.get(m, m)


def processor_ir(machine: str | None = None) -> str:
    """The LLVM IR text of the command processor for `machine` (default: this host)."""
    machine = machine or host_machine()
    if machine not in SYS_FUTEX:
        raise RuntimeError(f"the CPU command processor does not know the futex syscall on {machine!r}")
    relax_decl, relax_call = _RELAX.get(machine, ("", ""))
    ctx_words = {k: v for k, v in vars(CTX).items() if k.isupper()}
    ops = {f"OP_{op.name}": int(op) for op in Op}
    return _IR.substitute(
        RELAX_DECL=relax_decl, RELAX_CALL=relax_call, SYS_FUTEX=SYS_FUTEX[machine],
        FUTEX_WAIT_PRIVATE=FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE=FUTEX_WAKE_PRIVATE,
        FUTEX_WAKE_ALL=FUTEX_WAKE_ALL, FUTEX_TIMEOUT_NS=FUTEX_TIMEOUT_NS, FUTEX_WORD_MASK=FUTEX_WORD_MASK,
        CLOCK_MONOTONIC=CLOCK_MONOTONIC, NS_PER_S=NS_PER_S, FRONTEND_SPIN_NS=FRONTEND_SPIN_NS,
        WORKER_SPIN_NS=WORKER_SPIN_NS, HOST_SPIN_NS=HOST_SPIN_NS, SPIN_CLOCK_MASK=SPIN_CLOCK_EVERY - 1,
        HOST_WAIT=HOST_WAIT_SYMBOL, WAIT_SPINS=WAIT_SPINS, BARRIER_SPINS=BARRIER_SPINS,
        WAIT_NAP_START_NS=WAIT_NAP_START_NS, WAIT_NAP_CAP_NS=WAIT_NAP_CAP_NS,
        COPY_CHUNK_BYTES=COPY_CHUNK_BYTES, COPY_CHUNK_LESS_ONE=COPY_CHUNK_BYTES - 1,
        RECORD_BYTES=RECORD_BYTES, THREAD_ENTRY=THREAD_ENTRY_SYMBOL, DOORBELL=DOORBELL_SYMBOL,
        **ctx_words, **ops)
