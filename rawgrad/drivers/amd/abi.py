"""AMD KFD (``/dev/kfd``) user ABI: cffi declarations, ioctl numbers, flags, typed argument builders.

Every structure is one the AMD driver sends to amdkfd. Layouts are Linux ``include/uapi/linux/kfd_ioctl.h``
as of KFD 1.11 (Debian linux-libc-dev); the one struct that grew since (CREATE_QUEUE, 96 bytes in 1.17 with
``sdma_engine_id``) is sent in its 1.11 form: amdkfd copies ``_IOC_SIZE(cmd)`` bytes from the caller and
zero-fills up to its own size (``kfd_chardev.c::kfd_ioctl``), so the short form is valid on every newer
kernel (AMD-METAL-FACTS 1.2, finding 4). Sizes and the offsets other code relies on are asserted at import
against ``LAYOUTS`` (numbers computed with gcc from the header, AMD-METAL-FACTS 1.2), so a layout slip fails
loudly instead of becoming a misread ioctl. Request numbers are computed with the ``_IOC`` encoding, never
pasted; tests compare them with the facts file.

Builders return a :class:`KFDCall` (request + argument struct + anything the struct points at, kept alive
together); the driver runs ``os.ioctl(kfd_fd, call.request, call.args)`` and decodes with the matching
``decode_*`` helper. Bad arguments raise ``ValueError`` naming the field before any ioctl is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cffi

from rawgrad.drivers.ioctl import IOC_NONE as IOC_NONE
from rawgrad.drivers.ioctl import IOC_READ as IOC_READ
from rawgrad.drivers.ioctl import IOC_WRITE as IOC_WRITE
from rawgrad.drivers.ioctl import ioc as ioc
from rawgrad.drivers.ioctl import ioc_dir as ioc_dir
from rawgrad.drivers.ioctl import ioc_nr as ioc_nr
from rawgrad.drivers.ioctl import ioc_size as ioc_size
from rawgrad.drivers.ioctl import ioc_type as ioc_type

# ---------------------------------------------------------------------------------------------
# ioctl numbers: the Linux _IOC encoding lives in drivers/ioctl.py (re-exported here for the mock and tests)
AMDKFD_IOCTL_BASE = ord("K")  # kfd_ioctl.h AMDKFD_IOCTL_BASE


# ---------------------------------------------------------------------------------------------
# Structures. Comments name the header version each comes from.
CDEF = """
/* KFD 1.0 */
struct kfd_ioctl_get_version_args { uint32_t major_version; uint32_t minor_version; };
/* KFD 1.11 layout (1.17 appends uint32_t sdma_engine_id + pad: 96 bytes; see module docstring) */
struct kfd_ioctl_create_queue_args {
    uint64_t ring_base_address; uint64_t write_pointer_address; uint64_t read_pointer_address;
    uint64_t doorbell_offset;
    uint32_t ring_size; uint32_t gpu_id; uint32_t queue_type; uint32_t queue_percentage;
    uint32_t queue_priority; uint32_t queue_id;
    uint64_t eop_buffer_address; uint64_t eop_buffer_size; uint64_t ctx_save_restore_address;
    uint32_t ctx_save_restore_size; uint32_t ctl_stack_size;
};
/* KFD 1.17 layout, only so tests and the mock know the newer kernel-side size */
struct kfd_ioctl_create_queue_args_v117 {
    struct kfd_ioctl_create_queue_args base; uint32_t sdma_engine_id; uint32_t pad;
};
/* KFD 1.0 */
struct kfd_ioctl_destroy_queue_args { uint32_t queue_id; uint32_t pad; };
/* KFD 1.0 (1.18 renames pad to misc_process_flag) */
struct kfd_ioctl_set_memory_policy_args {
    uint64_t alternate_aperture_base; uint64_t alternate_aperture_size;
    uint32_t gpu_id; uint32_t default_policy; uint32_t alternate_policy; uint32_t pad;
};
/* KFD 1.0 */
struct kfd_ioctl_get_clock_counters_args {
    uint64_t gpu_clock_counter; uint64_t cpu_clock_counter; uint64_t system_clock_counter;
    uint64_t system_clock_freq; uint32_t gpu_id; uint32_t pad;
};
/* KFD 1.0 */
struct kfd_ioctl_create_event_args {
    uint64_t event_page_offset; uint32_t event_trigger_data; uint32_t event_type; uint32_t auto_reset;
    uint32_t node_id; uint32_t event_id; uint32_t event_slot_index;
};
/* KFD 1.0 */
struct kfd_ioctl_destroy_event_args { uint32_t event_id; uint32_t pad; };
struct kfd_ioctl_set_event_args { uint32_t event_id; uint32_t pad; };
/* KFD 1.1 memory-exception payload of a wait */
struct kfd_memory_exception_failure {
    uint32_t NotPresent; uint32_t ReadOnly; uint32_t NoExecute; uint32_t imprecise;
};
struct kfd_hsa_memory_exception_data {
    struct kfd_memory_exception_failure failure; uint64_t va; uint32_t gpu_id; uint32_t ErrorType;
};
struct kfd_hsa_hw_exception_data {
    uint32_t reset_type; uint32_t reset_cause; uint32_t memory_lost; uint32_t gpu_id;
};
struct kfd_event_data {
    union {
        struct kfd_hsa_memory_exception_data memory_exception_data;
        struct kfd_hsa_hw_exception_data hw_exception_data;
    };
    uint64_t kfd_event_data_ext; uint32_t event_id; uint32_t pad;
};
/* KFD 1.0 */
struct kfd_ioctl_wait_events_args {
    uint64_t events_ptr; uint32_t num_events; uint32_t wait_for_all; uint32_t timeout; uint32_t wait_result;
};
/* KFD 1.2 (dGPU memory API) */
struct kfd_ioctl_acquire_vm_args { uint32_t drm_fd; uint32_t gpu_id; };
struct kfd_ioctl_alloc_memory_of_gpu_args {
    uint64_t va_addr; uint64_t size; uint64_t handle; uint64_t mmap_offset; uint32_t gpu_id; uint32_t flags;
};
struct kfd_ioctl_free_memory_of_gpu_args { uint64_t handle; };
struct kfd_ioctl_map_memory_to_gpu_args {
    uint64_t handle; uint64_t device_ids_array_ptr; uint32_t n_devices; uint32_t n_success;
};
struct kfd_ioctl_unmap_memory_from_gpu_args {
    uint64_t handle; uint64_t device_ids_array_ptr; uint32_t n_devices; uint32_t n_success;
};
/* KFD 1.14 */
struct kfd_ioctl_runtime_enable_args { uint64_t r_debug; uint32_t mode_mask; uint32_t capabilities_mask; };
"""

ffi = cffi.FFI()
ffi.cdef(CDEF)

# struct -> (size, {field: offset}); sizes from gcc on kfd_ioctl.h 1.11 / 1.17 (AMD-METAL-FACTS 1.2)
LAYOUTS: dict[str, tuple[int, dict[str, int]]] = {
    "kfd_ioctl_get_version_args": (8, {"minor_version": 4}),
    "kfd_ioctl_create_queue_args": (88, {
        "write_pointer_address": 8, "read_pointer_address": 16, "doorbell_offset": 24, "ring_size": 32,
        "gpu_id": 36, "queue_type": 40, "queue_percentage": 44, "queue_priority": 48, "queue_id": 52,
        "eop_buffer_address": 56, "eop_buffer_size": 64, "ctx_save_restore_address": 72,
        "ctx_save_restore_size": 80, "ctl_stack_size": 84}),
    "kfd_ioctl_create_queue_args_v117": (96, {"sdma_engine_id": 88}),
    "kfd_ioctl_destroy_queue_args": (8, {}),
    "kfd_ioctl_set_memory_policy_args": (32, {"gpu_id": 16, "default_policy": 20, "alternate_policy": 24}),
    "kfd_ioctl_get_clock_counters_args": (40, {"system_clock_freq": 24, "gpu_id": 32}),
    "kfd_ioctl_create_event_args": (32, {
        "event_trigger_data": 8, "event_type": 12, "auto_reset": 16, "node_id": 20, "event_id": 24,
        "event_slot_index": 28}),
    "kfd_ioctl_destroy_event_args": (8, {}),
    "kfd_ioctl_set_event_args": (8, {}),
    "kfd_event_data": (48, {"kfd_event_data_ext": 32, "event_id": 40}),
    "kfd_hsa_memory_exception_data": (32, {"va": 16, "gpu_id": 24, "ErrorType": 28}),
    "kfd_ioctl_wait_events_args": (24, {"num_events": 8, "wait_for_all": 12, "timeout": 16,
                                        "wait_result": 20}),
    "kfd_ioctl_acquire_vm_args": (8, {"gpu_id": 4}),
    "kfd_ioctl_alloc_memory_of_gpu_args": (40, {"size": 8, "handle": 16, "mmap_offset": 24, "gpu_id": 32,
                                                "flags": 36}),
    "kfd_ioctl_free_memory_of_gpu_args": (8, {}),
    "kfd_ioctl_map_memory_to_gpu_args": (24, {"device_ids_array_ptr": 8, "n_devices": 16, "n_success": 20}),
    "kfd_ioctl_unmap_memory_from_gpu_args": (24, {"device_ids_array_ptr": 8, "n_devices": 16,
                                                  "n_success": 20}),
    "kfd_ioctl_runtime_enable_args": (16, {"mode_mask": 8, "capabilities_mask": 12}),
}


def _check_layouts() -> None:
    for name, (size, offsets) in LAYOUTS.items():
        got = ffi.sizeof(f"struct {name}")
        if got != size:
            raise AssertionError(f"struct {name}: cffi size {got} != {size} (kfd_ioctl.h)")
        for fld, off in offsets.items():
            got_off = ffi.offsetof(f"struct {name}", fld)
            if got_off != off:
                raise AssertionError(f"struct {name}.{fld}: offset {got_off} != {off} (kfd_ioctl.h)")


_check_layouts()


def sizeof(ctype: str) -> int:
    return int(ffi.sizeof(f"struct {ctype}"))


# ---------------------------------------------------------------------------------------------
# The ioctl table (kfd_ioctl.h AMDKFD_IOC_*): nr, direction, argument struct.
@dataclass(frozen=True)
class KFDIoctl:
    name: str
    nr: int
    direction: int
    ctype: str
    min_version: tuple[int, int] = (1, 0)

    @property
    def size(self) -> int:
        return sizeof(self.ctype)

    @property
    def request(self) -> int:
        return ioc(self.direction, AMDKFD_IOCTL_BASE, self.nr, self.size)


_RW = IOC_READ | IOC_WRITE
GET_VERSION = KFDIoctl("GET_VERSION", 0x01, IOC_READ, "kfd_ioctl_get_version_args")
CREATE_QUEUE = KFDIoctl("CREATE_QUEUE", 0x02, _RW, "kfd_ioctl_create_queue_args")
DESTROY_QUEUE = KFDIoctl("DESTROY_QUEUE", 0x03, _RW, "kfd_ioctl_destroy_queue_args")
SET_MEMORY_POLICY = KFDIoctl("SET_MEMORY_POLICY", 0x04, IOC_WRITE, "kfd_ioctl_set_memory_policy_args")
GET_CLOCK_COUNTERS = KFDIoctl("GET_CLOCK_COUNTERS", 0x05, _RW, "kfd_ioctl_get_clock_counters_args")
CREATE_EVENT = KFDIoctl("CREATE_EVENT", 0x08, _RW, "kfd_ioctl_create_event_args")
DESTROY_EVENT = KFDIoctl("DESTROY_EVENT", 0x09, IOC_WRITE, "kfd_ioctl_destroy_event_args")
SET_EVENT = KFDIoctl("SET_EVENT", 0x0A, IOC_WRITE, "kfd_ioctl_set_event_args")
WAIT_EVENTS = KFDIoctl("WAIT_EVENTS", 0x0C, _RW, "kfd_ioctl_wait_events_args")
ACQUIRE_VM = KFDIoctl("ACQUIRE_VM", 0x15, IOC_WRITE, "kfd_ioctl_acquire_vm_args", (1, 2))
ALLOC_MEMORY_OF_GPU = KFDIoctl("ALLOC_MEMORY_OF_GPU", 0x16, _RW, "kfd_ioctl_alloc_memory_of_gpu_args", (1, 2))
FREE_MEMORY_OF_GPU = KFDIoctl("FREE_MEMORY_OF_GPU", 0x17, IOC_WRITE, "kfd_ioctl_free_memory_of_gpu_args",
                              (1, 2))
MAP_MEMORY_TO_GPU = KFDIoctl("MAP_MEMORY_TO_GPU", 0x18, _RW, "kfd_ioctl_map_memory_to_gpu_args", (1, 2))
UNMAP_MEMORY_FROM_GPU = KFDIoctl("UNMAP_MEMORY_FROM_GPU", 0x19, _RW, "kfd_ioctl_unmap_memory_from_gpu_args",
                                 (1, 2))
# Only on KFD >= 1.14; ROCr and tinygrad call it after ACQUIRE_VM. Whether queues need it is UNSURE
# (AMD-METAL-FACTS 1.2 step 3), so the driver calls it when the version has it.
RUNTIME_ENABLE = KFDIoctl("RUNTIME_ENABLE", 0x25, _RW, "kfd_ioctl_runtime_enable_args", (1, 14))

IOCTLS: dict[int, KFDIoctl] = {i.nr: i for i in (
    GET_VERSION, CREATE_QUEUE, DESTROY_QUEUE, SET_MEMORY_POLICY, GET_CLOCK_COUNTERS, CREATE_EVENT,
    DESTROY_EVENT, SET_EVENT, WAIT_EVENTS, ACQUIRE_VM, ALLOC_MEMORY_OF_GPU, FREE_MEMORY_OF_GPU,
    MAP_MEMORY_TO_GPU, UNMAP_MEMORY_FROM_GPU, RUNTIME_ENABLE)}
# One past the last ioctl nr a KFD version dispatches (kfd_ioctl.h AMDKFD_COMMAND_END): 1.11 ends at 0x24
# (AVAILABLE_MEMORY is 0x23); 1.14 adds RUNTIME_ENABLE 0x25 and DBG_TRAP 0x26.
AMDKFD_COMMAND_START = 0x01  # kfd_ioctl.h AMDKFD_COMMAND_START
COMMAND_END_1_11 = 0x24  # kfd_ioctl.h 1.11 AMDKFD_COMMAND_END
COMMAND_END_1_14 = 0x27  # kfd_ioctl.h 1.14 AMDKFD_COMMAND_END (after DBG_TRAP 0x26)

# ---------------------------------------------------------------------------------------------
# Constants (kfd_ioctl.h unless noted)
KFD_IOC_QUEUE_TYPE_COMPUTE = 0x0  # PM4
KFD_IOC_QUEUE_TYPE_SDMA = 0x1
KFD_IOC_QUEUE_TYPE_COMPUTE_AQL = 0x2
KFD_IOC_QUEUE_TYPE_SDMA_XGMI = 0x3
QUEUE_TYPE_NAMES = {0: "COMPUTE(PM4)", 1: "SDMA", 2: "COMPUTE_AQL", 3: "SDMA_XGMI"}
KFD_MAX_QUEUE_PERCENTAGE = 100
KFD_MAX_QUEUE_PRIORITY = 15
KFD_MIN_QUEUE_RING_SIZE = 1024  # bytes; smaller sizes are clamped up by newer kernels

KFD_IOC_CACHE_POLICY_COHERENT = 0
KFD_IOC_CACHE_POLICY_NONCOHERENT = 1

KFD_IOC_EVENT_SIGNAL = 0
KFD_IOC_EVENT_NODECHANGE = 1
KFD_IOC_EVENT_DEVICESTATECHANGE = 2
KFD_IOC_EVENT_HW_EXCEPTION = 3
KFD_IOC_EVENT_SYSTEM_EVENT = 4
KFD_IOC_EVENT_DEBUG_EVENT = 5
KFD_IOC_EVENT_PROFILE_EVENT = 6
KFD_IOC_EVENT_QUEUE_EVENT = 7
KFD_IOC_EVENT_MEMORY = 8
EVENT_TYPE_NAMES = {0: "SIGNAL", 1: "NODECHANGE", 2: "DEVICESTATECHANGE", 3: "HW_EXCEPTION",
                    4: "SYSTEM_EVENT", 5: "DEBUG_EVENT", 6: "PROFILE_EVENT", 7: "QUEUE_EVENT", 8: "MEMORY"}

KFD_IOC_WAIT_RESULT_COMPLETE = 0
KFD_IOC_WAIT_RESULT_TIMEOUT = 1
KFD_IOC_WAIT_RESULT_FAIL = 2
KFD_EVENT_TIMEOUT_IMMEDIATE = 0  # kfd_events.c: a timeout of 0 ms polls once
KFD_EVENT_TIMEOUT_INFINITE = 0xFFFFFFFF  # kfd_events.c KFD_EVENT_TIMEOUT_INFINITE
KFD_SIGNAL_EVENT_LIMIT = 4096  # slots of 8 bytes in the event page
EVENT_SLOT_BYTES = 8  # kfd_events.c: one uint64_t mailbox per signal event
EVENT_PAGE_BYTES = KFD_SIGNAL_EVENT_LIMIT * EVENT_SLOT_BYTES  # 0x8000, the minimum event-page size
UNSIGNALED_EVENT_SLOT = (1 << 64) - 1  # kfd_events.c UNSIGNALED_EVENT_SLOT ((uint64_t)-1)

KFD_HW_EXCEPTION_WHOLE_GPU_RESET = 0
KFD_HW_EXCEPTION_PER_ENGINE_RESET = 1
KFD_HW_EXCEPTION_GPU_HANG = 0
KFD_HW_EXCEPTION_ECC = 1
KFD_MEM_ERR_NO_RAS = 0
KFD_MEM_ERR_SRAM_ECC = 1
KFD_MEM_ERR_POISON_CONSUMED = 2
KFD_MEM_ERR_GPU_HANG = 3

# Allocation flags: memory types (exactly one) ...
KFD_IOC_ALLOC_MEM_FLAGS_VRAM = 1 << 0
KFD_IOC_ALLOC_MEM_FLAGS_GTT = 1 << 1
KFD_IOC_ALLOC_MEM_FLAGS_USERPTR = 1 << 2
KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL = 1 << 3
KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP = 1 << 4
# ... and attributes
KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE = 1 << 31
KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE = 1 << 30
KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC = 1 << 29
KFD_IOC_ALLOC_MEM_FLAGS_NO_SUBSTITUTE = 1 << 28
KFD_IOC_ALLOC_MEM_FLAGS_AQL_QUEUE_MEM = 1 << 27
KFD_IOC_ALLOC_MEM_FLAGS_COHERENT = 1 << 26
KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED = 1 << 25
MEM_TYPE_FLAGS = (KFD_IOC_ALLOC_MEM_FLAGS_VRAM | KFD_IOC_ALLOC_MEM_FLAGS_GTT | KFD_IOC_ALLOC_MEM_FLAGS_USERPTR
                  | KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL | KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP)
MEM_ATTR_FLAGS = (KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE | KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE
                  | KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC | KFD_IOC_ALLOC_MEM_FLAGS_NO_SUBSTITUTE
                  | KFD_IOC_ALLOC_MEM_FLAGS_AQL_QUEUE_MEM | KFD_IOC_ALLOC_MEM_FLAGS_COHERENT
                  | KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED)
MEM_FLAG_NAMES = {
    KFD_IOC_ALLOC_MEM_FLAGS_VRAM: "VRAM", KFD_IOC_ALLOC_MEM_FLAGS_GTT: "GTT",
    KFD_IOC_ALLOC_MEM_FLAGS_USERPTR: "USERPTR", KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL: "DOORBELL",
    KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP: "MMIO_REMAP", KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE: "WRITABLE",
    KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE: "EXECUTABLE", KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC: "PUBLIC",
    KFD_IOC_ALLOC_MEM_FLAGS_NO_SUBSTITUTE: "NO_SUBSTITUTE",
    KFD_IOC_ALLOC_MEM_FLAGS_AQL_QUEUE_MEM: "AQL_QUEUE_MEM",
    KFD_IOC_ALLOC_MEM_FLAGS_COHERENT: "COHERENT", KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED: "UNCACHED",
}

# RUNTIME_ENABLE mode bits (kfd_ioctl.h 1.14 KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK)
KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK = 1

# mmap offsets of /dev/kfd (amdkfd kfd_priv.h): the type in bits 63:62, the gpu_id in bits 61:46
KFD_MMAP_TYPE_SHIFT = 62  # kfd_priv.h KFD_MMAP_TYPE_SHIFT
KFD_MMAP_TYPE_MASK = 0x3 << KFD_MMAP_TYPE_SHIFT
KFD_MMAP_TYPE_DOORBELL = 0x3 << KFD_MMAP_TYPE_SHIFT  # kfd_priv.h KFD_MMAP_TYPE_DOORBELL
KFD_MMAP_TYPE_EVENTS = 0x2 << KFD_MMAP_TYPE_SHIFT  # kfd_priv.h KFD_MMAP_TYPE_EVENTS
KFD_MMAP_TYPE_MMIO = 0x0 << KFD_MMAP_TYPE_SHIFT  # kfd_priv.h KFD_MMAP_TYPE_MMIO
KFD_MMAP_GPU_ID_SHIFT = 46  # kfd_priv.h KFD_MMAP_GPU_ID_SHIFT
KFD_GPU_ID_HASH_WIDTH = 16  # kfd_topology.h KFD_GPU_ID_HASH_WIDTH: gpu_ids are 16-bit hashes
KFD_MMAP_GPU_ID_MASK = ((1 << KFD_GPU_ID_HASH_WIDTH) - 1) << KFD_MMAP_GPU_ID_SHIFT

# Doorbells (SOC15 = gfx9 and later): 64-bit doorbells, 1024 queues per process, so a process's doorbell
# slice is 8 KiB (kfd_doorbell.c kfd_doorbell_process_slice; AMD-METAL-FACTS 1.2 step 6).
DOORBELL_BYTES = 8  # SOC15 doorbell width
KFD_MAX_NUM_OF_QUEUES_PER_PROCESS = 1024  # kfd_priv.h
DOORBELL_PROCESS_SLICE = DOORBELL_BYTES * KFD_MAX_NUM_OF_QUEUES_PER_PROCESS  # 0x2000
PAGE_SIZE = 4096  # x86-64 base page


def kfd_mmap_gpu_id(gpu_id: int) -> int:
    """``KFD_MMAP_GPU_ID(gpu_id)``: the gpu_id field of a /dev/kfd mmap offset."""
    return (gpu_id << KFD_MMAP_GPU_ID_SHIFT) & KFD_MMAP_GPU_ID_MASK


def mmap_offset_gpu_id(offset: int) -> int:
    return (offset & KFD_MMAP_GPU_ID_MASK) >> KFD_MMAP_GPU_ID_SHIFT


def make_handle(gpu_id: int, idr: int) -> int:
    """amdkfd ``MAKE_HANDLE``: an allocation handle is gpu_id << 32 | per-device index."""
    return (gpu_id << 32) | idr


def handle_gpu_id(handle: int) -> int:
    return (handle >> 32) & 0xFFFFFFFF


def describe_mem_flags(flags: int) -> str:
    names = [n for bit, n in MEM_FLAG_NAMES.items() if flags & bit]
    rest = flags & ~(MEM_TYPE_FLAGS | MEM_ATTR_FLAGS)
    return "|".join(names + ([f"{rest:#x}"] if rest else [])) or "0"


# ---------------------------------------------------------------------------------------------
# Typed builders and decoders
@dataclass(frozen=True)
class KFDCall:
    """One ioctl ready to run: ``os.ioctl(kfd_fd, call.request, call.args)``."""

    ioctl: KFDIoctl
    args: Any  # cdata ``struct <ioctl.ctype> *``
    keep: tuple[Any, ...] = ()  # buffers the struct points at, alive as long as the call

    @property
    def request(self) -> int:
        return self.ioctl.request

    @property
    def name(self) -> str:
        return self.ioctl.name


def _new(i: KFDIoctl, **fields: int) -> KFDCall:
    args = ffi.new(f"struct {i.ctype} *")
    for k, v in fields.items():
        setattr(args, k, v)
    return KFDCall(i, args)


def _u32(name: str, v: int) -> int:
    if not 0 <= v <= 0xFFFFFFFF:
        raise ValueError(f"{name}={v} does not fit a u32")
    return v


def _u64(name: str, v: int) -> int:
    if not 0 <= v < (1 << 64):
        raise ValueError(f"{name}={v} does not fit a u64")
    return v


def _gpu_id(gpu_id: int) -> int:
    if not 0 < gpu_id < (1 << KFD_GPU_ID_HASH_WIDTH):
        raise ValueError(f"gpu_id={gpu_id} is not a KFD gpu_id (1..{(1 << KFD_GPU_ID_HASH_WIDTH) - 1})")
    return gpu_id


def get_version() -> KFDCall:
    return _new(GET_VERSION)


def decode_version(call: KFDCall) -> tuple[int, int]:
    return int(call.args.major_version), int(call.args.minor_version)


def acquire_vm(drm_fd: int, gpu_id: int) -> KFDCall:
    if drm_fd < 0:
        raise ValueError(f"drm_fd={drm_fd}: open the render node first")
    return _new(ACQUIRE_VM, drm_fd=_u32("drm_fd", drm_fd), gpu_id=_gpu_id(gpu_id))


def runtime_enable(enable: bool = True, r_debug: int = 0) -> KFDCall:
    return _new(RUNTIME_ENABLE, r_debug=_u64("r_debug", r_debug),
                mode_mask=KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK if enable else 0)


def alloc_memory(gpu_id: int, va_addr: int, size: int, flags: int, *, userptr: int = 0) -> KFDCall:
    """ALLOC_MEMORY_OF_GPU at the caller-chosen ``va_addr`` (KFD: CPU VA == GPU VA).

    ``userptr`` is the existing host mapping for a USERPTR allocation (KFD overloads ``mmap_offset``)."""
    kinds = flags & MEM_TYPE_FLAGS
    if kinds == 0 or kinds & (kinds - 1):
        raise ValueError(f"flags {describe_mem_flags(flags)}: exactly one memory type "
                         "(VRAM, GTT, USERPTR, DOORBELL, MMIO_REMAP) is needed")
    if flags & ~(MEM_TYPE_FLAGS | MEM_ATTR_FLAGS):
        raise ValueError(f"flags {describe_mem_flags(flags)}: unknown bits")
    if size <= 0 or size % PAGE_SIZE:
        raise ValueError(f"size={size:#x} must be a positive multiple of the page size {PAGE_SIZE:#x}")
    if va_addr % PAGE_SIZE:
        raise ValueError(f"va_addr={va_addr:#x} is not page aligned")
    if kinds == KFD_IOC_ALLOC_MEM_FLAGS_USERPTR:
        if userptr == 0 or userptr % PAGE_SIZE:
            raise ValueError(f"USERPTR needs the page-aligned host address of existing memory, "
                             f"got {userptr:#x}")
    elif userptr:
        raise ValueError("userptr is only meaningful with the USERPTR memory type")
    if kinds == KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL and size != DOORBELL_PROCESS_SLICE:
        raise ValueError(f"a DOORBELL allocation is the process doorbell slice ({DOORBELL_PROCESS_SLICE:#x} "
                         f"bytes), got {size:#x}")
    return _new(ALLOC_MEMORY_OF_GPU, va_addr=_u64("va_addr", va_addr), size=_u64("size", size),
                mmap_offset=_u64("userptr", userptr), gpu_id=_gpu_id(gpu_id), flags=_u32("flags", flags))


@dataclass(frozen=True)
class Allocation:
    handle: int
    mmap_offset: int  # render-node mmap offset (VRAM/GTT), doorbell offset, or the userptr


def decode_alloc(call: KFDCall) -> Allocation:
    return Allocation(int(call.args.handle), int(call.args.mmap_offset))


def free_memory(handle: int) -> KFDCall:
    return _new(FREE_MEMORY_OF_GPU, handle=_u64("handle", handle))


def _map_call(i: KFDIoctl, handle: int, gpu_ids: Sequence[int]) -> KFDCall:
    if not gpu_ids:
        raise ValueError(f"{i.name}: the gpu_id list is empty")
    ids = ffi.new("uint32_t[]", [_gpu_id(g) for g in gpu_ids])
    call = _new(i, handle=_u64("handle", handle), device_ids_array_ptr=int(ffi.cast("uintptr_t", ids)),
                n_devices=len(gpu_ids), n_success=0)
    return KFDCall(i, call.args, (ids,))


def map_memory(handle: int, gpu_ids: Sequence[int]) -> KFDCall:
    return _map_call(MAP_MEMORY_TO_GPU, handle, gpu_ids)


def unmap_memory(handle: int, gpu_ids: Sequence[int]) -> KFDCall:
    return _map_call(UNMAP_MEMORY_FROM_GPU, handle, gpu_ids)


def decode_mapped(call: KFDCall) -> int:
    """n_success: how many devices from the start of the list are (un)mapped."""
    return int(call.args.n_success)


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def create_queue(gpu_id: int, queue_type: int, *, ring_base: int, ring_size: int, read_pointer: int,
                 write_pointer: int, eop_buffer: int = 0, eop_buffer_size: int = 0, ctx_save_restore: int = 0,
                 ctx_save_restore_size: int = 0, ctl_stack_size: int = 0,
                 percentage: int = KFD_MAX_QUEUE_PERCENTAGE, priority: int = 7) -> KFDCall:
    """CREATE_QUEUE in the 88-byte KFD 1.11 layout. ``ring_size`` in bytes (a power of two)."""
    if queue_type not in (KFD_IOC_QUEUE_TYPE_COMPUTE, KFD_IOC_QUEUE_TYPE_SDMA,
                          KFD_IOC_QUEUE_TYPE_COMPUTE_AQL):
        raise ValueError(f"queue_type={queue_type}: use COMPUTE (PM4), SDMA or COMPUTE_AQL")
    if not _pow2(ring_size) or ring_size < KFD_MIN_QUEUE_RING_SIZE:
        raise ValueError(f"ring_size={ring_size:#x} must be a power of two >= {KFD_MIN_QUEUE_RING_SIZE}")
    if ring_base == 0 or read_pointer == 0 or write_pointer == 0:
        raise ValueError("ring_base, read_pointer and write_pointer must all be mapped GPU addresses")
    if not 0 <= percentage <= KFD_MAX_QUEUE_PERCENTAGE:
        raise ValueError(f"percentage={percentage} must be 0..{KFD_MAX_QUEUE_PERCENTAGE}")
    if not 0 <= priority <= KFD_MAX_QUEUE_PRIORITY:
        raise ValueError(f"priority={priority} must be 0..{KFD_MAX_QUEUE_PRIORITY}")
    if queue_type != KFD_IOC_QUEUE_TYPE_SDMA and (eop_buffer == 0 or eop_buffer_size == 0):
        # RELEASE_MEM needs the EOP buffer; without one the CP dereferences NULL (AMD-METAL-FACTS 1.2)
        raise ValueError("a compute queue needs an EOP buffer (eop_buffer and eop_buffer_size)")
    if queue_type == KFD_IOC_QUEUE_TYPE_SDMA and (eop_buffer or ctx_save_restore):
        raise ValueError("an SDMA queue takes no EOP buffer and no CWSR area")
    if bool(ctx_save_restore) != bool(ctx_save_restore_size):
        raise ValueError("ctx_save_restore and ctx_save_restore_size go together")
    return _new(CREATE_QUEUE, ring_base_address=_u64("ring_base", ring_base),
                write_pointer_address=_u64("write_pointer", write_pointer),
                read_pointer_address=_u64("read_pointer", read_pointer),
                ring_size=_u32("ring_size", ring_size),
                gpu_id=_gpu_id(gpu_id), queue_type=queue_type, queue_percentage=percentage,
                queue_priority=priority, eop_buffer_address=_u64("eop_buffer", eop_buffer),
                eop_buffer_size=_u64("eop_buffer_size", eop_buffer_size),
                ctx_save_restore_address=_u64("ctx_save_restore", ctx_save_restore),
                ctx_save_restore_size=_u32("ctx_save_restore_size", ctx_save_restore_size),
                ctl_stack_size=_u32("ctl_stack_size", ctl_stack_size))


@dataclass(frozen=True)
class QueueInfo:
    queue_id: int
    doorbell_offset: int  # as KFD returns it: mmap type + gpu_id + byte offset inside the doorbell slice

    @property
    def doorbell_mmap_offset(self) -> int:
        """The /dev/kfd mmap offset of the doorbell slice (map DOORBELL_PROCESS_SLICE bytes there)."""
        return self.doorbell_offset & ~(DOORBELL_PROCESS_SLICE - 1)

    @property
    def doorbell_byte_offset(self) -> int:
        """Where this queue's 64-bit doorbell sits inside the mapped slice (SOC15)."""
        return self.doorbell_offset & (DOORBELL_PROCESS_SLICE - 1)


