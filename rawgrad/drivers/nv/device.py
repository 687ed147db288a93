"""NVIDIA device bring-up on the OS seam (NV-FACTS section 2, with the Hopper class choices)."""

from __future__ import annotations

import errno as _errno
from collections.abc import Callable
from typing import Any

from rawgrad.drivers import osapi
from rawgrad.drivers.nv import abi
from rawgrad.drivers.nv import pushbuf as pbuf
from rawgrad.drivers.nv.gpfifo import Channel, NVChannelError, read_u64, write_u64
from rawgrad.drivers.nv.memory import MemoryKind, NVBuffer, round_up
from rawgrad.drivers.nv.rm import UVM, NVError, RMClient, read_card_info, register_fd
from rawgrad.drivers.osapi import OSInterface
from rawgrad.hcq.errors import DeviceTimeout
from rawgrad.hcq.signal import wait_until
from rawgrad.hcq.va import VARangeAllocator

CTL_PATH = "/dev/nvidiactl"
UVM_PATH = "/dev/nvidia-uvm"
OPEN_FLAGS = osapi.O_RDWR | osapi.O_CLOEXEC

# GPU VA space (NV-FACTS 2.2 step 15): base 0x1000, size 0x1_FFFF_FB00_0000, flags 0x48.
VASPACE_BASE = 0x1000
VASPACE_SIZE = 0x1_FFFF_FB00_0000
# CPU+GPU shared window: every buffer's GPU VA == its CPU VA and stays below 2^40
# (GP entry / SEND_PCAS address limit).
DEFAULT_WINDOW_BASE = 0x10_0000_0000
DEFAULT_WINDOW_SIZE = 0x40_0000_0000  # 256 GiB of reserved (PROT_NONE, NORESERVE) address space
WINDOW_BASE_STRIDE = 0x10_0000_0000  # next candidate base if the preferred one is taken
GPU_VA_LIMIT = 1 << 40

UVM_CHANNEL_RANGE_BYTES = 0x4000000  # NV-FACTS 2.2 step 28: 64 MiB per registered channel
HUGE_PAGE = 2 << 20
SMALL_PAGE = 0x1000
HUGE_PAGE_THRESHOLD = 8 << 20  # VRAM >= 8 MiB uses 2 MiB pages (NV-FACTS 3.2 policy)
SIGNAL_SLOT_BYTES = 16  # u64 value + u64 timestamp (NV-FACTS 8)
SIGNAL_PAGE_BYTES = 0x1000
NOTIFIER_BYTES = 0x1000  # three 16-byte NvNotification records fit; a page keeps mappings simple
USERD_ALIGN = 512  # NV_RAMUSERD base alignment (USERD records are 512 bytes)

# NV_MEMORY_ALLOCATION_PARAMS values (NV-FACTS 3.2)
VRAM_ALLOC_FLAGS = (
    abi.NVOS32_ALLOC_FLAGS_IGNORE_BANK_PLACEMENT
    | abi.NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE
    | abi.NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED
    | abi.NVOS32_ALLOC_FLAGS_MAP_NOT_REQUIRED
    | abi.NVOS32_ALLOC_FLAGS_PERSISTENT_VIDMEM
)  # 0x1C101
SYSMEM_ALLOC_FLAGS = VRAM_ALLOC_FLAGS & ~abi.NVOS32_ALLOC_FLAGS_PERSISTENT_VIDMEM  # 0xC101
OS_DESCRIPTOR_FLAGS = (
    (abi.NVOS02_FLAGS_PHYSICALITY_NONCONTIGUOUS << abi.NVOS02_FLAGS_PHYSICALITY_SHIFT)
    | (abi.NVOS02_FLAGS_COHERENCY_CACHED << abi.NVOS02_FLAGS_COHERENCY_SHIFT)
    | (abi.NVOS02_FLAGS_MAPPING_NO_MAP << abi.NVOS02_FLAGS_MAPPING_SHIFT)
)  # 0x40001010


