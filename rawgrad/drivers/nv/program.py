"""NV programs and launches: `NVProgram` (a kernel image loaded into VRAM), the launch limits and the
registers-per-block rule, and the same-device copy kernel (its PTX and launch contract) that the compute
queue runs for copies, since the compute channel has no copy-engine object.

The device is `hcq.NVHCQDevice` (named here for types only: hcq.py imports this module).
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from rawgrad.compiler.ir import Variable
from rawgrad.compiler.target import LaunchSpec
from rawgrad.drivers.nv.cubin import program_info, relocate
from rawgrad.drivers.nv.device import GPU_VA_LIMIT
from rawgrad.drivers.nv.memory import NVBuffer, round_up
from rawgrad.hcq.program import Program
from rawgrad.hcq.queue import Value

if TYPE_CHECKING:
    from rawgrad.drivers.nv.hcq import NVHCQDevice

__all__ = ["NVProgram"]

# Launch limits (NV-FACTS 5.6): threads per block, block and grid extents per dimension, and what a kernel's
# registers allow: 65536 registers per SM, allocated per warp in units of 256, warps in groups of 4.
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2**31 - 1, 65535, 65535)
SM_REGISTERS = 65536
REGISTER_ALLOC_UNIT = 256
WARP_ALLOC_GRANULE = 4
WARP_THREADS = 32

# An image is loaded with one spare page after it: instruction prefetch may run past the end (NV-FACTS 7.2).
IMAGE_GUARD_BYTES = 0x1000
PAGE = 0x1000

# Same-device copies on the compute channel (which has no copy-engine object): a kernel where thread i
# moves bytes [16 i, 16 i + 16), as one 16-byte load/store when dst, src and the size are 16-byte aligned,
# else byte by byte. Ranges must not overlap (graph copies are between distinct live buffers). It indexes
# by x only: its launches are 1-D, in blocks of COPY_BLOCK_THREADS (its .maxntid and launch contract).
COPY_KERNEL = "rawgrad_copy"
COPY_BYTES_PER_THREAD = 16
COPY_BLOCK_THREADS = 128
COPY_KERNEL_PTX = """.version 7.8
.target {arch}
.address_size 64
.visible .entry rawgrad_copy(.param .u64 dst, .param .u64 src, .param .u64 nbytes)
.maxntid {block}, 1, 1
{{
  .reg .pred %p<3>;
  .reg .b32 %r<7>;
  .reg .b64 %rd<10>;
  ld.param.u64 %rd0, [dst];
  ld.param.u64 %rd1, [src];
  ld.param.u64 %rd2, [nbytes];
  cvta.to.global.u64 %rd0, %rd0;
  cvta.to.global.u64 %rd1, %rd1;
  mov.u32 %r0, %ctaid.x;
  mov.u32 %r1, %ntid.x;
  mov.u32 %r2, %tid.x;
  mul.wide.u32 %rd3, %r0, %r1;
  cvt.u64.u32 %rd4, %r2;
  add.u64 %rd3, %rd3, %rd4;
  shl.b64 %rd5, %rd3, 4;
  setp.ge.u64 %p0, %rd5, %rd2;
  @%p0 bra DONE;
  or.b64 %rd6, %rd0, %rd1;
  or.b64 %rd6, %rd6, %rd2;
  and.b64 %rd6, %rd6, 15;
  setp.ne.u64 %p1, %rd6, 0;
  @%p1 bra BYTES;
  add.u64 %rd7, %rd1, %rd5;
  add.u64 %rd8, %rd0, %rd5;
  ld.global.v4.u32 {{%r3, %r4, %r5, %r6}}, [%rd7];
  st.global.v4.u32 [%rd8], {{%r3, %r4, %r5, %r6}};
  bra DONE;
BYTES:
  add.u64 %rd9, %rd5, 16;
  min.u64 %rd9, %rd9, %rd2;
LOOP:
  add.u64 %rd7, %rd1, %rd5;
  add.u64 %rd8, %rd0, %rd5;
  ld.global.u8 %r3, [%rd7];
  st.global.u8 [%rd8], %r3;
  add.u64 %rd5, %rd5, 1;
  setp.lt.u64 %p2, %rd5, %rd9;
  @%p2 bra LOOP;
DONE:
  ret;
}}
"""


# The copy kernel's byte count, in its launch contract (its global size is an expression of it).
COPY_NBYTES = Variable("nv.copy_nbytes", 0, GPU_VA_LIMIT - 1)


def copy_threads(nbytes: Value) -> Value:
    """Threads of a copy-kernel launch: one per 16 bytes."""
    return (nbytes + (COPY_BYTES_PER_THREAD - 1)) // COPY_BYTES_PER_THREAD


def max_threads_for_registers(registers: int) -> int:
    """The most threads one block may have when each uses `registers` registers (NV-FACTS 5.6)."""
    per_warp = round_up(registers * WARP_THREADS, REGISTER_ALLOC_UNIT)
    warps = SM_REGISTERS // per_warp // WARP_ALLOC_GRANULE * WARP_ALLOC_GRANULE
    return warps * WARP_THREADS


class NVProgram(Program):
    """A kernel image uploaded to VRAM by the copy engine; `fn_addr` is the entry point's GPU VA. Its launch
    contract, when given, is completed with the registers and shared memory the image declares."""

    def __init__(self, device: NVHCQDevice, name: str, lib: bytes, launch: LaunchSpec | None = None) -> None:
        self.info = program_info(bytes(lib), name, device.arch)
        if launch is not None:
            if len(self.info.params) != launch.args:
                raise ValueError(f"{name}: the image takes {len(self.info.params)} parameters, its launch "
                                 f"contract {launch.args}")
            launch = launch.with_resources(shared_bytes=max(launch.shared_bytes, self.info.shared_bytes),
                                           registers=self.info.registers or None)
        super().__init__(device, name, lib, launch)
        if not self.info.has_sass and not device.is_mock:
            raise RuntimeError(f"{name}: the image has no SASS (built without ptxas or nvJitLink, e.g. on "
                               f"the mock); only the mock GPU runs PTX-only images")
        # The file goes to VRAM verbatim (its .text is 128-byte aligned in the file), followed by module
        # data and bank copies, relocated for the address it lands at (cubin.image_layout).
        layout = self.info.layout
        with device.submit_lock:  # the driver's memory bookkeeping is not thread-safe: one caller at a time
            self.image = device.nv.alloc_vram(round_up(layout.size, PAGE) + IMAGE_GUARD_BYTES, cpu_map=False)
            try:
                device.copy_in(self.image.va, memoryview(relocate(bytes(lib), layout, self.image.va)))
            except BaseException:
                device.nv.free(self.image)
                raise
        self.fn_addr: int = self.image.va + self.info.text_offset
        if self.info.local_bytes > device.slm_per_thread:  # this kernel spills or keeps a stack
            device.grow_local_memory(self.info.local_bytes)
        self.constant_banks = tuple((index, self.image.va + off, size)
                                    for index, off, size in self.info.constant_banks)
        weakref.finalize(self, _free_image, weakref.ref(device), self.image)


def _free_image(dev_ref: weakref.ref[NVHCQDevice], buf: NVBuffer) -> None:
    dev = dev_ref()
    if dev is not None:  # freed once the launches queued so far (which may fetch this code) are done
        dev.defer_free_after_timeline(buf)
