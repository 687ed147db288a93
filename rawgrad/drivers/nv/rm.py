"""RM (resource manager) and UVM calls on the OS seam, with errors that name what failed."""

from __future__ import annotations

import errno as _errno
from typing import Any

from rawgrad.drivers.nv import abi
from rawgrad.drivers.osapi import OSInterface


class NVError(RuntimeError):
    """A failed RM/UVM call: names the escape/control/class and the NV status (or errno)."""

    def __init__(self, op: str, status: int | None = None, *, errno: int | None = None, detail: str = ""):
        self.op, self.status, self.errno = op, status, errno
        why = abi.status_name(status) if status is not None else ""
        if status is not None:
            why += f" ({status:#x})"
        if errno is not None:
            why = f"ioctl errno {_errno.errorcode.get(errno, errno)}" + (f", {why}" if why else "")
        super().__init__(f"{op} failed: {why}" + (f" [{detail}]" if detail else ""))

    @property
    def status_name(self) -> str | None:
        return abi.status_name(self.status) if self.status is not None else None


def _class_name(cls: int) -> str:
    return f"{abi.CLASS_NAMES.get(cls, 'class')}({cls:#x})"


def _control_name(cmd: int) -> str:
    return f"{abi.CONTROL_NAMES.get(cmd, 'control')}({cmd:#x})"


# Handles the client picks itself (OS-descriptor memory needs a caller-chosen handle; NV-FACTS 3.3).
CLIENT_CHOSEN_HANDLE_BASE = 0x5A000000


