"""The native store fence and GPFIFO publish sequence (rawgrad.drivers.mmio), on host memory."""
from __future__ import annotations

import platform
import re

import cffi
import pytest

from rawgrad.compiler.toolchain import host_compiler
from rawgrad.drivers import mmio
from rawgrad.drivers.osapi import LibcOS

ffi = cffi.FFI()


def _addr(cdata: object) -> int:
    return int(ffi.cast("uintptr_t", cdata))


def test_publish_writes_entry_then_put_then_doorbell() -> None:
    ring, words = ffi.new("uint64_t[8]"), ffi.new("uint32_t[2]")
    publish = LibcOS().gpfifo_publisher(_addr(ring), 8, _addr(words), _addr(words) + 4, 0xC0FFEE)
    publish(2, 0x1122_3344_5566_7788)
    assert ring[2] == 0x1122_3344_5566_7788 and words[0] == 3 and words[1] == 0xC0FFEE
    publish(7, 5)  # the last slot: the put index wraps to 0
    assert ring[7] == 5 and words[0] == 0
    assert [ring[i] for i in (0, 1, 3, 4, 5, 6)] == [0] * 6


def test_publish_rejects_a_ring_that_is_not_a_power_of_two() -> None:
    with pytest.raises(ValueError, match="entries 6 must be a power of two"):
        mmio.native_mmio().gpfifo_publisher(0, 6, 0, 0, 0)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="checks x86 code")
def test_x86_publish_fences_between_the_three_stores() -> None:
    declare, wmb = mmio._WMB["x86_64"]
    ir = mmio._IR.format(publish=mmio.PUBLISH_SYMBOL, declare=declare, wmb=wmb)
    asm = host_compiler().assembly(ir)
    body = asm[asm.index(mmio.PUBLISH_SYMBOL + ":"):]
    body = body[:body.index("ret")]
    order = re.findall(r"\bsfence\b|\bmov[lq]\s+%\w+, \(", body)
    stores_and_fences = ["sfence" if op == "sfence" else "store" for op in order]
    assert stores_and_fences == ["store", "sfence", "store", "sfence", "store"], body