def decode_create_queue(call: KFDCall) -> QueueInfo:
    return QueueInfo(int(call.args.queue_id), int(call.args.doorbell_offset))


def destroy_queue(queue_id: int) -> KFDCall:
    return _new(DESTROY_QUEUE, queue_id=_u32("queue_id", queue_id))


def set_memory_policy(gpu_id: int, default_policy: int = KFD_IOC_CACHE_POLICY_COHERENT,
                      alternate_policy: int = KFD_IOC_CACHE_POLICY_COHERENT, alternate_base: int = 0,
                      alternate_size: int = 0) -> KFDCall:
    for name, p in (("default_policy", default_policy), ("alternate_policy", alternate_policy)):
        if p not in (KFD_IOC_CACHE_POLICY_COHERENT, KFD_IOC_CACHE_POLICY_NONCOHERENT):
            raise ValueError(f"{name}={p}: use KFD_IOC_CACHE_POLICY_COHERENT or _NONCOHERENT")
    return _new(SET_MEMORY_POLICY, alternate_aperture_base=_u64("alternate_base", alternate_base),
                alternate_aperture_size=_u64("alternate_size", alternate_size), gpu_id=_gpu_id(gpu_id),
                default_policy=default_policy, alternate_policy=alternate_policy)


def get_clock_counters(gpu_id: int) -> KFDCall:
    return _new(GET_CLOCK_COUNTERS, gpu_id=_gpu_id(gpu_id))


