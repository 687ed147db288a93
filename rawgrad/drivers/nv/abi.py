"""NVIDIA RM / UVM user ABI: cffi declarations, ioctl numbers, class ids, control ids, status names.

Every structure here is one the driver actually sends. Layouts come from open-gpu-kernel-modules tag
580.142 (NV-FACTS.md sections 1.4, 1.6, 2.3, 2.4, 3.2); each struct size is asserted against the
per-branch table ``LAYOUTS`` when an :class:`NVABI` is built, so a layout slip fails at import time
instead of turning into a silently misread alloc (RM ignores ``paramsSize`` on allocs).
"""

from __future__ import annotations

from typing import Any

import cffi

from rawgrad.drivers.ioctl import ioc_nr as ioc_nr
from rawgrad.drivers.ioctl import ioc_size as ioc_size
from rawgrad.drivers.ioctl import ioc_type as ioc_type
from rawgrad.drivers.ioctl import iowr as iowr

# ---------------------------------------------------------------------------------------------
# ioctl numbers: the Linux _IOC encoding lives in drivers/ioctl.py (NV-FACTS 1.2; re-exported here)
NV_IOCTL_MAGIC = ord("F")  # kernel-open/common/inc/nv-ioctl-numbers.h NV_IOCTL_MAGIC
NV_ABSOLUTE_MAX_IOCTL_SIZE = 16384  # kernel-open/common/inc/nv.h NV_ABSOLUTE_MAX_IOCTL_SIZE


# ---------------------------------------------------------------------------------------------
# Escape codes (nv-ioctl-numbers.h NV_IOCTL_BASE = 200; src/nvidia/arch/nvalloc/unix/include/nv_escape.h)
NV_ESC_CARD_INFO = 0xC8  # nv-ioctl-numbers.h NV_ESC_CARD_INFO (NV_IOCTL_BASE + 0)
NV_ESC_REGISTER_FD = 0xC9  # nv-ioctl-numbers.h NV_ESC_REGISTER_FD (+1)
NV_ESC_CHECK_VERSION_STR = 0xD2  # nv-ioctl-numbers.h NV_ESC_CHECK_VERSION_STR (+10)
NV_ESC_WAIT_OPEN_COMPLETE = 0xDA  # nv-ioctl-numbers.h NV_ESC_WAIT_OPEN_COMPLETE (+18)
NV_ESC_RM_ALLOC_MEMORY = 0x27  # nv_escape.h NV_ESC_RM_ALLOC_MEMORY
NV_ESC_RM_FREE = 0x29  # nv_escape.h NV_ESC_RM_FREE
NV_ESC_RM_CONTROL = 0x2A  # nv_escape.h NV_ESC_RM_CONTROL
NV_ESC_RM_ALLOC = 0x2B  # nv_escape.h NV_ESC_RM_ALLOC
NV_ESC_RM_MAP_MEMORY = 0x4E  # nv_escape.h NV_ESC_RM_MAP_MEMORY
NV_ESC_RM_UNMAP_MEMORY = 0x4F  # nv_escape.h NV_ESC_RM_UNMAP_MEMORY

ESCAPE_NAMES = {
    NV_ESC_CARD_INFO: "NV_ESC_CARD_INFO",
    NV_ESC_REGISTER_FD: "NV_ESC_REGISTER_FD",
    NV_ESC_CHECK_VERSION_STR: "NV_ESC_CHECK_VERSION_STR",
    NV_ESC_WAIT_OPEN_COMPLETE: "NV_ESC_WAIT_OPEN_COMPLETE",
    NV_ESC_RM_ALLOC_MEMORY: "NV_ESC_RM_ALLOC_MEMORY",
    NV_ESC_RM_FREE: "NV_ESC_RM_FREE",
    NV_ESC_RM_CONTROL: "NV_ESC_RM_CONTROL",
    NV_ESC_RM_ALLOC: "NV_ESC_RM_ALLOC",
    NV_ESC_RM_MAP_MEMORY: "NV_ESC_RM_MAP_MEMORY",
    NV_ESC_RM_UNMAP_MEMORY: "NV_ESC_RM_UNMAP_MEMORY",
}
# The struct each escape carries, i.e. what its ioctl number encodes as the size (NV-FACTS 1.2-1.4).
# CARD_INFO carries an array (CARD_INFO_MAX_ENTRIES entries); WAIT_OPEN_COMPLETE has no cdef here (unused).
ESCAPE_PARAM_TYPES: dict[int, str | None] = {
    NV_ESC_CARD_INFO: "nv_ioctl_card_info_t",
    NV_ESC_REGISTER_FD: "nv_ioctl_register_fd_t",
    NV_ESC_CHECK_VERSION_STR: "nv_ioctl_rm_api_version_t",
    NV_ESC_WAIT_OPEN_COMPLETE: None,
    NV_ESC_RM_ALLOC_MEMORY: "nv_ioctl_nvos02_parameters_with_fd",
    NV_ESC_RM_FREE: "NVOS00_PARAMETERS",
    NV_ESC_RM_CONTROL: "NVOS54_PARAMETERS",
    NV_ESC_RM_ALLOC: "NVOS21_PARAMETERS",
    NV_ESC_RM_MAP_MEMORY: "nv_ioctl_nvos33_parameters_with_fd",
    NV_ESC_RM_UNMAP_MEMORY: "NVOS34_PARAMETERS",
}

# NV_ESC_CHECK_VERSION_STR command values (nv-ioctl.h NV_RM_API_VERSION_CMD_*)
NV_RM_API_VERSION_CMD_STRICT = 0  # nv-ioctl.h NV_RM_API_VERSION_CMD_STRICT
NV_RM_API_VERSION_CMD_RELAXED = ord("1")  # nv-ioctl.h NV_RM_API_VERSION_CMD_RELAXED
NV_RM_API_VERSION_CMD_QUERY = ord("2")  # nv-ioctl.h NV_RM_API_VERSION_CMD_QUERY
NV_RM_API_VERSION_REPLY_RECOGNIZED = 1  # nv-ioctl.h NV_RM_API_VERSION_REPLY_RECOGNIZED

CARD_INFO_MAX_ENTRIES = 64  # NV-FACTS 2.2 step 6 (array of 64 nv_ioctl_card_info_t)

