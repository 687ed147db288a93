"""The Objective-C bridge: Metal's API called from Python through cffi (ABI mode) and the ObjC runtime.

How a message is sent. `objc_msgSend` is a trampoline that jumps to the method's implementation with the
caller's registers intact, so the caller must set the registers up as the *method's* C prototype does.
The bridge therefore casts the address of `objc_msgSend` once per method prototype (api.py lists each
selector's) to exactly that function-pointer type, caches the cast, and calls it. It never calls
`objc_msgSend` as a variadic function: on arm64 variadic arguments go on the stack while a method reads
them from registers (Apple, "Writing ARM64 code for Apple platforms" and "Addressing warnings and errors
for obj-C" — cast objc_msgSend to a prototype that matches the method). Struct returns need no
special entry point on arm64 (the caller passes the result address in x8, which libffi does for a struct-
returning prototype; arm64 has no `objc_msgSend_stret`); on x86-64 Macs structs over 16 bytes would need
`objc_msgSend_stret`, so Intel Macs are declared out of scope and refused with a clear error.
Selectors (`sel_registerName`) and classes (`objc_getClass`) are cached by name.

Ownership (Apple, "Advanced Memory Management Programming Guide", memory management policy): a method
whose name begins with alloc, new, copy or mutableCopy returns an object the caller owns (+1) and must
release; everything else returns an object the caller does not own (autoreleased: it lives until the
innermost autorelease pool is popped), which the caller retains if it keeps it. The bridge makes owned
results `Ref`s (`new`, `alloc_init`, `retain`), refuses to hand out an owned result as a bare pointer, and
`Ref.release` releases exactly once. Work that makes autoreleased objects (a submit: command buffer,
encoder) runs inside `autorelease_pool()`, so they do not pile up on a thread with no run loop.

The runtime library is reached only through `ObjCRuntime` (the seam, like drivers/osapi.py for NV):
`LibObjC` is libobjc + Metal.framework on an arm64 Mac; mock/objc_fake.py is a fake runtime on Linux
whose `send_fn` returns, per prototype, an `ffi.callback` trampoline, so this module's casts and calls run
through libffi exactly as in production.
"""
from __future__ import annotations

import platform
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import cffi

from rawgrad.drivers.metal.api import Method, method

__all__ = ["FFI", "LibObjC", "MetalUnavailable", "ObjC", "ObjCError", "ObjCRuntime", "Ref"]

# Types every prototype in api.py is written in. NSUInteger/NSInteger are (unsigned) long on 64-bit Apple
# platforms (NSObjCRuntime.h); BOOL is `bool` on arm64 (objc/objc.h, OBJC_BOOL_IS_BOOL); MTLSize is three
# NSUIntegers (MTLTypes.h); NSRange is
# two (NSRange.h). The functions are those of libobjc (objc/runtime.h, objc/message.h) and
# Metal (MTLDevice.h); `objc_msgSend` is declared without a prototype on purpose: it is only ever cast.
OBJC_CDEF = """
typedef void *id;
typedef void *SEL;
typedef unsigned long NSUInteger;
typedef long NSInteger;
typedef bool BOOL;
typedef struct { NSUInteger width; NSUInteger height; NSUInteger depth; } MTLSize;
typedef struct { NSUInteger location; NSUInteger length; } NSRange;
id objc_getClass(const char *name);
SEL sel_registerName(const char *str);
void objc_msgSend(void);
void *objc_autoreleasePoolPush(void);
void objc_autoreleasePoolPop(void *pool);
id MTLCreateSystemDefaultDevice(void);
"""
FFI = cffi.FFI()
FFI.cdef(OBJC_CDEF)

# Where the libraries live on macOS (dyld shared cache paths; dlopen resolves them there).
LIBOBJC_PATH = "/usr/lib/libobjc.A.dylib"
METAL_PATH = "/System/Library/Frameworks/Metal.framework/Metal"
# Apple's MTLCreateSystemDefaultDevice documentation: on macOS, link CoreGraphics for the call to find the
# system's default device.
COREGRAPHICS_PATH = "/System/Library/Frameworks/CoreGraphics.framework/CoreGraphics"

_POINTER_TYPES = ("id", "void *", "const void *")
_STRUCT_TYPES = {"MTLSize": 3, "NSRange": 2}


class ObjCError(RuntimeError):
    """A message failed: nil receiver, an NSError, a broken ownership rule, a bad argument."""


class MetalUnavailable(ObjCError):
    """This machine cannot run Metal (not macOS, or an Intel Mac)."""


class ObjCRuntime(Protocol):
    """What the bridge needs from the Objective-C runtime; LibObjC on a Mac, the fake one on Linux."""

    def get_class(self, name: bytes) -> int: ...
    def register_selector(self, name: bytes) -> int: ...

    def send_fn(self, prototype: str) -> Any:
        """A C function pointer (cdata) the bridge casts to `prototype` and calls: `objc_msgSend` itself in
        production, one trampoline per prototype in the mock."""
        ...

    def pool_push(self) -> int: ...
    def pool_pop(self, token: int) -> None: ...
    def create_system_default_device(self) -> int: ...

    def check(self) -> None:
        """Raise what went wrong inside the last call (a mock records faults in its callbacks, which cannot
        raise through C); production has nothing to report."""
        ...