@dataclass(frozen=True)
class ClockCounters:
    gpu: int  # GPU clock ticks (100 MHz on gfx9/gfx11: AMD-METAL-FACTS 1.4)
    cpu_ns: int  # CLOCK_MONOTONIC_RAW
    system: int
    system_freq: int


def decode_clock_counters(call: KFDCall) -> ClockCounters:
    a = call.args
    return ClockCounters(int(a.gpu_clock_counter), int(a.cpu_clock_counter), int(a.system_clock_counter),
                         int(a.system_clock_freq))


def create_event(event_type: int, *, auto_reset: bool = True, node_id: int = 0,
                 event_page_handle: int = 0) -> KFDCall:
    """CREATE_EVENT. The first call of a process passes the event page's allocation handle (a GTT buffer of
    at least EVENT_PAGE_BYTES); later calls pass 0."""
    if event_type not in EVENT_TYPE_NAMES:
        raise ValueError(f"event_type={event_type} is not a KFD_IOC_EVENT_* value")
    return _new(CREATE_EVENT, event_page_offset=_u64("event_page_handle", event_page_handle),
                event_type=event_type, auto_reset=int(auto_reset), node_id=_u32("node_id", node_id))


@dataclass(frozen=True)
class EventInfo:
    event_id: int
    slot_index: int  # signal events: the 8-byte mailbox event_page + slot_index * 8
    trigger_data: int  # the value the GPU writes to the mailbox (and RELEASE_MEM's ctxid)
    page_offset: int