# ---------------------------------------------------------------------------------------------
# UVM ioctl numbers: raw integers on Linux (kernel-open/nvidia-uvm/uvm_linux_ioctl.h, uvm_ioctl.h)
UVM_INITIALIZE = 0x30000001  # uvm_linux_ioctl.h UVM_INITIALIZE
UVM_DEINITIALIZE = 0x30000002  # uvm_linux_ioctl.h UVM_DEINITIALIZE
UVM_REGISTER_GPU_VASPACE = 25  # uvm_ioctl.h UVM_IOCTL_BASE(25)
UVM_UNREGISTER_GPU_VASPACE = 26  # uvm_ioctl.h UVM_IOCTL_BASE(26)
UVM_REGISTER_CHANNEL = 27  # uvm_ioctl.h UVM_IOCTL_BASE(27)
UVM_UNREGISTER_CHANNEL = 28  # uvm_ioctl.h UVM_IOCTL_BASE(28)
UVM_MAP_EXTERNAL_ALLOCATION = 33  # uvm_ioctl.h UVM_IOCTL_BASE(33)
UVM_FREE = 34  # uvm_ioctl.h UVM_IOCTL_BASE(34)
UVM_REGISTER_GPU = 37  # uvm_ioctl.h UVM_IOCTL_BASE(37)
UVM_UNREGISTER_GPU = 38  # uvm_ioctl.h UVM_IOCTL_BASE(38)
UVM_UNMAP_EXTERNAL = 66  # uvm_ioctl.h UVM_IOCTL_BASE(66)
UVM_CREATE_EXTERNAL_RANGE = 73  # uvm_ioctl.h UVM_IOCTL_BASE(73)
UVM_MM_INITIALIZE = 75  # uvm_ioctl.h UVM_IOCTL_BASE(75)

UVM_PARAM_TYPES = {
    UVM_INITIALIZE: "UVM_INITIALIZE_PARAMS",
    UVM_MM_INITIALIZE: "UVM_MM_INITIALIZE_PARAMS",
    UVM_REGISTER_GPU: "UVM_REGISTER_GPU_PARAMS",
    UVM_UNREGISTER_GPU: "UVM_UNREGISTER_GPU_PARAMS",
    UVM_REGISTER_GPU_VASPACE: "UVM_REGISTER_GPU_VASPACE_PARAMS",
    UVM_UNREGISTER_GPU_VASPACE: "UVM_UNREGISTER_GPU_VASPACE_PARAMS",
    UVM_REGISTER_CHANNEL: "UVM_REGISTER_CHANNEL_PARAMS",
    UVM_UNREGISTER_CHANNEL: "UVM_UNREGISTER_CHANNEL_PARAMS",
    UVM_CREATE_EXTERNAL_RANGE: "UVM_CREATE_EXTERNAL_RANGE_PARAMS",
    UVM_MAP_EXTERNAL_ALLOCATION: "UVM_MAP_EXTERNAL_ALLOCATION_PARAMS",
    UVM_UNMAP_EXTERNAL: "UVM_UNMAP_EXTERNAL_PARAMS",
    UVM_FREE: "UVM_FREE_PARAMS",
}
UVM_NAMES = {cmd: name.removesuffix("_PARAMS") for cmd, name in UVM_PARAM_TYPES.items()}

UVM_MAX_GPUS = 256  # uvm_types.h UVM_MAX_GPUS (NV_MAX_DEVICES 32 x 8 sub-processors, since 555)
UVM_MAPPING_TYPE_READ_WRITE_ATOMIC = 1  # uvm_types.h UvmGpuMappingTypeReadWriteAtomic
UVM_INIT_FLAGS_DISABLE_HMM = 0x1  # uvm_types.h UVM_INIT_FLAGS_DISABLE_HMM

# ---------------------------------------------------------------------------------------------
# Class ids (src/common/sdk/nvidia/inc/class/cl*.h; NV-FACTS 2.1)
NV01_ROOT_CLIENT = 0x41  # cl0041.h
NV01_DEVICE_0 = 0x80  # cl0080.h
NV20_SUBDEVICE_0 = 0x2080  # cl2080.h
NV01_MEMORY_SYSTEM = 0x3E  # cl003e.h
NV01_MEMORY_LOCAL_USER = 0x40  # cl0040.h
NV01_MEMORY_SYSTEM_OS_DESCRIPTOR = 0x71  # cl0071.h
FERMI_VASPACE_A = 0x90F1  # cl90f1.h
FERMI_CONTEXT_SHARE_A = 0x9067  # cl9067.h
KEPLER_CHANNEL_GROUP_A = 0xA06C  # cla06c.h
TURING_USERMODE_A = 0xC461  # clc461.h
AMPERE_USERMODE_A = 0xC561  # clc561.h
HOPPER_USERMODE_A = 0xC661  # clc661.h
AMPERE_CHANNEL_GPFIFO_A = 0xC56F  # clc56f.h
HOPPER_CHANNEL_GPFIFO_A = 0xC86F  # clc86f.h
AMPERE_COMPUTE_A = 0xC6C0  # clc6c0.h
AMPERE_COMPUTE_B = 0xC7C0  # clc7c0.h
ADA_COMPUTE_A = 0xC9C0  # clc9c0.h
HOPPER_COMPUTE_A = 0xCBC0  # clcbc0.h
AMPERE_DMA_COPY_A = 0xC6B5  # clc6b5.h
AMPERE_DMA_COPY_B = 0xC7B5  # clc7b5.h
HOPPER_DMA_COPY_A = 0xC8B5  # clc8b5.h

CLASS_NAMES = {
    v: k
    for k, v in dict(
        NV01_ROOT_CLIENT=NV01_ROOT_CLIENT,
        NV01_DEVICE_0=NV01_DEVICE_0,
        NV20_SUBDEVICE_0=NV20_SUBDEVICE_0,
        NV01_MEMORY_SYSTEM=NV01_MEMORY_SYSTEM,
        NV01_MEMORY_LOCAL_USER=NV01_MEMORY_LOCAL_USER,
        NV01_MEMORY_SYSTEM_OS_DESCRIPTOR=NV01_MEMORY_SYSTEM_OS_DESCRIPTOR,
        FERMI_VASPACE_A=FERMI_VASPACE_A,
        FERMI_CONTEXT_SHARE_A=FERMI_CONTEXT_SHARE_A,
        KEPLER_CHANNEL_GROUP_A=KEPLER_CHANNEL_GROUP_A,
        TURING_USERMODE_A=TURING_USERMODE_A,
        AMPERE_USERMODE_A=AMPERE_USERMODE_A,
        HOPPER_USERMODE_A=HOPPER_USERMODE_A,
        AMPERE_CHANNEL_GPFIFO_A=AMPERE_CHANNEL_GPFIFO_A,
        HOPPER_CHANNEL_GPFIFO_A=HOPPER_CHANNEL_GPFIFO_A,
        AMPERE_COMPUTE_A=AMPERE_COMPUTE_A,
        AMPERE_COMPUTE_B=AMPERE_COMPUTE_B,
        ADA_COMPUTE_A=ADA_COMPUTE_A,
        HOPPER_COMPUTE_A=HOPPER_COMPUTE_A,
        AMPERE_DMA_COPY_A=AMPERE_DMA_COPY_A,
        AMPERE_DMA_COPY_B=AMPERE_DMA_COPY_B,
        HOPPER_DMA_COPY_A=HOPPER_DMA_COPY_A,
    ).items()
}

