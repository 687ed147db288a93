"""The Objective-C methods the Metal driver sends, each with its exact C prototype.

One table, read by the bridge (objc.py: the prototype it casts `objc_msgSend` to) and checked against the
mock runtime's fake classes (mock/objc_fake.py declares its own prototypes from Apple's documentation; a
call whose prototype differs from the fake's is an error there). A selector missing here cannot be sent.

Types are cffi C types over the typedefs in objc.py `OBJC_CDEF`: `id`, `SEL`, `NSUInteger` (unsigned long
on 64-bit Apple platforms), `BOOL` (`bool` on arm64; objc/objc.h), `MTLSize` (three NSUIntegers),
`NSRange` (location, length NSUIntegers).
Sources: Apple developer documentation for each class (MTLDevice, MTLBuffer, MTLCommandQueue,
MTLCommandBuffer, MTLComputeCommandEncoder, MTLSharedEvent, MTLLibrary, MTLCompileOptions, NSString, NSError,
NSObject).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["METHODS", "MTL_BARRIER_SCOPE_BUFFERS", "MTL_INDIRECT_COMMAND_TYPE_CONCURRENT_DISPATCH",
           "MTL_LANGUAGE_VERSION_3_1", "MTL_MAX_BUFFER_ARGUMENTS", "MTL_PIPELINE_OPTION_NONE",
           "MTL_RESOURCE_STORAGE_SHARED", "MTL_RESOURCE_USAGE_READ", "MTL_RESOURCE_USAGE_WRITE",
           "MTL_STATUS_COMPLETED", "MTL_STATUS_ERROR", "Method", "method"]

# MTLResourceOptions: MTLResourceStorageModeShared = MTLStorageModeShared (0) <<
# MTLResourceStorageModeShift (4) = 0 (MTLResource.h); CPU and GPU share the memory,
# `contents` is its CPU address.
MTL_RESOURCE_STORAGE_SHARED = 0
# MTLLanguageVersion3_1 = (3 << 16) + 1 (MTLLibrary.h); needed for `bfloat` (macOS 14).
MTL_LANGUAGE_VERSION_3_1 = (3 << 16) + 1
# Metal feature set tables: 31 entries in a compute function's buffer argument table (indices 0..30).
MTL_MAX_BUFFER_ARGUMENTS = 31
# MTLIndirectCommandType.MTLIndirectCommandTypeConcurrentDispatch = 1 << 5 (MTLIndirectCommandBuffer.h)
MTL_INDIRECT_COMMAND_TYPE_CONCURRENT_DISPATCH = 1 << 5
# MTLResourceUsage (MTLCommandEncoder.h): Read = 1 << 0, Write = 1 << 1
MTL_RESOURCE_USAGE_READ = 1
MTL_RESOURCE_USAGE_WRITE = 2
# MTLBarrierScope.MTLBarrierScopeBuffers = 1 << 0 (MTLCommandEncoder.h)
MTL_BARRIER_SCOPE_BUFFERS = 1
# MTLPipelineOption.MTLPipelineOptionNone = 0 (MTLDevice.h)
MTL_PIPELINE_OPTION_NONE = 0
# MTLCommandBufferStatus (MTLCommandBuffer.h): NotEnqueued 0, Enqueued 1, Committed 2, Scheduled 3,
# Completed 4, Error 5
MTL_STATUS_COMPLETED = 4
MTL_STATUS_ERROR = 5


@dataclass(frozen=True)
class Method:
    """One selector and the C prototype of its implementation after the implicit (id self, SEL _cmd)."""

    selector: str
    restype: str
    argtypes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.selector.count(":") != len(self.argtypes):
            raise ValueError(f"selector {self.selector!r} takes {self.selector.count(':')} arguments, the "
                             f"prototype lists {len(self.argtypes)}")

    @property
    def prototype(self) -> str:
        """The function-pointer type `objc_msgSend` is cast to for this method."""
        return f"{self.restype}(*)({', '.join(('id', 'SEL') + self.argtypes)})"

    @property
    def returns_owned(self) -> bool:
        """Cocoa's ownership rule: a method whose name begins with alloc, new, copy or mutableCopy returns an
        object the caller owns (+1); any other returns an object it does not own (autoreleased)."""
        return self.restype == "id" and self.selector.startswith(("alloc", "new", "copy", "mutableCopy"))


_TABLE = (
    # NSObject
    Method("alloc", "id"),
    Method("init", "id"),
    Method("retain", "id"),
    Method("release", "void"),
    Method("retainCount", "NSUInteger"),
    # NSString / NSError
    Method("initWithUTF8String:", "id", ("const char *",)),
    Method("stringWithUTF8String:", "id", ("const char *",)),
    Method("UTF8String", "const char *"),
    Method("localizedDescription", "id"),
    Method("code", "NSInteger"),
    # MTLDevice
    Method("name", "id"),
    Method("newBufferWithLength:options:", "id", ("NSUInteger", "NSUInteger")),
    Method("newCommandQueue", "id"),
    Method("newLibraryWithSource:options:error:", "id", ("id", "id", "id *")),
    Method("newComputePipelineStateWithFunction:error:", "id", ("id", "id *")),
    Method("newSharedEvent", "id"),
    Method("maxThreadsPerThreadgroup", "MTLSize"),
    Method("newCommandQueueWithMaxCommandBufferCount:", "id", ("NSUInteger",)),
    Method("newComputePipelineStateWithDescriptor:options:reflection:error:", "id",
           ("id", "NSUInteger", "id *", "id *")),
    Method("newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", "id",
           ("id", "NSUInteger", "NSUInteger")),
    # MTLComputePipelineDescriptor
    Method("setComputeFunction:", "void", ("id",)),
    Method("setSupportIndirectCommandBuffers:", "void", ("BOOL",)),
    # MTLIndirectCommandBufferDescriptor
    Method("setCommandTypes:", "void", ("NSUInteger",)),
    Method("setInheritBuffers:", "void", ("BOOL",)),
    Method("setInheritPipelineState:", "void", ("BOOL",)),
    Method("setMaxKernelBufferBindCount:", "void", ("NSUInteger",)),
    # MTLIndirectCommandBuffer / MTLIndirectComputeCommand (setComputePipelineState: as on the encoder)
    Method("indirectComputeCommandAtIndex:", "id", ("NSUInteger",)),
    Method("setKernelBuffer:offset:atIndex:", "void", ("id", "NSUInteger", "NSUInteger")),
    Method("concurrentDispatchThreadgroups:threadsPerThreadgroup:", "void", ("MTLSize", "MTLSize")),
    Method("setBarrier", "void"),
    Method("clearBarrier", "void"),
    # MTLCompileOptions
    Method("setFastMathEnabled:", "void", ("BOOL",)),
    Method("setLanguageVersion:", "void", ("NSUInteger",)),
    # MTLLibrary / MTLComputePipelineState
    Method("newFunctionWithName:", "id", ("id",)),
    Method("maxTotalThreadsPerThreadgroup", "NSUInteger"),
    # MTLBuffer
    Method("contents", "void *"),
    Method("length", "NSUInteger"),
    Method("gpuAddress", "uint64_t"),
    # MTLCommandQueue / MTLCommandBuffer
    Method("commandBuffer", "id"),
    Method("computeCommandEncoder", "id"),
    Method("blitCommandEncoder", "id"),
    Method("encodeSignalEvent:value:", "void", ("id", "uint64_t")),
    Method("encodeWaitForEvent:value:", "void", ("id", "uint64_t")),
    Method("commit", "void"),
    Method("waitUntilCompleted", "void"),
    Method("status", "NSUInteger"),
    Method("error", "id"),
    Method("GPUStartTime", "double"),
    Method("GPUEndTime", "double"),
    # MTLComputeCommandEncoder
    Method("setComputePipelineState:", "void", ("id",)),
    Method("setBuffer:offset:atIndex:", "void", ("id", "NSUInteger", "NSUInteger")),
    Method("setBytes:length:atIndex:", "void", ("const void *", "NSUInteger", "NSUInteger")),
    Method("dispatchThreadgroups:threadsPerThreadgroup:", "void", ("MTLSize", "MTLSize")),
    Method("memoryBarrierWithScope:", "void", ("NSUInteger",)),
    Method("executeCommandsInBuffer:withRange:", "void", ("id", "NSRange")),
    Method("useResource:usage:", "void", ("id", "NSUInteger")),
    Method("endEncoding", "void"),
    # MTLBlitCommandEncoder
    Method("copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:", "void",
           ("id", "NSUInteger", "id", "NSUInteger", "NSUInteger")),
    # MTLSharedEvent
    Method("signaledValue", "uint64_t"),
    Method("setSignaledValue:", "void", ("uint64_t",)),
)

METHODS: dict[str, Method] = {m.selector: m for m in _TABLE}


def method(selector: str) -> Method:
    """The table entry of `selector`; an unknown selector is an error naming it."""
    try:
        return METHODS[selector]
    except KeyError:
        raise KeyError(f"selector {selector!r} is not in the Metal method table (drivers/metal/api.py); "
                       f"add it with its exact prototype before sending it") from None