class RMClient:
    """One RM client (root object) on a ``/dev/nvidiactl`` fd."""

    def __init__(self, os_iface: OSInterface, ctl_fd: int, nvabi: abi.NVABI):
        self.os, self.ctl_fd, self.abi = os_iface, ctl_fd, nvabi
        self.parents: dict[int, int] = {}
        self._next_handle = CLIENT_CHOSEN_HANDLE_BASE
        self.root = self.alloc(0, abi.NV01_ROOT_CLIENT)

    def _ioctl(self, fd: int, escape: int, ctype: str, buf: Any, what: str) -> None:
        try:
            self.os.ioctl(fd, self.abi.rm_request(escape, ctype), buf)
        except OSError as e:
            raise NVError(
                f"{abi.ESCAPE_NAMES.get(escape, hex(escape))} {what}", errno=e.errno, detail=str(e)
            ) from e

    def pick_handle(self) -> int:
        self._next_handle += 1
        return self._next_handle

    def alloc(self, parent: int, cls: int, params: Any = None, handle: int = 0) -> int:
        """NV_ESC_RM_ALLOC (NVOS21): create an object of ``cls`` under ``parent``; returns the handle."""
        root = getattr(self, "root", 0)
        ctype = abi.ALLOC_PARAM_TYPES.get(cls)
        if params is not None and ctype is not None and self.abi.ffi.typeof(params).item.cname != ctype:
            raise TypeError(f"{_class_name(cls)} takes {ctype}, got {self.abi.ffi.typeof(params).cname}")
        p = self.abi.new("NVOS21_PARAMETERS", hRoot=root, hObjectParent=parent, hObjectNew=handle, hClass=cls)
        if params is not None:
            p.pAllocParms = self.abi.addr(params)
            p.paramsSize = self.abi.ffi.sizeof(params[0])
        self._ioctl(self.ctl_fd, abi.NV_ESC_RM_ALLOC, "NVOS21_PARAMETERS", p, _class_name(cls))
        if p.status != abi.NV_OK:
            raise NVError(f"NV_ESC_RM_ALLOC {_class_name(cls)} under {parent:#x}", p.status)
        self.parents[p.hObjectNew] = parent
        return int(p.hObjectNew)

    def free(self, handle: int) -> None:
        """NV_ESC_RM_FREE (NVOS00)."""
        parent = self.parents.get(handle, 0)
        p = self.abi.new("NVOS00_PARAMETERS", hRoot=self.root, hObjectParent=parent, hObjectOld=handle)
        self._ioctl(self.ctl_fd, abi.NV_ESC_RM_FREE, "NVOS00_PARAMETERS", p, f"{handle:#x}")
        if p.status != abi.NV_OK:
            raise NVError(f"NV_ESC_RM_FREE {handle:#x}", p.status)
        self.parents.pop(handle, None)

    def control(self, obj: int, cmd: int, params: Any) -> Any:
        """NV_ESC_RM_CONTROL (NVOS54) with ``params`` (a struct pointer; its size is sent exactly)."""
        p = self.abi.new(
            "NVOS54_PARAMETERS",
            hClient=self.root,
            hObject=obj,
            cmd=cmd,
            params=self.abi.addr(params),
            paramsSize=self.abi.ffi.sizeof(params[0]),
        )
        self._ioctl(self.ctl_fd, abi.NV_ESC_RM_CONTROL, "NVOS54_PARAMETERS", p, _control_name(cmd))
        if p.status != abi.NV_OK:
            raise NVError(f"NV_ESC_RM_CONTROL {_control_name(cmd)} on {obj:#x}", p.status)
        return params

    def alloc_os_descriptor(self, gpu_fd: int, parent: int, va: int, size: int, flags: int) -> int:
        """NV_ESC_RM_ALLOC_MEMORY on the GPU fd: register user pages [va, va+size) as memory."""
        handle = self.pick_handle()
        p = self.abi.new("nv_ioctl_nvos02_parameters_with_fd")
        p.params.hRoot, p.params.hObjectParent, p.params.hObjectNew = self.root, parent, handle
        p.params.hClass, p.params.flags = abi.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, flags
        p.params.pMemory, p.params.limit, p.fd = va, size - 1, -1
        what = _class_name(abi.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR)
        self._ioctl(gpu_fd, abi.NV_ESC_RM_ALLOC_MEMORY, "nv_ioctl_nvos02_parameters_with_fd", p, what)
        if p.params.status != abi.NV_OK:
            raise NVError(f"NV_ESC_RM_ALLOC_MEMORY {what} va={va:#x}", p.params.status)
        self.parents[handle] = parent
        return handle

    def map_memory(
        self, device: int, memory: int, offset: int, length: int, map_fd: int, flags: int = 0
    ) -> int:
        """NV_ESC_RM_MAP_MEMORY (NVOS33): arm ``map_fd`` for one mmap; returns RM's linear-address cookie."""
        p = self.abi.new("nv_ioctl_nvos33_parameters_with_fd", fd=map_fd)
        p.params.hClient, p.params.hDevice, p.params.hMemory = self.root, device, memory
        p.params.offset, p.params.length, p.params.flags = offset, length, flags
        self._ioctl(
            self.ctl_fd,
            abi.NV_ESC_RM_MAP_MEMORY,
            "nv_ioctl_nvos33_parameters_with_fd",
            p,
            f"memory {memory:#x}",
        )
        if p.params.status != abi.NV_OK:
            raise NVError(f"NV_ESC_RM_MAP_MEMORY memory {memory:#x} length {length:#x}", p.params.status)
        return int(p.params.pLinearAddress)

    def unmap_memory(self, device: int, memory: int, cookie: int) -> None:
        """NV_ESC_RM_UNMAP_MEMORY (NVOS34) for a cookie returned by :meth:`map_memory`."""
        p = self.abi.new(
            "NVOS34_PARAMETERS", hClient=self.root, hDevice=device, hMemory=memory, pLinearAddress=cookie
        )
        self._ioctl(self.ctl_fd, abi.NV_ESC_RM_UNMAP_MEMORY, "NVOS34_PARAMETERS", p, f"memory {memory:#x}")
        if p.status != abi.NV_OK:
            raise NVError(f"NV_ESC_RM_UNMAP_MEMORY memory {memory:#x}", p.status)


def read_card_info(os_iface: OSInterface, ctl_fd: int, nvabi: abi.NVABI) -> list[Any]:
    """NV_ESC_CARD_INFO: the valid ``nv_ioctl_card_info_t`` entries."""
    n = abi.CARD_INFO_MAX_ENTRIES
    cards = nvabi.ffi.new("nv_ioctl_card_info_t[]", n)
    request = abi.iowr(abi.NV_IOCTL_MAGIC, abi.NV_ESC_CARD_INFO, n * nvabi.sizeof("nv_ioctl_card_info_t"))
    try:
        os_iface.ioctl(ctl_fd, request, cards)
    except OSError as e:
        raise NVError("NV_ESC_CARD_INFO", errno=e.errno, detail=str(e)) from e
    return [cards[i] for i in range(n) if cards[i].valid]