# Picker preference lists (first present in the device class list wins; NV-FACTS 2.1 recommendation)
USERMODE_CLASSES = (HOPPER_USERMODE_A, AMPERE_USERMODE_A, TURING_USERMODE_A)
GPFIFO_CLASSES = (HOPPER_CHANNEL_GPFIFO_A, AMPERE_CHANNEL_GPFIFO_A)
COMPUTE_CLASSES = (HOPPER_COMPUTE_A, ADA_COMPUTE_A, AMPERE_COMPUTE_B, AMPERE_COMPUTE_A)
COPY_CLASSES = (HOPPER_DMA_COPY_A, AMPERE_DMA_COPY_B, AMPERE_DMA_COPY_A)

# Alloc parameter struct per class (None: the class takes no parameters / NULL is allowed)
ALLOC_PARAM_TYPES: dict[int, str | None] = {
    NV01_ROOT_CLIENT: None,
    NV01_DEVICE_0: "NV0080_ALLOC_PARAMETERS",
    NV20_SUBDEVICE_0: "NV2080_ALLOC_PARAMETERS",
    NV01_MEMORY_SYSTEM: "NV_MEMORY_ALLOCATION_PARAMS",
    NV01_MEMORY_LOCAL_USER: "NV_MEMORY_ALLOCATION_PARAMS",
    FERMI_VASPACE_A: "NV_VASPACE_ALLOCATION_PARAMETERS",
    FERMI_CONTEXT_SHARE_A: "NV_CTXSHARE_ALLOCATION_PARAMETERS",
    KEPLER_CHANNEL_GROUP_A: "NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS",
    TURING_USERMODE_A: None,
    AMPERE_USERMODE_A: None,
    HOPPER_USERMODE_A: "NV_HOPPER_USERMODE_A_PARAMS",
    AMPERE_CHANNEL_GPFIFO_A: "NV_CHANNEL_ALLOC_PARAMS",
    HOPPER_CHANNEL_GPFIFO_A: "NV_CHANNEL_ALLOC_PARAMS",
    AMPERE_COMPUTE_A: "NV_GR_ALLOCATION_PARAMETERS",
    AMPERE_COMPUTE_B: "NV_GR_ALLOCATION_PARAMETERS",
    ADA_COMPUTE_A: "NV_GR_ALLOCATION_PARAMETERS",
    HOPPER_COMPUTE_A: "NV_GR_ALLOCATION_PARAMETERS",
    AMPERE_DMA_COPY_A: "NVB0B5_ALLOCATION_PARAMETERS",
    AMPERE_DMA_COPY_B: "NVB0B5_ALLOCATION_PARAMETERS",
    HOPPER_DMA_COPY_A: "NVB0B5_ALLOCATION_PARAMETERS",
}

# ---------------------------------------------------------------------------------------------
# Control commands (src/common/sdk/nvidia/inc/ctrl/ctrl*.h; NV-FACTS 2.4)
NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION = 0x101  # ctrl0000system.h
NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION_V2 = 0x13E  # ctrl0000system.h
NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2 = 0x205  # ctrl0000gpu.h
NV0080_CTRL_CMD_GPU_GET_CLASSLIST = 0x800201  # ctrl0080gpu.h
NV2080_CTRL_CMD_GPU_GET_GID_INFO = 0x2080014A  # ctrl2080gpu.h
NV2080_CTRL_CMD_GPU_GET_NAME_STRING = 0x20800110  # ctrl2080gpu.h (message id 0x10 of the GPU interface)
NV2080_CTRL_CMD_PERF_BOOST = 0x2080200A  # ctrl2080perf.h
NV2080_CTRL_CMD_GR_GET_INFO = 0x20801201  # ctrl2080gr.h
NV2080_CTRL_CMD_FB_FLUSH_GPU_CACHE = 0x2080130E  # ctrl2080fb.h
NVA06C_CTRL_CMD_GPFIFO_SCHEDULE = 0xA06C0101  # ctrla06c.h
NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN = 0xC36F0108  # ctrlc36f.h

CONTROL_PARAM_TYPES = {
    NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION: "NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS",
    NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION_V2: "NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_V2_PARAMS",
    NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2: "NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS",
    NV0080_CTRL_CMD_GPU_GET_CLASSLIST: "NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS",
    NV2080_CTRL_CMD_GPU_GET_GID_INFO: "NV2080_CTRL_GPU_GET_GID_INFO_PARAMS",
    NV2080_CTRL_CMD_GPU_GET_NAME_STRING: "NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS",
    NV2080_CTRL_CMD_PERF_BOOST: "NV2080_CTRL_PERF_BOOST_PARAMS",
    NV2080_CTRL_CMD_GR_GET_INFO: "NV2080_CTRL_GR_GET_INFO_PARAMS",
    NV2080_CTRL_CMD_FB_FLUSH_GPU_CACHE: "NV2080_CTRL_FB_FLUSH_GPU_CACHE_PARAMS",
    NVA06C_CTRL_CMD_GPFIFO_SCHEDULE: "NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS",
    NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN: "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS",
}
CONTROL_NAMES = {
    cmd: "NV"
    + name.split("_", 1)[0][2:]
    + "_CTRL_CMD_"
    + name.split("_CTRL_", 1)[1].removeprefix("CMD_").removesuffix("_PARAMS")
    for cmd, name in CONTROL_PARAM_TYPES.items()
}

# Control field values
NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY = 2  # ctrl2080gpu.h ..._GID_FLAGS_FORMAT_BINARY
NV2080_GPU_GID_BINARY_LENGTH = 16  # UUID bytes in binary form
NV2080_CTRL_GPU_GET_NAME_STRING_FLAGS_TYPE_ASCII = 0  # ctrl2080gpu.h
NV2080_CTRL_GPU_GET_NAME_STRING_FLAGS_TYPE_UNICODE = 1  # ctrl2080gpu.h
NV2080_GPU_MAX_NAME_STRING_LENGTH = 0x40  # ctrl2080gpu.h: name buffer entries (bytes or UTF-16 units)
NV2080_CTRL_GR_INFO_INDEX_MAX_WARPS_PER_SM = 0x0D  # ctrl2080gr.h
NV2080_CTRL_GR_INFO_INDEX_SM_VERSION = 0x0C  # ctrl2080gr.h
NV2080_CTRL_GR_INFO_INDEX_LITTER_NUM_GPCS = 0x14  # ctrl2080gr.h
NV2080_CTRL_GR_INFO_INDEX_LITTER_NUM_TPC_PER_GPC = 0x17  # ctrl2080gr.h
NV2080_CTRL_GR_INFO_INDEX_LITTER_NUM_SM_PER_TPC = 0x20  # ctrl2080gr.h
NV2080_ENGINE_TYPE_GRAPHICS = 1  # ctrl2080gpu.h NV2080_ENGINE_TYPE_GRAPHICS
WORK_SUBMIT_TOKEN_UNSET = 0xFFFFFFFF  # value preset before GET_WORK_SUBMIT_TOKEN (NV-FACTS 2.2 step 27)

