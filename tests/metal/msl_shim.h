// A C++17 stand-in for the parts of the Metal Shading Language that rawgrad's MSL renderer uses, so g++ can
// type-check every rendered kernel on Linux (and run the barrier-free ones on the host). Apple's compiler
// is the only real judge of MSL; this shim proves the text is well-formed C++ with the types, conversions
// and builtins the renderer means. Included through a generated `metal_stdlib` header.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

// address spaces and the kernel qualifier carry no meaning for a host compiler
#define kernel
#define device
#define constant const
#define threadgroup

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;  // 64-bit on LP64 Linux, as MSL's ulong
static_assert(sizeof(long) == 8, "MSL long is 64 bits");
typedef _Float16 half;  // IEEE binary16, as MSL half

// MSL 3.1 bfloat: rawgrad only moves its bits (conversions are written as bit operations)
struct bfloat {
  unsigned short bits;
};

struct uint2 {
  uint x, y;
  uint2() = default;
  uint2(uint a, uint b) : x(a), y(b) {}
};

namespace metal {
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2 };
// Declared, never defined: a kernel that needs them type-checks, and cannot be linked for a host run
// (a host loop over lanes cannot honour a barrier or a cross-lane shuffle).
void threadgroup_barrier(mem_flags flags);
template <typename T> T simd_shuffle_xor(T value, ushort mask);

template <typename T, typename U> inline T as_type(U u) {
  static_assert(sizeof(T) == sizeof(U), "as_type needs types of one size");
  T t;
  std::memcpy(&t, &u, sizeof t);
  return t;
}
using std::exp2;
using std::isnan;
using std::log2;
using std::pow;
using std::signbit;
using std::sin;
using std::sqrt;
using std::trunc;
}  // namespace metal