def vram_attrs(huge: bool, contiguous: bool) -> tuple[int, int]:
    """(attr, attr2) for a VRAM allocation."""
    phys = (
        abi.NVOS32_ATTR_PHYSICALITY_CONTIGUOUS
        if contiguous
        else abi.NVOS32_ATTR_PHYSICALITY_ALLOW_NONCONTIGUOUS
    )
    attr = phys << abi.NVOS32_ATTR_PHYSICALITY_SHIFT
    attr2 = abi.NVOS32_ATTR2_ZBC_PREFER_NO_ZBC | (
        abi.NVOS32_ATTR2_GPU_CACHEABLE_YES << abi.NVOS32_ATTR2_GPU_CACHEABLE_SHIFT
    )
    if huge:
        attr |= abi.NVOS32_ATTR_PAGE_SIZE_HUGE << abi.NVOS32_ATTR_PAGE_SIZE_SHIFT
        attr2 |= abi.NVOS32_ATTR2_PAGE_SIZE_HUGE_2MB << abi.NVOS32_ATTR2_PAGE_SIZE_HUGE_SHIFT
    return attr, attr2


SYSMEM_ATTR = (
    (abi.NVOS32_ATTR_LOCATION_PCI << abi.NVOS32_ATTR_LOCATION_SHIFT)
    | (abi.NVOS32_ATTR_PHYSICALITY_ALLOW_NONCONTIGUOUS << abi.NVOS32_ATTR_PHYSICALITY_SHIFT)
    | (abi.NVOS32_ATTR_COHERENCY_UNCACHED << abi.NVOS32_ATTR_COHERENCY_SHIFT)
)  # 0x1A000000
SYSMEM_ATTR2 = abi.NVOS32_ATTR2_ZBC_PREFER_NO_ZBC | (
    abi.NVOS32_ATTR2_GPU_CACHEABLE_NO << abi.NVOS32_ATTR2_GPU_CACHEABLE_SHIFT
)


def pick_class(available: set[int], preferred: tuple[int, ...], what: str) -> int:
    for cls in preferred:
        if cls in available:
            return cls
    names = ", ".join(abi.CLASS_NAMES.get(c, hex(c)) for c in preferred)
    raise NVError(f"class selection ({what})", detail=f"device exposes none of [{names}]")