# ---------------------------------------------------------------------------------------------
# Alloc flag values (nvos.h; NV-FACTS 2.2, 3.2, 3.3)
NV_VASPACE_ALLOCATION_FLAGS_IS_EXTERNALLY_OWNED = 0x08  # nvos.h bit 3
NV_VASPACE_ALLOCATION_FLAGS_ENABLE_PAGE_FAULTING = 0x40  # nvos.h bit 6
NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC = 1  # cl9067.h NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC
NV0080_ALLOC_VAMODE_OPTIONAL_MULTIPLE_VASPACES = 0  # cl0080.h

NVOS32_TYPE_IMAGE = 0  # nvos.h NVOS32_TYPE_IMAGE
NVOS32_TYPE_NOTIFIER = 13  # nvos.h NVOS32_TYPE_NOTIFIER
NVOS32_ALLOC_FLAGS_IGNORE_BANK_PLACEMENT = 0x1  # nvos.h
NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE = 0x100  # nvos.h
NVOS32_ALLOC_FLAGS_NO_SCANOUT = 0x1000  # nvos.h
NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED = 0x4000  # nvos.h
NVOS32_ALLOC_FLAGS_MAP_NOT_REQUIRED = 0x8000  # nvos.h
NVOS32_ALLOC_FLAGS_PERSISTENT_VIDMEM = 0x10000  # nvos.h
NVOS32_ATTR_PAGE_SIZE_SHIFT = 23  # nvos.h NVOS32_ATTR_PAGE_SIZE 24:23
NVOS32_ATTR_PAGE_SIZE_4KB = 1
NVOS32_ATTR_PAGE_SIZE_HUGE = 3
NVOS32_ATTR_LOCATION_SHIFT = 25  # nvos.h NVOS32_ATTR_LOCATION 26:25
NVOS32_ATTR_LOCATION_VIDMEM = 0
NVOS32_ATTR_LOCATION_PCI = 1
NVOS32_ATTR_PHYSICALITY_SHIFT = 27  # nvos.h NVOS32_ATTR_PHYSICALITY 28:27
NVOS32_ATTR_PHYSICALITY_CONTIGUOUS = 2
NVOS32_ATTR_PHYSICALITY_ALLOW_NONCONTIGUOUS = 3
NVOS32_ATTR_COHERENCY_SHIFT = 29  # nvos.h NVOS32_ATTR_COHERENCY 31:29
NVOS32_ATTR_COHERENCY_UNCACHED = 0
NVOS32_ATTR2_ZBC_PREFER_NO_ZBC = 0x1  # nvos.h NVOS32_ATTR2_ZBC 1:0
NVOS32_ATTR2_GPU_CACHEABLE_SHIFT = 2  # nvos.h NVOS32_ATTR2_GPU_CACHEABLE 3:2
NVOS32_ATTR2_GPU_CACHEABLE_YES = 1
NVOS32_ATTR2_GPU_CACHEABLE_NO = 2
NVOS32_ATTR2_PAGE_SIZE_HUGE_SHIFT = 20  # nvos.h NVOS32_ATTR2_PAGE_SIZE_HUGE 21:20
NVOS32_ATTR2_PAGE_SIZE_HUGE_2MB = 1
NV_MMU_PTE_KIND_GENERIC_MEMORY = 6  # NV-FACTS 3.2 "format 6 (PTE kind GENERIC_MEMORY)"

NVOS02_FLAGS_PHYSICALITY_SHIFT = 4  # nvos.h NVOS02_FLAGS_PHYSICALITY 7:4
NVOS02_FLAGS_PHYSICALITY_NONCONTIGUOUS = 1
NVOS02_FLAGS_LOCATION_SHIFT = 8  # nvos.h NVOS02_FLAGS_LOCATION 11:8
NVOS02_FLAGS_LOCATION_PCI = 0
NVOS02_FLAGS_COHERENCY_SHIFT = 12  # nvos.h NVOS02_FLAGS_COHERENCY 15:12
NVOS02_FLAGS_COHERENCY_UNCACHED = 0
NVOS02_FLAGS_COHERENCY_CACHED = 1
NVOS02_FLAGS_COHERENCY_WRITE_BACK = 5
NVOS02_FLAGS_MAPPING_SHIFT = 30  # nvos.h NVOS02_FLAGS_MAPPING 31:30
NVOS02_FLAGS_MAPPING_NO_MAP = 1