def decode_event(call: KFDCall) -> EventInfo:
    a = call.args
    return EventInfo(int(a.event_id), int(a.event_slot_index), int(a.event_trigger_data),
                     int(a.event_page_offset))


def destroy_event(event_id: int) -> KFDCall:
    return _new(DESTROY_EVENT, event_id=_u32("event_id", event_id))


def set_event(event_id: int) -> KFDCall:
    return _new(SET_EVENT, event_id=_u32("event_id", event_id))


def wait_events(event_ids: Sequence[int], timeout_ms: int, *, wait_for_all: bool = False) -> KFDCall:
    """WAIT_EVENTS on ``event_ids`` for at most ``timeout_ms`` (KFD_EVENT_TIMEOUT_INFINITE: forever)."""
    if not event_ids:
        raise ValueError("wait_events needs at least one event id")
    data = ffi.new("struct kfd_event_data[]", len(event_ids))
    for d, eid in zip(data, event_ids):
        d.event_id = _u32("event_id", eid)
    call = _new(WAIT_EVENTS, events_ptr=int(ffi.cast("uintptr_t", data)), num_events=len(event_ids),
                wait_for_all=int(wait_for_all), timeout=_u32("timeout_ms", timeout_ms))
    return KFDCall(WAIT_EVENTS, call.args, (data,))