class NVDevice:
    """One NVIDIA GPU brought up through RM/UVM ioctls on an :class:`OSInterface`.

    Owns: RM client/device/subdevice, usermode doorbell mapping, VA space registered with UVM, a TSG with a
    compute and a copy GPFIFO channel, a signal page, and every buffer it allocates. ``close()`` frees all of
    it (also run automatically when bring-up fails half way).
    """

    def __init__(
        self,
        os_iface: OSInterface,
        *,
        index: int = 0,
        gpfifo_entries: int = 0x10000,
        pushbuf_bytes: int = 1 << 20,
        window_base: int = DEFAULT_WINDOW_BASE,
        window_size: int = DEFAULT_WINDOW_SIZE,
        timeout_s: float = 10.0,
        name: str | None = None,
    ):
        self.os, self.index, self.timeout_s = os_iface, index, timeout_s
        # what errors call it: the HCQ device's name when one owns it ("NV" for card 0)
        self.name = f"NV:{index}" if name is None else name
        self._channels: list[Channel] = []  # as they are made (a failed bring-up may have made one)
        self._cleanup: list[tuple[str, Callable[[], None]]] = []
        self.buffers: dict[int, NVBuffer] = {}
        self.closed = False
        try:
            self._bring_up(gpfifo_entries, pushbuf_bytes, window_base, window_size)
        except BaseException as e:
            try:
                self.close()
            except Exception as close_err:  # keep the original failure as the primary error
                e.add_note(f"cleanup after failed bring-up also failed: {close_err}")
            raise

    # ==========================================================================================
    def _on_close(self, what: str, fn: Callable[[], None]) -> None:
        self._cleanup.append((what, fn))

    def _open(self, path: str) -> int:
        fd = self.os.open(path, OPEN_FLAGS)
        return fd

    def _open_kept(self, path: str) -> int:
        fd = self._open(path)
        self._on_close(f"close {path}", lambda: self.os.close(fd))
        return fd

    def _alloc_obj(self, parent: int, cls: int, params: Any = None, handle: int = 0) -> int:
        h = self.rm.alloc(parent, cls, params, handle)
        self._on_close(f"free {abi.CLASS_NAMES.get(cls, hex(cls))} {h:#x}", lambda: self.rm.free(h))
        return h

    def _bring_up(self, entries: int, pb_bytes: int, window_base: int, window_size: int) -> None:
        """Bring the GPU up in NV-FACTS 2.2's order, one named step per method. Each step registers the
        undo of every object it makes (`_on_close`) as it makes it, so a failure half way leaves exactly
        the made objects for `close()` to free, newest first."""
        self._open_control()
        self._open_uvm()
        self._open_gpu_node()
        self._alloc_device()
        self._pick_classes()
        self._map_usermode()
        self._alloc_vaspace()
        self.gr_info = self._gr_info()  # topology (NV-FACTS 2.2 step 31)
        self._reserve_shared_window(window_base, window_size)
        self._alloc_signal_page()
        self._create_channels(entries, pb_bytes)
        self._bootstrap_channels()

    def _open_control(self) -> None:
        """Open /dev/nvidiactl, read the driver version (it picks the struct layout table) and allocate
        the RM root client on it (NV-FACTS 2.2 steps 1-3). Every later RM object hangs off this client."""
        self.ctl_fd = self._open_kept(CTL_PATH)
        self.driver_version = abi.query_driver_version(self.os, self.ctl_fd)
        self.abi = abi.abi_for_branch(abi.driver_branch(self.driver_version))
        self.rm = RMClient(self.os, self.ctl_fd, self.abi)
        self._on_close("free root client", lambda: self.rm.free(self.rm.root))

    def _open_uvm(self) -> None:
        """Open the primary /dev/nvidia-uvm fd and UVM_INITIALIZE it, then a second fd tied to the
        process's mm with UVM_MM_INITIALIZE (steps 1, 4, 5); the second may fail, as CUDA tolerates."""
        self.uvm_fd = self._open_kept(UVM_PATH)
        self.uvm = UVM(self.os, self.uvm_fd, self.abi)
        self.uvm.initialize()
        self.uvm_mm_fd = self._open_kept(UVM_PATH)
        try:
            UVM(self.os, self.uvm_mm_fd, self.abi).mm_initialize(self.uvm_fd)
        except NVError:
            pass

    def _open_gpu_node(self) -> None:
        """Enumerate the GPUs (NV_ESC_CARD_INFO on ctl), open /dev/nvidia<minor> for this index and link
        it to the ctl fd with NV_ESC_REGISTER_FD (steps 6-7); the fd stays open for the device's life."""
        cards = read_card_info(self.os, self.ctl_fd, self.abi)
        if self.index >= len(cards):
            raise NVError(
                "NV_ESC_CARD_INFO", detail=f"GPU index {self.index} requested, {len(cards)} present"
            )
        card = cards[self.index]
        self.gpu_id, self.minor = int(card.gpu_id), int(card.minor_number)
        self.pci_device_id = int(card.pci_info.device_id)
        self.gpu_path = f"/dev/nvidia{self.minor}"
        self.gpu_fd = self._open_kept(self.gpu_path)
        register_fd(self.os, self.gpu_fd, self.ctl_fd, self.abi)

    def _alloc_device(self) -> None:
        """Map the GPU id to its device instance (GPU_GET_ID_INFO_V2 on the client), then allocate
        NV01_DEVICE_0 under the client and NV20_SUBDEVICE_0 under the device (steps 8-10)."""
        info = self.rm.control(
            self.rm.root,
            abi.NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2,
            self.abi.new("NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS", gpuId=self.gpu_id),
        )
        self.device = self._alloc_obj(
            self.rm.root,
            abi.NV01_DEVICE_0,
            self.abi.new(
                "NV0080_ALLOC_PARAMETERS",
                deviceId=info.deviceInstance,
                hClientShare=self.rm.root,
                vaMode=abi.NV0080_ALLOC_VAMODE_OPTIONAL_MULTIPLE_VASPACES,
            ),
        )
        self.subdevice = self._alloc_obj(
            self.device, abi.NV20_SUBDEVICE_0, self.abi.new("NV2080_ALLOC_PARAMETERS", subDeviceId=0)
        )

    def _pick_classes(self) -> None:
        """Read the device's class list (GPU_GET_CLASSLIST, step 12) and pick the newest usermode,
        GPFIFO, compute and copy classes this code knows; allocates nothing."""
        self.classes = self._class_list()
        self.usermode_class = pick_class(self.classes, abi.USERMODE_CLASSES, "usermode")
        self.gpfifo_class = pick_class(self.classes, abi.GPFIFO_CLASSES, "GPFIFO channel")
        self.compute_class = pick_class(self.classes, abi.COMPUTE_CLASSES, "compute")
        self.copy_class = pick_class(self.classes, abi.COPY_CLASSES, "copy")
        self.host = pbuf.HOST_CLASSES[self.gpfifo_class]
        self.copy_info = pbuf.COPY_CLASSES[self.copy_class]

    def _map_usermode(self) -> None:
        """Allocate the usermode object under the subdevice and CPU-map its MMIO (step 13): the
        doorbell that submits work and the GPU timer."""
        um_params = (
            self.abi.new("NV_HOPPER_USERMODE_A_PARAMS")
            if abi.ALLOC_PARAM_TYPES.get(self.usermode_class)
            else None
        )
        self.usermode = self._alloc_obj(self.subdevice, self.usermode_class, um_params)
        self.usermode_addr = self._map_to_cpu(
            self.subdevice, self.usermode, pbuf.USERMODE_MAP_BYTES, 0, node="gpu"
        )
        self.doorbell_addr = self.usermode_addr + pbuf.USERMODE_NOTIFY_CHANNEL_PENDING

    def _alloc_vaspace(self) -> None:
        """Allocate the GPU VA space (FERMI_VASPACE_A under the device), read the GPU's UUID
        (GPU_GET_GID_INFO on the subdevice), then UVM_REGISTER_GPU and UVM_REGISTER_GPU_VASPACE hand
        that VA space to UVM (steps 15-18); both registrations are undone on close."""
        flags = (
            abi.NV_VASPACE_ALLOCATION_FLAGS_ENABLE_PAGE_FAULTING
            | abi.NV_VASPACE_ALLOCATION_FLAGS_IS_EXTERNALLY_OWNED
        )
        self.vaspace = self._alloc_obj(
            self.device,
            abi.FERMI_VASPACE_A,
            self.abi.new(
                "NV_VASPACE_ALLOCATION_PARAMETERS", flags=flags, vaBase=VASPACE_BASE, vaSize=VASPACE_SIZE
            ),
        )
        gid = self.rm.control(
            self.subdevice,
            abi.NV2080_CTRL_CMD_GPU_GET_GID_INFO,
            self.abi.new(
                "NV2080_CTRL_GPU_GET_GID_INFO_PARAMS",
                flags=abi.NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY,
                length=abi.NV2080_GPU_GID_BINARY_LENGTH,
            ),
        )
        self.uuid = bytes(gid.data[0 : abi.NV2080_GPU_GID_BINARY_LENGTH])
        self.uvm.register_gpu(self.uuid)
        self._on_close("UVM_UNREGISTER_GPU", lambda: self.uvm.unregister_gpu(self.uuid))
        self.uvm.register_gpu_vaspace(self.uuid, self.ctl_fd, self.rm.root, self.vaspace)
        self._on_close("UVM_UNREGISTER_GPU_VASPACE", lambda: self.uvm.unregister_gpu_vaspace(self.uuid))

    def _reserve_shared_window(self, window_base: int, window_size: int) -> None:
        """Reserve the CPU address window every buffer lives in (its GPU VA equals its CPU VA) and the
        allocator that hands out ranges of it; no RM or UVM object is made here."""
        self.window_base = self._reserve_window(window_base, window_size)
        self.window_size = window_size
        self.va = VARangeAllocator(self.window_base, window_size, alignment=SMALL_PAGE)

    def _alloc_signal_page(self) -> None:
        """One host page registered with RM and mapped into the GPU VA space through UVM (an OS
        descriptor, NV-FACTS 3.3; step 32), cut into 16-byte signal slots handed out from the top; it
        also holds the channels' retirement counters."""
        self.signal_page = self.alloc_host(SIGNAL_PAGE_BYTES)
        self._free_slots = list(
            range(
                self.signal_page.va + SIGNAL_PAGE_BYTES - SIGNAL_SLOT_BYTES,
                self.signal_page.va - 1,
                -SIGNAL_SLOT_BYTES,
            )
        )

    def _create_channels(self, entries: int, pb_bytes: int) -> None:
        """The TSG (KEPLER_CHANNEL_GROUP_A under the device), its subcontext (FERMI_CONTEXT_SHARE_A on
        the VA space), one contiguous VRAM block holding both rings and their USERD records, the compute
        and the copy channel (each with its notifier, engine object and UVM registration: `_channel`),
        and last GPFIFO_SCHEDULE on the TSG (steps 20-29)."""
        self.tsg = self._alloc_obj(
            self.device,
            abi.KEPLER_CHANNEL_GROUP_A,
            self.abi.new(
                "NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS", engineType=abi.NV2080_ENGINE_TYPE_GRAPHICS
            ),
        )
        self.ctxshare = self._alloc_obj(
            self.tsg,
            abi.FERMI_CONTEXT_SHARE_A,
            self.abi.new(
                "NV_CTXSHARE_ALLOCATION_PARAMETERS",
                hVASpace=self.vaspace,
                flags=abi.NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC,
            ),
        )
        ring_bytes = round_up(entries * pbuf.GP_ENTRY_BYTES, USERD_ALIGN)
        region = round_up(ring_bytes + pbuf.USERD_BYTES, SMALL_PAGE)
        self.gpfifo_mem = self.alloc_vram(2 * region, contiguous=True)
        self.compute = self._channel("compute", self.compute_class, 0, ring_bytes, entries, pb_bytes)
        self.copy = self._channel("copy", self.copy_class, region, ring_bytes, entries, pb_bytes)
        self.rm.control(
            self.tsg,
            abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE,
            self.abi.new("NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS", bEnable=1),
        )

    def _bootstrap_channels(self) -> None:
        """Take the timeline signal, bind the compute class (and place its shared/local memory windows)
        on the compute channel, then have the copy channel wait for that, bind the copy class and
        signal; the CPU waits for both, which proves both channels run (steps 33-34). No RM object."""
        self.timeline = self.alloc_signal()
        self.timeline_value = 0
        boot = pbuf.compute_bootstrap(pbuf.PushBuffer(), self.compute_class)
        self.compute.submit(self.signal_next(boot))
        copy_boot = pbuf.sem_acquire(pbuf.PushBuffer(), self.host, self.timeline, self.timeline_value)
        pbuf.set_object(copy_boot, pbuf.SUBCH_COPY, self.copy_class)
        self.copy.submit(self.signal_next(copy_boot))
        self.wait_signal(self.timeline, self.timeline_value)

    # ==========================================================================================
    def _class_list(self) -> set[int]:
        p = self.rm.control(
            self.device,
            abi.NV0080_CTRL_CMD_GPU_GET_CLASSLIST,
            self.abi.new("NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS"),
        )
        arr = self.abi.ffi.new("uint32_t[]", p.numClasses)
        self.rm.control(
            self.device,
            abi.NV0080_CTRL_CMD_GPU_GET_CLASSLIST,
            self.abi.new(
                "NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS", numClasses=p.numClasses, classList=self.abi.addr(arr)
            ),
        )
        return {int(arr[i]) for i in range(p.numClasses)}

    def _gr_info(self) -> dict[str, int]:
        names = {
            "sm_version": abi.NV2080_CTRL_GR_INFO_INDEX_SM_VERSION,
            "gpcs": abi.NV2080_CTRL_GR_INFO_INDEX_LITTER_NUM_GPCS,
            "tpc_per_gpc": abi.NV2080_CTRL_GR_INFO_INDEX_LITTER_NUM_TPC_PER_GPC,
            "sm_per_tpc": abi.NV2080_CTRL_GR_INFO_INDEX_LITTER_NUM_SM_PER_TPC,
            "max_warps_per_sm": abi.NV2080_CTRL_GR_INFO_INDEX_MAX_WARPS_PER_SM,
        }
        lst = self.abi.ffi.new("NV2080_CTRL_GR_INFO[]", [{"index": i} for i in names.values()])
        self.rm.control(
            self.subdevice,
            abi.NV2080_CTRL_CMD_GR_GET_INFO,
            self.abi.new(
                "NV2080_CTRL_GR_GET_INFO_PARAMS", grInfoListSize=len(names), grInfoList=self.abi.addr(lst)
            ),
        )
        return {k: int(lst[i].data) for i, k in enumerate(names)}

    def _reserve_window(self, base: int, size: int) -> int:
        flags = osapi.MAP_PRIVATE | osapi.MAP_ANONYMOUS | osapi.MAP_NORESERVE | osapi.MAP_FIXED_NOREPLACE
        candidate = base
        while candidate + size <= GPU_VA_LIMIT:
            try:
                got = self.os.mmap(candidate, size, osapi.PROT_NONE, flags, -1, 0)
            except OSError as e:
                if e.errno != _errno.EEXIST:
                    raise
                got = None
            if got == candidate:
                self._on_close("unreserve VA window", _bind(self.os.munmap, candidate, size))
                return candidate
            if got is not None:  # kernel without MAP_FIXED_NOREPLACE treated it as a hint
                self.os.munmap(got, size)
            candidate += WINDOW_BASE_STRIDE
        raise NVError(
            "VA window reservation", detail=f"no free {size:#x}-byte window below 2^40 from {base:#x}"
        )

    def _rereserve(self, va: int, size: int) -> None:
        flags = osapi.MAP_PRIVATE | osapi.MAP_ANONYMOUS | osapi.MAP_NORESERVE | osapi.MAP_FIXED
        self.os.mmap(va, size, osapi.PROT_NONE, flags, -1, 0)

    def _map_to_cpu(self, device: int, memory: int, size: int, target: int, node: str) -> int:
        """RM_MAP_MEMORY on a fresh fd + mmap; ``target`` 0 lets the kernel choose the address."""
        fd = self._open(self.gpu_path if node == "gpu" else CTL_PATH)
        try:
            if node == "gpu":
                register_fd(self.os, fd, self.ctl_fd, self.abi)
            cookie = self.rm.map_memory(device, memory, 0, size, fd)
            flags = osapi.MAP_SHARED | (osapi.MAP_FIXED if target else 0)
            addr = self.os.mmap(target, size, osapi.PROT_READ | osapi.PROT_WRITE, flags, fd, 0)
        finally:
            self.os.close(fd)  # the mapping keeps the file alive

        def unmap() -> None:
            if target:
                self._rereserve(addr, size)
            else:
                self.os.munmap(addr, size)
            self.rm.unmap_memory(device, memory, cookie)

        self._on_close(f"unmap {memory:#x}", unmap)
        return addr

    def _channel(
        self, name: str, engine_cls: int, offset: int, ring_bytes: int, entries: int, pb_bytes: int
    ) -> Channel:
        notifier = self.alloc_sysmem(NOTIFIER_BYTES)
        gp_va = self.gpfifo_mem.va + offset
        params = self.abi.new(
            "NV_CHANNEL_ALLOC_PARAMS",
            hObjectError=notifier.handle,
            hObjectBuffer=self.gpfifo_mem.handle,
            gpFifoOffset=gp_va,
            gpFifoEntries=entries,
            hContextShare=self.ctxshare,
        )
        params.hUserdMemory[0] = self.gpfifo_mem.handle
        params.userdOffset[0] = offset + ring_bytes
        handle = self._alloc_obj(self.tsg, self.gpfifo_class, params)
        self._alloc_obj(handle, engine_cls)
        tok = self.rm.control(
            handle,
            abi.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN,
            self.abi.new(
                "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS",
                workSubmitToken=abi.WORK_SUBMIT_TOKEN_UNSET,
            ),
        )
        uvm_va = self.va.alloc(UVM_CHANNEL_RANGE_BYTES, HUGE_PAGE)
        self.uvm.register_channel(
            self.uuid, self.ctl_fd, self.rm.root, handle, uvm_va, UVM_CHANNEL_RANGE_BYTES
        )

        def unregister() -> None:
            self.uvm.unregister_channel(self.uuid, self.rm.root, handle)
            self.va.free(uvm_va)

        self._on_close(f"UVM_UNREGISTER_CHANNEL {name}", unregister)
        pb = self.alloc_vram(pb_bytes)
        retire = self.alloc_signal()
        channel = Channel(
            name=name,
            device_name=self.name,
            os_iface=self.os,
            host=self.host,
            token=int(tok.workSubmitToken),
            gpfifo_addr=gp_va,
            entries=entries,
            userd_addr=self.gpfifo_mem.va + offset + ring_bytes,
            pb_addr=pb.va,
            pb_bytes=pb.size,
            doorbell_addr=self.doorbell_addr,
            retire_addr=retire,
            notifier_addr=notifier.va,
            timeout_s=self.timeout_s,
        )
        self._channels.append(channel)
        return channel

    # ==========================================================================================
    # Memory
    def _gpu_map(self, buf: NVBuffer) -> None:
        self.uvm.create_external_range(buf.va, buf.size)
        try:
            self.uvm.map_external_allocation(
                self.uuid, buf.va, buf.size, self.ctl_fd, self.rm.root, buf.handle
            )
        except NVError:
            self.uvm.free(buf.va, buf.size)
            raise
        buf.uvm_mapped = True

    def _register(self, buf: NVBuffer, undo: list[Callable[[], None]]) -> NVBuffer:
        buf.meta["undo"] = undo
        self.buffers[buf.va] = buf
        self._on_close(f"free {buf.kind} buffer {buf.va:#x}", lambda: self._release(buf))
        return buf

    def _run_undo(self, undo: list[Callable[[], None]]) -> None:
        errors = []
        for fn in reversed(undo):
            try:
                fn()
            except Exception as e:  # keep releasing the rest
                errors.append(e)
        if errors:
            raise errors[0]

    def _alloc_rm_memory(
        self, cls: int, size: int, align: int, attr: int, attr2: int, flags: int, mem_type: int
    ) -> int:
        handle = self.rm.pick_handle()
        params = self.abi.new(
            "NV_MEMORY_ALLOCATION_PARAMS",
            owner=self.rm.root,
            type=mem_type,
            flags=flags,
            attr=attr,
            attr2=attr2,
            format=abi.NV_MMU_PTE_KIND_GENERIC_MEMORY,
            size=size,
            alignment=align,
            limit=size - 1,
        )
        return self.rm.alloc(self.device, cls, params, handle)

    def alloc_vram(self, size: int, *, cpu_map: bool = True, contiguous: bool = False) -> NVBuffer:
        """Device memory at a GPU VA; CPU-mapped (BAR1) at the same address unless ``cpu_map`` is False."""
        if size <= 0:
            raise ValueError(f"VRAM allocation size must be positive, got {size}")
        huge = size >= HUGE_PAGE_THRESHOLD
        page = HUGE_PAGE if huge else SMALL_PAGE
        size = round_up(size, page)
        attr, attr2 = vram_attrs(huge, contiguous)
        undo: list[Callable[[], None]] = []
        try:
            va = self.va.alloc(size, page)
            undo.append(lambda: self.va.free(va))
            handle = self._alloc_rm_memory(
                abi.NV01_MEMORY_LOCAL_USER, size, page, attr, attr2, VRAM_ALLOC_FLAGS, abi.NVOS32_TYPE_IMAGE
            )
            undo.append(lambda: self.rm.free(handle))
            buf = NVBuffer(MemoryKind.VRAM, handle, va, size, cpu_mapped=cpu_map)
            if cpu_map:
                self._map_to_cpu(self.device, handle, size, va, node="gpu")
                undo.append(self._pop_cleanup())
            self._gpu_map(buf)
            undo.append(lambda: self.uvm.free(va, size))
        except BaseException:
            self._run_undo(undo)
            raise
        return self._register(buf, undo)

    def alloc_sysmem(self, size: int) -> NVBuffer:
        """RM-allocated system memory, CPU-mapped through a fresh control-node fd (not GPU-mapped)."""
        size = round_up(size, SMALL_PAGE)
        undo: list[Callable[[], None]] = []
        try:
            va = self.va.alloc(size, SMALL_PAGE)
            undo.append(lambda: self.va.free(va))
            handle = self._alloc_rm_memory(
                abi.NV01_MEMORY_SYSTEM,
                size,
                SMALL_PAGE,
                SYSMEM_ATTR,
                SYSMEM_ATTR2,
                SYSMEM_ALLOC_FLAGS,
                abi.NVOS32_TYPE_NOTIFIER,
            )
            undo.append(lambda: self.rm.free(handle))
            self._map_to_cpu(self.device, handle, size, va, node="ctl")
            undo.append(self._pop_cleanup())
        except BaseException:
            self._run_undo(undo)
            raise
        return self._register(NVBuffer(MemoryKind.SYSMEM, handle, va, size, cpu_mapped=True), undo)

    def alloc_host(self, size: int) -> NVBuffer:
        """Anonymous host pages registered with RM (OS descriptor) and UVM-mapped at their CPU address."""
        size = round_up(size, SMALL_PAGE)
        undo: list[Callable[[], None]] = []
        try:
            va = self.va.alloc(size, SMALL_PAGE)
            undo.append(lambda: self.va.free(va))
            self.os.mmap(
                va,
                size,
                osapi.PROT_READ | osapi.PROT_WRITE,
                osapi.MAP_SHARED | osapi.MAP_ANONYMOUS | osapi.MAP_FIXED,
                -1,
                0,
            )
            undo.append(lambda: self._rereserve(va, size))
            handle = self.rm.alloc_os_descriptor(self.gpu_fd, self.device, va, size, OS_DESCRIPTOR_FLAGS)
            undo.append(lambda: self.rm.free(handle))
            buf = NVBuffer(MemoryKind.HOST, handle, va, size, cpu_mapped=True)
            self._gpu_map(buf)
            undo.append(lambda: self.uvm.free(va, size))
        except BaseException:
            self._run_undo(undo)
            raise
        return self._register(buf, undo)

    def _pop_cleanup(self) -> Callable[[], None]:
        """Move the most recent close() action (a CPU mapping's undo) into a buffer's own undo list."""
        _, fn = self._cleanup.pop()
        return fn

    def _release(self, buf: NVBuffer) -> None:
        if self.buffers.pop(buf.va, None) is None:
            return
        self._run_undo(buf.meta.pop("undo"))

    def free(self, buf: NVBuffer) -> None:
        """Release a buffer now: GPU unmap, CPU unmap, RM free, VA range back to the allocator."""
        if buf.va not in self.buffers:
            raise ValueError(f"{self.name}: buffer at {buf.va:#x} is not live on this device")
        self._cleanup = [(w, f) for (w, f) in self._cleanup if w != f"free {buf.kind} buffer {buf.va:#x}"]
        self._release(buf)

    # ==========================================================================================
    # Signals, timer, waits
    def alloc_signal(self) -> int:
        """A zeroed 16-byte signal slot (u64 value, u64 timestamp) in host memory; returns its address.

        When every slot is taken another host page is registered (freed with the device)."""
        if not self._free_slots:
            page = self.alloc_host(SIGNAL_PAGE_BYTES)
            self._free_slots = list(range(page.va + SIGNAL_PAGE_BYTES - SIGNAL_SLOT_BYTES, page.va - 1,
                                          -SIGNAL_SLOT_BYTES))
        addr = self._free_slots.pop()
        write_u64(addr, 0)
        write_u64(addr + 8, 0)
        return addr

    def free_signal(self, addr: int) -> None:
        self._free_slots.append(addr)

    def signal_next(self, pb: pbuf.PushBuffer) -> pbuf.PushBuffer:
        """Append a release of the device timeline's next value to ``pb``."""
        self.timeline_value += 1
        return pbuf.sem_release(pb, self.host, self.timeline, self.timeline_value)

    def check_errors(self) -> None:
        for ch in self._channels:  # on every replay: no list built here
            ch.check_error()

    @property
    def channels(self) -> list[Channel]:
        return list(self._channels)

    def wait_signal(self, addr: int, value: int, timeout_s: float | None = None) -> None:
        """Wait until the u64 at ``addr`` >= ``value``; DeviceTimeout names device, signal and values."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        wait_until(
            lambda: read_u64(addr) >= value,
            timeout,
            lambda: DeviceTimeout(self.name, "host", f"signal {addr:#x}", value, read_u64(addr), timeout),
            self.check_errors,
        )

    def read_timer_ns(self) -> int:
        """GPU PTIMER from usermode MMIO (read hi, lo, hi; retry if hi changed)."""
        while True:
            hi = self.os.mmio_read32(self.usermode_addr + pbuf.USERMODE_TIME_1)
            lo = self.os.mmio_read32(self.usermode_addr + pbuf.USERMODE_TIME_0)
            if self.os.mmio_read32(self.usermode_addr + pbuf.USERMODE_TIME_1) == hi:
                return (hi << 32) | lo

    # ==========================================================================================
    def synchronize(self, timeout_s: float | None = None) -> None:
        for ch in self.channels:
            ch.wait_idle(timeout_s)

    def close(self) -> None:
        """Free every object, mapping, range and fd in reverse creation order; report all failures."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.channels and not any(_has_error(c) for c in self.channels):
                self.synchronize(timeout_s=min(self.timeout_s, 2.0))
        except (NVChannelError, TimeoutError):
            pass  # tear down anyway; the GPU work is abandoned
        errors: list[str] = []
        while self._cleanup:
            what, fn = self._cleanup.pop()
            try:
                fn()
            except Exception as e:
                errors.append(f"{what}: {e}")
        if errors:
            raise NVError(f"{self.name} close", detail="; ".join(errors))

    def __enter__(self) -> NVDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _bind(fn: Callable[..., None], *args: Any) -> Callable[[], None]:
    return lambda: fn(*args)


def _has_error(ch: Channel) -> bool:
    try:
        ch.check_error()
    except NVChannelError:
        return True
    return False