# ---------------------------------------------------------------------------------------------
# NV_STATUS names (src/common/sdk/nvidia/inc/nvstatuscodes.h). Error codes 0x01..0x8A are consecutive.
NV_OK = 0x0
NV_ERR_GENERIC = 0xFFFF
_ERR_NAMES_FROM_1 = (
    "BROKEN_FB",
    "BUFFER_TOO_SMALL",
    "BUSY_RETRY",
    "CALLBACK_NOT_SCHEDULED",
    "CARD_NOT_PRESENT",
    "CYCLE_DETECTED",
    "DMA_IN_USE",
    "DMA_MEM_NOT_LOCKED",
    "DMA_MEM_NOT_UNLOCKED",
    "DUAL_LINK_INUSE",
    "ECC_ERROR",
    "FIFO_BAD_ACCESS",
    "FREQ_NOT_SUPPORTED",
    "GPU_DMA_NOT_INITIALIZED",
    "GPU_IS_LOST",
    "GPU_IN_FULLCHIP_RESET",
    "GPU_NOT_FULL_POWER",
    "GPU_UUID_NOT_FOUND",
    "HOT_SWITCH",
    "I2C_ERROR",
    "I2C_SPEED_TOO_HIGH",
    "ILLEGAL_ACTION",
    "IN_USE",
    "INFLATE_COMPRESSED_DATA_FAILED",
    "INSERT_DUPLICATE_NAME",
    "INSUFFICIENT_RESOURCES",
    "INSUFFICIENT_PERMISSIONS",
    "INSUFFICIENT_POWER",
    "INVALID_ACCESS_TYPE",
    "INVALID_ADDRESS",
    "INVALID_ARGUMENT",
    "INVALID_BASE",
    "INVALID_CHANNEL",
    "INVALID_CLASS",
    "INVALID_CLIENT",
    "INVALID_COMMAND",
    "INVALID_DATA",
    "INVALID_DEVICE",
    "INVALID_DMA_SPECIFIER",
    "INVALID_EVENT",
    "INVALID_FLAGS",
    "INVALID_FUNCTION",
    "INVALID_HEAP",
    "INVALID_INDEX",
    "INVALID_IRQ_LEVEL",
    "INVALID_LIMIT",
    "INVALID_LOCK_STATE",
    "INVALID_METHOD",
    "INVALID_OBJECT",
    "INVALID_OBJECT_BUFFER",
    "INVALID_OBJECT_HANDLE",
    "INVALID_OBJECT_NEW",
    "INVALID_OBJECT_OLD",
    "INVALID_OBJECT_PARENT",
    "INVALID_OFFSET",
    "INVALID_OPERATION",
    "INVALID_OWNER",
    "INVALID_PARAM_STRUCT",
    "INVALID_PARAMETER",
    "INVALID_PATH",
    "INVALID_POINTER",
    "INVALID_REGISTRY_KEY",
    "INVALID_REQUEST",
    "INVALID_STATE",
    "INVALID_STRING_LENGTH",
    "INVALID_READ",
    "INVALID_WRITE",
    "INVALID_XLATE",
    "IRQ_NOT_FIRING",
    "IRQ_EDGE_TRIGGERED",
    "MEMORY_TRAINING_FAILED",
    "MISMATCHED_SLAVE",
    "MISMATCHED_TARGET",
    "MISSING_TABLE_ENTRY",
    "MODULE_LOAD_FAILED",
    "MORE_DATA_AVAILABLE",
    "MORE_PROCESSING_REQUIRED",
    "MULTIPLE_MEMORY_TYPES",
    "NO_FREE_FIFOS",
    "NO_INTR_PENDING",
    "NO_MEMORY",
    "NO_SUCH_DOMAIN",
    "NO_VALID_PATH",
    "NOT_COMPATIBLE",
    "NOT_READY",
    "NOT_SUPPORTED",
    "OBJECT_NOT_FOUND",
    "OBJECT_TYPE_MISMATCH",
    "OPERATING_SYSTEM",
    "OTHER_DEVICE_FOUND",
    "OUT_OF_RANGE",
    "OVERLAPPING_UVM_COMMIT",
    "PAGE_TABLE_NOT_AVAIL",
    "PID_NOT_FOUND",
    "PROTECTION_FAULT",
    "RC_ERROR",
    "REJECTED_VBIOS",
    "RESET_REQUIRED",
    "STATE_IN_USE",
    "SIGNAL_PENDING",
    "TIMEOUT",
    "TIMEOUT_RETRY",
    "TOO_MANY_PRIMARIES",
    "UVM_ADDRESS_IN_USE",
    "MAX_SESSION_LIMIT_REACHED",
    "LIB_RM_VERSION_MISMATCH",
    "PRIV_SEC_VIOLATION",
    "GPU_IN_DEBUG_MODE",
    "FEATURE_NOT_ENABLED",
    "RESOURCE_LOST",
    "PMU_NOT_READY",
    "FLCN_ERROR",
    "FATAL_ERROR",
    "MEMORY_ERROR",
    "INVALID_LICENSE",
    "NVLINK_INIT_ERROR",
    "NVLINK_MINION_ERROR",
    "NVLINK_CLOCK_ERROR",
    "NVLINK_TRAINING_ERROR",
    "NVLINK_CONFIGURATION_ERROR",
    "RISCV_ERROR",
    "FABRIC_MANAGER_NOT_PRESENT",
    "ALREADY_SIGNALLED",
    "QUEUE_TASK_SLOT_NOT_AVAILABLE",
    "KEY_ROTATION_IN_PROGRESS",
    "TEST_ONLY_CODE_NOT_ENABLED",
    "SECURE_BOOT_FAILED",
    "INSUFFICIENT_ZBC_ENTRY",
    "NVLINK_FABRIC_NOT_READY",
    "NVLINK_FABRIC_FAILURE",
    "GPU_MEMORY_ONLINING_FAILURE",
    "REDUCTION_MANAGER_NOT_AVAILABLE",
    "THRESHOLD_CROSSED",
    "RESOURCE_RETIREMENT_ERROR",
    "FABRIC_STATE_OUT_OF_SYNC",
    "BUFFER_FULL",
    "BUFFER_EMPTY",
    "MC_FLA_OFFSET_TABLE_FULL",
)
_WARN_NAMES_FROM_0x10001 = (
    "HOT_SWITCH",
    "INCORRECT_PERFMON_DATA",
    "MISMATCHED_SLAVE",
    "MISMATCHED_TARGET",
    "MORE_PROCESSING_REQUIRED",
    "NOTHING_TO_DO",
    "NULL_OBJECT",
)
NV_STATUS_NAMES: dict[int, str] = {NV_OK: "NV_OK", NV_ERR_GENERIC: "NV_ERR_GENERIC"}
NV_STATUS_NAMES.update({i + 1: "NV_ERR_" + n for i, n in enumerate(_ERR_NAMES_FROM_1)})
NV_STATUS_NAMES.update({0x10001 + i: "NV_WARN_" + n for i, n in enumerate(_WARN_NAMES_FROM_0x10001)})
NV_STATUS = {name: code for code, name in NV_STATUS_NAMES.items()}
assert NV_STATUS["NV_ERR_INVALID_PARAM_STRUCT"] == 0x3A and NV_STATUS["NV_ERR_UVM_ADDRESS_IN_USE"] == 0x68
assert NV_STATUS["NV_ERR_MC_FLA_OFFSET_TABLE_FULL"] == 0x8A and NV_STATUS["NV_WARN_NOTHING_TO_DO"] == 0x10006


def status_name(status: int) -> str:
    """``NV_ERR_*`` name of an NV_STATUS value (hex if unknown)."""
    return NV_STATUS_NAMES.get(status, f"NV_STATUS_{status:#x}")