@dataclass(frozen=True)
class MemoryFault:
    """A GPU memory fault as a MEMORY event reports it (kfd_hsa_memory_exception_data)."""

    va: int
    gpu_id: int
    not_present: bool
    read_only: bool
    no_execute: bool
    imprecise: bool
    error_type: int

    def __str__(self) -> str:
        causes = (("page not present", self.not_present), ("write to read-only page", self.read_only),
                  ("execute of no-execute page", self.no_execute))
        why = [n for n, f in causes if f] or ["unknown cause"]
        return (f"GPU memory fault at VA {self.va:#x} on gpu_id {self.gpu_id:#x}: {', '.join(why)}"
                + (" (imprecise address)" if self.imprecise else ""))


@dataclass(frozen=True)
class WaitResult:
    result: int  # KFD_IOC_WAIT_RESULT_*
    faults: tuple[MemoryFault, ...]  # memory faults reported in MEMORY events of the wait

    @property
    def completed(self) -> bool:
        return self.result == KFD_IOC_WAIT_RESULT_COMPLETE

    @property
    def timed_out(self) -> bool:
        return self.result == KFD_IOC_WAIT_RESULT_TIMEOUT


def decode_wait(call: KFDCall, memory_event_ids: Sequence[int] = ()) -> WaitResult:
    """The wait result, plus the fault payload of every listed MEMORY event whose record carries a VA."""
    data = call.keep[0]
    faults = []
    for i in range(int(call.args.num_events)):
        d = data[i]
        if int(d.event_id) in memory_event_ids:
            m = d.memory_exception_data
            f = m.failure
            if m.va or f.NotPresent or f.ReadOnly or f.NoExecute:
                faults.append(MemoryFault(int(m.va), int(m.gpu_id), bool(f.NotPresent), bool(f.ReadOnly),
                                          bool(f.NoExecute), bool(f.imprecise), int(m.ErrorType)))
    return WaitResult(int(call.args.wait_result), tuple(faults))