class LibObjC:
    """The real runtime: libobjc and Metal.framework, on an arm64 Mac only."""

    def __init__(self, system: str | None = None, machine: str | None = None) -> None:
        system = platform.system() if system is None else system
        machine = platform.machine() if machine is None else machine
        if system != "Darwin":
            raise MetalUnavailable(f"Metal needs macOS; this is {system}. On Linux the Metal bridge runs "
                                   f"only against the mock runtime (rawgrad.drivers.metal.mock.objc_fake)")
        if machine != "arm64":
            raise MetalUnavailable(f"Metal on {machine} Macs is out of scope: struct returns over 16 bytes "
                                   f"(MTLSize) need objc_msgSend_stret there; rawgrad supports Apple silicon")
        self.objc: Any = FFI.dlopen(LIBOBJC_PATH)
        self.metal: Any = FFI.dlopen(METAL_PATH)
        self._coregraphics: Any = FFI.dlopen(COREGRAPHICS_PATH)

    def get_class(self, name: bytes) -> int:
        return int(FFI.cast("uintptr_t", self.objc.objc_getClass(name)))

    def register_selector(self, name: bytes) -> int:
        return int(FFI.cast("uintptr_t", self.objc.sel_registerName(name)))

    def send_fn(self, prototype: str) -> Any:
        return self.objc.objc_msgSend

    def pool_push(self) -> int:
        return int(FFI.cast("uintptr_t", self.objc.objc_autoreleasePoolPush()))

    def pool_pop(self, token: int) -> None:
        self.objc.objc_autoreleasePoolPop(FFI.cast("void *", token))

    def create_system_default_device(self) -> int:
        return int(FFI.cast("uintptr_t", self.metal.MTLCreateSystemDefaultDevice()))

    def check(self) -> None:
        return None


class Ref:
    """One owned (+1) reference to an Objective-C object; `release` gives it up, exactly once."""

    __slots__ = ("bridge", "ptr", "what")

    def __init__(self, bridge: ObjC, ptr: int, what: str) -> None:
        if not ptr:
            raise ObjCError(f"{what}: got nil where an object was expected")
        self.bridge, self.ptr, self.what = bridge, ptr, what

    @property
    def alive(self) -> bool:
        return self.ptr != 0

    def release(self) -> None:
        if not self.ptr:
            raise ObjCError(f"{self.what}: released twice (the reference was already given up)")
        ptr, self.ptr = self.ptr, 0
        self.bridge.send(ptr, "release")

    def __enter__(self) -> Ref:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.ptr:
            self.release()

    def __repr__(self) -> str:
        return f"Ref({self.what}, {self.ptr:#x})" if self.ptr else f"Ref({self.what}, released)"