# ---------------------------------------------------------------------------------------------
# cffi declarations. _COMMON_CDEF holds structs identical across the branches we know; each branch
# adds its own versions of the structs that drifted (NV-FACTS 9.1).
_COMMON_CDEF = """
typedef uint32_t NvHandle;
typedef uint32_t NV_STATUS;

typedef struct { uint32_t domain; uint8_t bus, slot, function; uint16_t vendor_id, device_id; } nv_pci_info_t;
typedef struct {
    uint8_t valid; nv_pci_info_t pci_info; uint32_t gpu_id; uint16_t interrupt_line;
    uint64_t reg_address, reg_size, fb_address, fb_size; uint32_t minor_number; uint8_t dev_name[10];
} nv_ioctl_card_info_t;
typedef struct { uint32_t cmd; uint32_t reply; char versionString[64]; } nv_ioctl_rm_api_version_t;
typedef struct { int ctl_fd; } nv_ioctl_register_fd_t;

typedef struct { NvHandle hRoot, hObjectParent, hObjectOld; NV_STATUS status; } NVOS00_PARAMETERS;
typedef struct {
    NvHandle hRoot, hObjectParent, hObjectNew; uint32_t hClass; uint64_t pAllocParms;
    uint32_t paramsSize; NV_STATUS status;
} NVOS21_PARAMETERS;
typedef struct {
    NvHandle hRoot, hObjectParent, hObjectNew; uint32_t hClass; uint64_t pAllocParms;
    uint64_t pRightsRequested; uint32_t paramsSize; uint32_t flags; NV_STATUS status;
} NVOS64_PARAMETERS;
typedef struct {
    NvHandle hClient, hObject; uint32_t cmd; uint32_t flags; uint64_t params; uint32_t paramsSize;
    NV_STATUS status;
} NVOS54_PARAMETERS;
typedef struct {
    NvHandle hRoot, hObjectParent, hObjectNew; uint32_t hClass; uint32_t flags; uint64_t pMemory;
    uint64_t limit; NV_STATUS status;
} NVOS02_PARAMETERS;
typedef struct { NVOS02_PARAMETERS params; int fd; } nv_ioctl_nvos02_parameters_with_fd;
typedef struct {
    NvHandle hClient, hDevice, hMemory; uint64_t offset; uint64_t length; uint64_t pLinearAddress;
    NV_STATUS status; uint32_t flags;
} NVOS33_PARAMETERS;
typedef struct { NVOS33_PARAMETERS params; int fd; } nv_ioctl_nvos33_parameters_with_fd;
typedef struct {
    NvHandle hClient, hDevice, hMemory; uint64_t pLinearAddress; NV_STATUS status; uint32_t flags;
} NVOS34_PARAMETERS;

typedef struct { uint8_t uuid[16]; } NvProcessorUuid;
typedef struct { uint64_t flags; NV_STATUS rmStatus; } UVM_INITIALIZE_PARAMS;
typedef struct { int32_t uvmFd; NV_STATUS rmStatus; } UVM_MM_INITIALIZE_PARAMS;
typedef struct {
    NvProcessorUuid gpu_uuid; uint8_t numaEnabled; int32_t numaNodeId; int32_t rmCtrlFd;
    NvHandle hClient; NvHandle hSmcPartRef; NV_STATUS rmStatus;
} UVM_REGISTER_GPU_PARAMS;
typedef struct { NvProcessorUuid gpu_uuid; NV_STATUS rmStatus; } UVM_UNREGISTER_GPU_PARAMS;
typedef struct {
    NvProcessorUuid gpuUuid; int32_t rmCtrlFd; NvHandle hClient; NvHandle hVaSpace; NV_STATUS rmStatus;
} UVM_REGISTER_GPU_VASPACE_PARAMS;
typedef struct { NvProcessorUuid gpuUuid; NV_STATUS rmStatus; } UVM_UNREGISTER_GPU_VASPACE_PARAMS;
typedef struct {
    NvProcessorUuid gpuUuid; int32_t rmCtrlFd; NvHandle hClient; NvHandle hChannel; uint64_t base;
    uint64_t length; NV_STATUS rmStatus;
} UVM_REGISTER_CHANNEL_PARAMS;
typedef struct { uint64_t base; uint64_t length; NV_STATUS rmStatus; } UVM_CREATE_EXTERNAL_RANGE_PARAMS;
typedef struct {
    NvProcessorUuid gpuUuid; uint32_t gpuMappingType, gpuCachingType, gpuFormatType, gpuElementBits,
    gpuCompressionType;
} UvmGpuMappingAttributes;
typedef struct {
    uint64_t base; uint64_t length; NvProcessorUuid gpuUuid; NV_STATUS rmStatus;
} UVM_UNMAP_EXTERNAL_PARAMS;

typedef struct {
    uint32_t deviceId; NvHandle hClientShare, hTargetClient, hTargetDevice; uint32_t flags;
    uint64_t vaSpaceSize, vaStartInternal, vaLimitInternal; uint32_t vaMode;
} NV0080_ALLOC_PARAMETERS;
typedef struct { uint32_t subDeviceId; } NV2080_ALLOC_PARAMETERS;
typedef struct { uint8_t bBar1Mapping; uint8_t bPriv; } NV_HOPPER_USERMODE_A_PARAMS;
typedef struct {
    NvHandle hObjectError, hObjectEccError, hVASpace; uint32_t engineType;
    uint8_t bIsCallingContextVgpuPlugin;
} NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS;
typedef struct { NvHandle hVASpace; uint32_t flags; uint32_t subctxId; } NV_CTXSHARE_ALLOCATION_PARAMETERS;
typedef struct { uint32_t version, flags, size, caps; } NV_GR_ALLOCATION_PARAMETERS;
typedef struct { uint32_t version; uint32_t engineType; } NVB0B5_ALLOCATION_PARAMETERS;
typedef struct {
    NvHandle owner; uint32_t type, flags, width, height; int32_t pitch; uint32_t attr, attr2, format,
    comprCovg, zcullCovg; uint64_t rangeLo, rangeHi, size, alignment, offset, limit, address;
    uint32_t ctagOffset; NvHandle hVASpace; uint32_t internalflags, tag; int32_t numaNode;
} NV_MEMORY_ALLOCATION_PARAMS;
typedef struct { uint64_t base; uint64_t size; uint32_t addressSpace; uint32_t cacheAttrib; }
    NV_MEMORY_DESC_PARAMS;

typedef struct {
    uint64_t timeStamp; uint32_t info32; uint16_t info16; uint16_t status;
} NvNotification;

typedef struct {
    char driverVersionBuffer[256]; char versionBuffer[256]; char driverBranch[256]; char titleBuffer[256];
    uint32_t changelistNumber; uint32_t officialChangelistNumber;
} NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_V2_PARAMS;
typedef struct {
    uint32_t sizeOfStrings; uint64_t pDriverVersionBuffer, pVersionBuffer, pTitleBuffer;
    uint32_t changelistNumber, officialChangelistNumber;
} NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS;
typedef struct {
    uint32_t gpuId, gpuFlags, deviceInstance, subDeviceInstance, sliStatus, boardId, gpuInstance;
    int32_t numaId;
} NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS;
typedef struct { uint32_t numClasses; uint64_t classList; } NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS;
typedef struct { uint32_t index, flags, length; uint8_t data[256]; } NV2080_CTRL_GPU_GET_GID_INFO_PARAMS;
typedef struct {
    uint32_t gpuNameStringFlags; union { uint8_t ascii[64]; uint16_t unicode[64]; } gpuNameString;
} NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS;
typedef struct { uint32_t flags; uint32_t duration; } NV2080_CTRL_PERF_BOOST_PARAMS;
typedef struct { uint32_t index; uint32_t data; } NV2080_CTRL_GR_INFO;
typedef struct { uint32_t flags; uint64_t route; } NV2080_CTRL_GR_ROUTE_INFO;
typedef struct {
    uint32_t grInfoListSize; uint64_t grInfoList; NV2080_CTRL_GR_ROUTE_INFO grRouteInfo;
} NV2080_CTRL_GR_GET_INFO_PARAMS;
typedef struct {
    uint64_t addressArray[500]; uint32_t addressArraySize; uint32_t addressAlign;
    uint64_t memBlockSizeBytes; uint32_t flags;
} NV2080_CTRL_FB_FLUSH_GPU_CACHE_PARAMS;
typedef struct { uint8_t bEnable, bSkipSubmit, bSkipEnable; } NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS;
typedef struct { uint32_t workSubmitToken; } NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS;
"""

