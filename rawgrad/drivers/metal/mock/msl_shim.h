// A C++ stand-in for the parts of the Metal Shading Language that rawgrad's MSL renderer uses, so g++ can
// type-check every rendered kernel on Linux (C++17) and run kernels on the host (C++20 with RG_HOST_LANES:
// every lane of a threadgroup is a thread, so threadgroup_barrier and simd_shuffle_xor really synchronize).
// Apple's compiler is the only real judge of MSL; this shim proves the text is well-formed C++ with the
// types, conversions and builtins the renderer means. Included through a generated `metal_stdlib` header.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef RG_HOST_LANES
#include <barrier>
#endif

// address spaces and the kernel qualifier carry no meaning for a host compiler, except that threadgroup
// memory is shared by the lanes of a threadgroup: a function-scope static (the harness runs one threadgroup
// at a time)
#define kernel
#define device
#define constant const
#define threadgroup static

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

// what thread_position_in_grid / threads_per_grid give a kernel launched over a 3-D grid
struct uint3 {
  uint x, y, z;
  uint3() = default;
  uint3(uint a, uint b, uint c) : x(a), y(b), z(c) {}
};

namespace metal {
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2 };
#ifdef RG_HOST_LANES
// What a lane thread knows about its threadgroup (set by the harness before it calls the kernel).
struct rg_lane {
  std::barrier<>* block;  // every lane of the threadgroup
  std::barrier<>* simd;   // the lanes of this lane's SIMD-group
  uint64_t* exchange;     // one word per lane of the threadgroup, for shuffles
  unsigned lane, simd_width;
  unsigned* barriers;     // threadgroup_barrier calls this lane made (a mismatch is a fault)
};
inline thread_local rg_lane rg_ctx{};
inline void threadgroup_barrier(mem_flags) {
  ++*rg_ctx.barriers;
  rg_ctx.block->arrive_and_wait();
}
template <typename T> T simd_shuffle_xor(T value, ushort mask) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 64 bits");
  unsigned first = rg_ctx.lane / rg_ctx.simd_width * rg_ctx.simd_width, in_simd = rg_ctx.lane - first;
  uint64_t word = 0;
  std::memcpy(&word, &value, sizeof(T));
  rg_ctx.exchange[rg_ctx.lane] = word;
  rg_ctx.simd->arrive_and_wait();  // every lane has written
  uint64_t other = rg_ctx.exchange[first + (in_simd ^ mask)];
  rg_ctx.simd->arrive_and_wait();  // every lane has read before the next shuffle writes
  T out;
  std::memcpy(&out, &other, sizeof(T));
  return out;
}
#elif defined(RG_HOST_FIBERS)
// Every lane of a threadgroup is a fiber on one host thread (x86-64: the stack switch below saves the
// callee-saved registers of the System V ABI). threadgroup_barrier and each half of a shuffle yield to the
// harness, which runs every live lane to its next yield in turn: the lanes move in lockstep from one
// synchronization point to the next, as on a GPU, without a thread switch per lane (threads made the big
// reductions of a model take minutes).
extern "C" void rg_swap(void** save, void* load);
struct rg_fiber_lane {
  uint64_t* exchange;  // one word per lane of the threadgroup, for shuffles
  unsigned lane, simd_width;
  unsigned* barriers;  // threadgroup_barrier calls this lane made (a mismatch is a fault)
  void* sp;            // the saved stack pointer while the lane is not running
  bool finished;
};
inline rg_fiber_lane* rg_cur = nullptr;
inline void* rg_sched_sp = nullptr;
inline void rg_yield() { rg_swap(&rg_cur->sp, rg_sched_sp); }
inline void threadgroup_barrier(mem_flags) {
  ++*rg_cur->barriers;
  rg_yield();
}
template <typename T> T simd_shuffle_xor(T value, ushort mask) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 64 bits");
  rg_fiber_lane* me = rg_cur;
  unsigned first = me->lane / me->simd_width * me->simd_width, in_simd = me->lane - first;
  uint64_t word = 0;
  std::memcpy(&word, &value, sizeof(T));
  me->exchange[me->lane] = word;
  rg_yield();  // every lane has written
  uint64_t other = me->exchange[first + (in_simd ^ mask)];
  rg_yield();  // every lane has read before the next shuffle writes
  T out;
  std::memcpy(&out, &other, sizeof(T));
  return out;
}
#else
// Declared only: enough to type-check a kernel.
void threadgroup_barrier(mem_flags flags);
template <typename T> T simd_shuffle_xor(T value, ushort mask);
#endif

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