def register_fd(os_iface: OSInterface, gpu_fd: int, ctl_fd: int, nvabi: abi.NVABI) -> None:
    """NV_ESC_REGISTER_FD: link a ``/dev/nvidiaN`` fd to the control fd."""
    p = nvabi.new("nv_ioctl_register_fd_t", ctl_fd=ctl_fd)
    try:
        os_iface.ioctl(gpu_fd, nvabi.rm_request(abi.NV_ESC_REGISTER_FD, "nv_ioctl_register_fd_t"), p)
    except OSError as e:
        raise NVError("NV_ESC_REGISTER_FD", errno=e.errno, detail=str(e)) from e


class UVM:
    """Calls on one ``/dev/nvidia-uvm`` fd."""

    def __init__(self, os_iface: OSInterface, fd: int, nvabi: abi.NVABI):
        self.os, self.fd, self.abi = os_iface, fd, nvabi

    def call(self, cmd: int, **fields: Any) -> Any:
        """Issue UVM ioctl ``cmd`` with the given fields; raises NVError unless rmStatus is NV_OK."""
        p = self.abi.new(abi.UVM_PARAM_TYPES[cmd], **fields)
        name = abi.UVM_NAMES[cmd]
        try:
            self.os.ioctl(self.fd, cmd, p)
        except OSError as e:
            raise NVError(name, errno=e.errno, detail=str(e)) from e
        if p.rmStatus != abi.NV_OK:
            raise NVError(name, p.rmStatus)
        return p

    def initialize(self, flags: int = 0) -> None:
        self.call(abi.UVM_INITIALIZE, flags=flags)

    def mm_initialize(self, primary_fd: int) -> None:
        self.call(abi.UVM_MM_INITIALIZE, uvmFd=primary_fd)

    def register_gpu(self, uuid: bytes) -> None:
        self.call(abi.UVM_REGISTER_GPU, gpu_uuid={"uuid": list(uuid)}, rmCtrlFd=-1)

    def unregister_gpu(self, uuid: bytes) -> None:
        self.call(abi.UVM_UNREGISTER_GPU, gpu_uuid={"uuid": list(uuid)})

    def register_gpu_vaspace(self, uuid: bytes, ctl_fd: int, client: int, vaspace: int) -> None:
        self.call(
            abi.UVM_REGISTER_GPU_VASPACE,
            gpuUuid={"uuid": list(uuid)},
            rmCtrlFd=ctl_fd,
            hClient=client,
            hVaSpace=vaspace,
        )

    def unregister_gpu_vaspace(self, uuid: bytes) -> None:
        self.call(abi.UVM_UNREGISTER_GPU_VASPACE, gpuUuid={"uuid": list(uuid)})

    def register_channel(
        self, uuid: bytes, ctl_fd: int, client: int, channel: int, base: int, length: int
    ) -> None:
        self.call(
            abi.UVM_REGISTER_CHANNEL,
            gpuUuid={"uuid": list(uuid)},
            rmCtrlFd=ctl_fd,
            hClient=client,
            hChannel=channel,
            base=base,
            length=length,
        )

    def unregister_channel(self, uuid: bytes, client: int, channel: int) -> None:
        self.call(abi.UVM_UNREGISTER_CHANNEL, gpuUuid={"uuid": list(uuid)}, hClient=client, hChannel=channel)

    def create_external_range(self, base: int, length: int) -> None:
        self.call(abi.UVM_CREATE_EXTERNAL_RANGE, base=base, length=length)

    def map_external_allocation(
        self, uuid: bytes, base: int, length: int, ctl_fd: int, client: int, memory: int, offset: int = 0
    ) -> None:
        attrs = {"gpuUuid": {"uuid": list(uuid)}, "gpuMappingType": abi.UVM_MAPPING_TYPE_READ_WRITE_ATOMIC}
        self.call(
            abi.UVM_MAP_EXTERNAL_ALLOCATION,
            base=base,
            length=length,
            offset=offset,
            perGpuAttributes=[attrs],
            gpuAttributesCount=1,
            rmCtrlFd=ctl_fd,
            hClient=client,
            hMemory=memory,
        )

    def free(self, base: int, length: int) -> None:
        self.call(abi.UVM_FREE, base=base, length=length)