# 580 branch: VA-space params grew `pasid` (56 B), channel params carry tpcConfigID (368 B, since 570),
# UVM_MAX_GPUS = 256 (since 555), UVM_FREE still has `length`, UVM_UNREGISTER_CHANNEL still has the uuid.
_CDEF_580 = """
typedef struct {
    uint32_t index; uint32_t flags; uint64_t vaSize, vaStartInternal, vaLimitInternal; uint32_t bigPageSize;
    uint64_t vaBase; uint32_t pasid;
} NV_VASPACE_ALLOCATION_PARAMETERS;
typedef struct {
    NvHandle hObjectError, hObjectBuffer; uint64_t gpFifoOffset; uint32_t gpFifoEntries, flags;
    NvHandle hContextShare, hVASpace; NvHandle hUserdMemory[8]; uint64_t userdOffset[8];
    uint32_t engineType, cid, subDeviceId; NvHandle hObjectEccError;
    NV_MEMORY_DESC_PARAMS instanceMem, userdMem, ramfcMem, mthdbufMem;
    NvHandle hPhysChannelGroup; uint32_t internalFlags;
    NV_MEMORY_DESC_PARAMS errorNotifierMem, eccErrorNotifierMem;
    uint32_t ProcessID, SubProcessID; uint32_t encryptIv[3], decryptIv[3], hmacNonce[8]; uint32_t tpcConfigID;
} NV_CHANNEL_ALLOC_PARAMS;
typedef struct {
    uint64_t base; uint64_t length; uint64_t offset; UvmGpuMappingAttributes perGpuAttributes[256];
    uint64_t gpuAttributesCount; int32_t rmCtrlFd; NvHandle hClient; NvHandle hMemory; NV_STATUS rmStatus;
} UVM_MAP_EXTERNAL_ALLOCATION_PARAMS;
typedef struct { uint64_t base; uint64_t length; NV_STATUS rmStatus; } UVM_FREE_PARAMS;
typedef struct {
    NvProcessorUuid gpuUuid; NvHandle hClient; NvHandle hChannel; NV_STATUS rmStatus;
} UVM_UNREGISTER_CHANNEL_PARAMS;
"""

_BRANCH_CDEFS = {"580": _CDEF_580}

# Sizes computed with gcc from the 580.142 headers (NV-FACTS 1.4, 1.6, 2.3, 2.4, 3.2).
_SIZES_580 = {
    "nv_pci_info_t": 12,
    "nv_ioctl_card_info_t": 72,
    "nv_ioctl_rm_api_version_t": 72,
    "nv_ioctl_register_fd_t": 4,
    "NVOS00_PARAMETERS": 16,
    "NVOS21_PARAMETERS": 32,
    "NVOS64_PARAMETERS": 48,
    "NVOS54_PARAMETERS": 32,
    "NVOS02_PARAMETERS": 48,
    "nv_ioctl_nvos02_parameters_with_fd": 56,
    "NVOS33_PARAMETERS": 48,
    "nv_ioctl_nvos33_parameters_with_fd": 56,
    "NVOS34_PARAMETERS": 32,
    "UVM_INITIALIZE_PARAMS": 16,
    "UVM_MM_INITIALIZE_PARAMS": 8,
    "UVM_REGISTER_GPU_PARAMS": 40,
    "UVM_UNREGISTER_GPU_PARAMS": 20,
    "UVM_REGISTER_GPU_VASPACE_PARAMS": 32,
    "UVM_UNREGISTER_GPU_VASPACE_PARAMS": 20,
    "UVM_REGISTER_CHANNEL_PARAMS": 56,
    "UVM_UNREGISTER_CHANNEL_PARAMS": 28,
    "UVM_CREATE_EXTERNAL_RANGE_PARAMS": 24,
    "UvmGpuMappingAttributes": 36,
    "UVM_MAP_EXTERNAL_ALLOCATION_PARAMS": 9264,
    "UVM_FREE_PARAMS": 24,
    "UVM_UNMAP_EXTERNAL_PARAMS": 40,
    "NV0080_ALLOC_PARAMETERS": 56,
    "NV2080_ALLOC_PARAMETERS": 4,
    "NV_HOPPER_USERMODE_A_PARAMS": 2,
    "NV_VASPACE_ALLOCATION_PARAMETERS": 56,
    "NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS": 20,
    "NV_CTXSHARE_ALLOCATION_PARAMETERS": 12,
    "NV_CHANNEL_ALLOC_PARAMS": 368,
    "NV_MEMORY_DESC_PARAMS": 24,
    "NV_GR_ALLOCATION_PARAMETERS": 16,
    "NVB0B5_ALLOCATION_PARAMETERS": 8,
    "NV_MEMORY_ALLOCATION_PARAMS": 128,
    "NvNotification": 16,
    "NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_V2_PARAMS": 1032,
    "NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS": 40,
    "NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS": 32,
    "NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS": 16,
    "NV2080_CTRL_GPU_GET_GID_INFO_PARAMS": 268,
    "NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS": 132,  # u32 flags + union {u8[64], u16[64]}
    "NV2080_CTRL_PERF_BOOST_PARAMS": 8,
    "NV2080_CTRL_GR_INFO": 8,
    "NV2080_CTRL_GR_GET_INFO_PARAMS": 32,
    "NV2080_CTRL_FB_FLUSH_GPU_CACHE_PARAMS": 4024,
    "NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS": 3,
    "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS": 4,
}
# Field offsets spot-checked against the same table (the ones a misplaced pad would move).
_OFFSETS_580 = {
    ("nv_ioctl_card_info_t", "gpu_id"): 16,
    ("nv_ioctl_card_info_t", "minor_number"): 56,
    ("NVOS02_PARAMETERS", "pMemory"): 24,
    ("NVOS33_PARAMETERS", "pLinearAddress"): 32,
    ("NVOS33_PARAMETERS", "flags"): 44,
    ("nv_ioctl_nvos33_parameters_with_fd", "fd"): 48,
    ("UVM_REGISTER_GPU_PARAMS", "rmCtrlFd"): 24,
    ("UVM_REGISTER_CHANNEL_PARAMS", "base"): 32,
    ("UVM_MAP_EXTERNAL_ALLOCATION_PARAMS", "gpuAttributesCount"): 9240,
    ("UVM_MAP_EXTERNAL_ALLOCATION_PARAMS", "rmStatus"): 9260,
    ("NV0080_ALLOC_PARAMETERS", "vaMode"): 48,
    ("NV_VASPACE_ALLOCATION_PARAMETERS", "vaBase"): 40,
    ("NV_VASPACE_ALLOCATION_PARAMETERS", "pasid"): 48,
    ("NV_CHANNEL_ALLOC_PARAMS", "userdOffset"): 64,
    ("NV_CHANNEL_ALLOC_PARAMS", "engineType"): 128,
    ("NV_CHANNEL_ALLOC_PARAMS", "instanceMem"): 144,
    ("NV_CHANNEL_ALLOC_PARAMS", "errorNotifierMem"): 248,
    ("NV_CHANNEL_ALLOC_PARAMS", "ProcessID"): 296,
    ("NV_CHANNEL_ALLOC_PARAMS", "hmacNonce"): 328,
    ("NV_CHANNEL_ALLOC_PARAMS", "tpcConfigID"): 360,
    ("NV_MEMORY_ALLOCATION_PARAMS", "rangeLo"): 48,
    ("NV_MEMORY_ALLOCATION_PARAMS", "address"): 96,
    ("NV_MEMORY_ALLOCATION_PARAMS", "numaNode"): 120,
    ("NV2080_CTRL_GR_GET_INFO_PARAMS", "grRouteInfo"): 16,
    ("NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS", "gpuNameString"): 4,
    ("NV2080_CTRL_FB_FLUSH_GPU_CACHE_PARAMS", "flags"): 4016,
}