class ObjC:
    """Send messages through one runtime with cached selectors, classes and prototype casts."""

    def __init__(self, runtime: ObjCRuntime) -> None:
        self.rt = runtime
        self._classes: dict[str, int] = {}
        self._selectors: dict[str, Any] = {}
        self._casts: dict[str, Any] = {}  # prototype text -> objc_msgSend cast to it
        self.pool_depth = 0

    # ------------------------------------------------------------------ names
    def cls(self, name: str) -> int:
        ptr = self._classes.get(name)
        if ptr is None:
            ptr = self.rt.get_class(name.encode())
            if not ptr:
                raise ObjCError(f"Objective-C class {name!r} does not exist in this runtime")
            self._classes[name] = ptr
        return ptr

    def sel(self, name: str) -> Any:
        s = self._selectors.get(name)
        if s is None:
            s = FFI.cast("SEL", self.rt.register_selector(name.encode()))
            self._selectors[name] = s
        return s

    @property
    def casts(self) -> dict[str, Any]:
        """The prototype casts made so far (one per distinct prototype, however many calls use it)."""
        return dict(self._casts)

    def _fn(self, m: Method) -> Any:
        fn = self._casts.get(m.prototype)
        if fn is None:
            fn = FFI.cast(m.prototype, self.rt.send_fn(m.prototype))
            self._casts[m.prototype] = fn
        return fn

    # ------------------------------------------------------------------ sending
    def send(self, receiver: int | Ref, selector: str, *args: Any) -> Any:
        """Send `selector` (with its api.py prototype) to `receiver`; results the caller would own must go
        through `new` so their release is tracked."""
        m = method(selector)
        if m.returns_owned:
            raise ObjCError(f"{selector} returns an owned (+1) object: send it with ObjC.new so it is "
                            f"released")
        return self._send(m, receiver, args)

    def new(self, receiver: int | Ref, selector: str, *args: Any, error: Any = None) -> Ref:
        """Send an alloc/new/copy method and own its result. With `error` (from `error_slot`), a nil result
        raises the NSError the method stored there."""
        m = method(selector)
        if not m.returns_owned:
            raise ObjCError(f"{selector} does not return an owned object; use ObjC.send (and retain to "
                            f"keep it)")
        ptr = self._send(m, receiver, args)
        if error is not None:
            self.check_error(error, selector, ptr)
        return Ref(self, ptr, selector)

    def alloc_init(self, cls_name: str, init: str, *args: Any) -> Ref:
        """`[[cls alloc] init...]`: alloc returns +1 and init consumes it, returning the owned object (which
        may be a different one, so only init's result is kept)."""
        raw = self.new(self.cls(cls_name), "alloc")
        ptr, raw.ptr = raw.ptr, 0  # ownership passes to init
        out = self._send(method(init), ptr, args)
        return Ref(self, out, f"{cls_name} {init}")

    def retain(self, ptr: int) -> Ref:
        """Own an object this code did not make (an autoreleased result it keeps past the pool)."""
        if not ptr:
            raise ObjCError("retain of nil")
        return Ref(self, self.send(ptr, "retain"), "retained object")

    def _send(self, m: Method, receiver: int | Ref, args: tuple[Any, ...]) -> Any:
        ptr = receiver.ptr if isinstance(receiver, Ref) else int(receiver)
        if not ptr:
            raise ObjCError(f"{m.selector} sent to nil (a released or never-created object)")
        if len(args) != len(m.argtypes):
            raise ObjCError(f"{m.selector} takes {len(m.argtypes)} arguments, got {len(args)}")
        cargs = [self._arg(m, t, a) for t, a in zip(m.argtypes, args)]
        res = self._fn(m)(FFI.cast("id", ptr), self.sel(m.selector), *cargs)
        self.rt.check()
        return self._result(m, res)

    @staticmethod
    def _arg(m: Method, ctype: str, value: Any) -> Any:
        if isinstance(value, Ref):
            if ctype != "id":
                raise ObjCError(f"{m.selector}: an object passed where {ctype} belongs")
            value = value.ptr
        if ctype in _STRUCT_TYPES:
            fields = tuple(value)
            if len(fields) != _STRUCT_TYPES[ctype]:
                raise ObjCError(f"{m.selector}: {ctype} has {_STRUCT_TYPES[ctype]} fields, got {fields}")
            return FFI.new(f"{ctype} *", fields)[0]
        if ctype in _POINTER_TYPES and isinstance(value, int):
            return FFI.cast(ctype, value)
        if ctype == "const char *" and isinstance(value, str):
            return value.encode()
        return value

    @staticmethod
    def _result(m: Method, res: Any) -> Any:
        t = m.restype
        if t in _POINTER_TYPES:
            return int(FFI.cast("uintptr_t", res))
        if t == "const char *":
            return None if res == FFI.NULL else FFI.string(res).decode()
        if t in _STRUCT_TYPES:
            return tuple(int(getattr(res, name)) for name, _ in FFI.typeof(res).fields)
        return res

    # ------------------------------------------------------------------ Foundation helpers
    def ns_string(self, text: str) -> Ref:
        """An owned NSString holding `text` (UTF-8)."""
        return self.alloc_init("NSString", "initWithUTF8String:", text.encode())

    def py_string(self, ns: int | Ref) -> str:
        """The text of an NSString ('' for nil)."""
        ptr = ns.ptr if isinstance(ns, Ref) else ns
        if not ptr:
            return ""
        return self.send(ptr, "UTF8String") or ""

    @staticmethod
    def error_slot() -> Any:
        """An `NSError **` out-parameter, nil until a method stores an (autoreleased) error in it."""
        return FFI.new("id *")

    def check_error(self, slot: Any, what: str, result: int = 1) -> None:
        """Raise the NSError in `slot` as ObjCError naming `what`; a nil result without one raises too."""
        err = int(FFI.cast("uintptr_t", slot[0]))
        if err:
            desc = self.py_string(self.send(err, "localizedDescription"))
            code = self.send(err, "code")
            raise ObjCError(f"{what} failed: {desc} (NSError code {code})")
        if not result:
            raise ObjCError(f"{what} returned nil without an NSError")

    @contextmanager
    def autorelease_pool(self) -> Iterator[None]:
        """Autoreleased objects made inside are released when the block ends
        (objc_autoreleasePoolPush/Pop)."""
        token = self.rt.pool_push()
        self.pool_depth += 1
        try:
            yield
        finally:
            self.pool_depth -= 1
            self.rt.pool_pop(token)
            self.rt.check()

    def system_default_device(self) -> Ref:
        """MTLCreateSystemDefaultDevice (a Create function: the caller owns the device)."""
        ptr = self.rt.create_system_default_device()
        self.rt.check()
        if not ptr:
            raise MetalUnavailable("MTLCreateSystemDefaultDevice returned nil: this Mac has no Metal device")
        return Ref(self, ptr, "MTLCreateSystemDefaultDevice")