LAYOUTS: dict[str, dict[str, int]] = {"580": _SIZES_580}
_OFFSET_TABLES: dict[str, dict[tuple[str, str], int]] = {"580": _OFFSETS_580}


class UnsupportedDriverError(RuntimeError):
    """The installed driver branch has no verified layout table."""


class AbiLayoutError(RuntimeError):
    """A cffi declaration disagrees with the per-branch layout table."""


def driver_branch(version: str) -> str:
    """Map a version string such as "580.159.04" to its layout branch, or raise."""
    major = version.strip().split(".", 1)[0]
    if major not in LAYOUTS:
        raise UnsupportedDriverError(
            f"NVIDIA driver {version!r} (branch {major}) has no verified struct-layout table; "
            f"known branches: {sorted(LAYOUTS)}. Add its sizes to rawgrad/drivers/nv/abi.py LAYOUTS "
            "after checking the headers."
        )
    return major


class NVABI:
    """cffi types for one driver branch, with every size and key offset checked at construction."""

    def __init__(self, branch: str = "580") -> None:
        if branch not in LAYOUTS:
            raise UnsupportedDriverError(f"no layout table for driver branch {branch!r}")
        self.branch = branch
        self.sizes = LAYOUTS[branch]
        self.ffi = cffi.FFI()
        self.ffi.cdef(_COMMON_CDEF + _BRANCH_CDEFS[branch])
        for name, want in self.sizes.items():
            got = self.ffi.sizeof(name)
            if got != want:
                raise AbiLayoutError(f"{name}: cffi size {got} != {want} expected for branch {branch}")
        for (name, field), want in _OFFSET_TABLES[branch].items():
            got = self.ffi.offsetof(name, field)
            if got != want:
                raise AbiLayoutError(f"{name}.{field}: offset {got} != {want} expected for branch {branch}")

    def new(self, ctype: str, **fields: Any) -> Any:
        """A zeroed ``ctype`` (struct name) with the given fields set; returns a pointer cdata."""
        obj = self.ffi.new(ctype + " *")
        for k, v in fields.items():
            setattr(obj, k, v)
        return obj

    def sizeof(self, ctype: str) -> int:
        return int(self.ffi.sizeof(ctype))

    def addr(self, cdata: Any) -> int:
        """Integer address of a cdata pointer or array."""
        return int(self.ffi.cast("uintptr_t", cdata))

    def at(self, ctype: str, address: int) -> Any:
        """View the memory at ``address`` as ``ctype *`` (used by the mock to read user structs)."""
        return self.ffi.cast(ctype + " *", address)

    def rm_request(self, escape: int, ctype: str) -> int:
        """The ioctl request number of an RM escape carrying ``ctype``."""
        return iowr(NV_IOCTL_MAGIC, escape, self.sizeof(ctype))


_ABI_CACHE: dict[str, NVABI] = {}


def abi_for_branch(branch: str) -> NVABI:
    """The shared NVABI for ``branch`` (cffi type parsing is slow, so one instance per branch)."""
    if branch not in _ABI_CACHE:
        _ABI_CACHE[branch] = NVABI(branch)
    return _ABI_CACHE[branch]


# Structs that never drifted are usable before the branch is known (version probe, card info).
_BOOTSTRAP = cffi.FFI()
_BOOTSTRAP.cdef(_COMMON_CDEF)
assert _BOOTSTRAP.sizeof("nv_ioctl_rm_api_version_t") == 72


def query_driver_version(os_iface: Any, ctl_fd: int) -> str:
    """Driver version string via NV_ESC_CHECK_VERSION_STR in query mode (proxied by gVisor too)."""
    req = _BOOTSTRAP.new("nv_ioctl_rm_api_version_t *")
    req.cmd = NV_RM_API_VERSION_CMD_QUERY
    request = iowr(NV_IOCTL_MAGIC, NV_ESC_CHECK_VERSION_STR, _BOOTSTRAP.sizeof("nv_ioctl_rm_api_version_t"))
    try:
        os_iface.ioctl(ctl_fd, request, req)
    except OSError as e:
        raise OSError(e.errno, f"NV_ESC_CHECK_VERSION_STR (query) failed: {e}") from e
    if req.reply != NV_RM_API_VERSION_REPLY_RECOGNIZED:
        raise RuntimeError(f"NV_ESC_CHECK_VERSION_STR: reply {req.reply} (expected RECOGNIZED)")
    return _BOOTSTRAP.string(req.versionString).decode()
