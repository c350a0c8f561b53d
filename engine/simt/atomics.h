// CUDA's atomic functions for the SIMT emulator, on global and shared memory alike: real
// (relaxed) atomics, because blocks of one grid may run on several OS threads. Each returns
// the value stored before the operation, as CUDA's do.
//   atomicAdd: int, unsigned int, unsigned long long, float, double
//   atomicMax / atomicMin: int, unsigned int
//   atomicCAS: int, unsigned int, unsigned long long
//   atomicExch: int, unsigned int, float
// A shared-memory operand is written `atomicAdd(&smem[i], v)`: the pointer lives only for
// the call (see DCF_SHARED in cuda_compat.h).
#pragma once

#include <atomic>

#include "engine/simt/racecheck.h"

namespace dcf::simt {

namespace detail {
// Tells the racecheck (racecheck.h) that the shared-memory access just made through
// `&smem[i]` is this atomic's, exempt from it.
template <typename T>
inline void MarkAtomic(T* address) {
  if (racecheck_active) [[unlikely]] RaceAtomic(address);
}
template <typename T>
inline T AtomicAdd(T* address, T value) {
  MarkAtomic(address);
  return std::atomic_ref<T>(*address).fetch_add(value, std::memory_order_relaxed);
}
template <typename T>
inline T AtomicExch(T* address, T value) {
  MarkAtomic(address);
  return std::atomic_ref<T>(*address).exchange(value, std::memory_order_relaxed);
}
template <typename T>
inline T AtomicCas(T* address, T compare, T value) {
  MarkAtomic(address);
  std::atomic_ref<T>(*address).compare_exchange_strong(compare, value, std::memory_order_relaxed);
  return compare;  // the old value, whether or not it matched
}
template <typename T, typename Better>
inline T AtomicUpdateIf(T* address, T value, Better better) {
  MarkAtomic(address);
  std::atomic_ref<T> ref(*address);
  T old = ref.load(std::memory_order_relaxed);
  while (better(value, old) && !ref.compare_exchange_weak(old, value, std::memory_order_relaxed)) {
  }
  return old;
}
}  // namespace detail

inline int atomicAdd(int* address, int value) { return detail::AtomicAdd(address, value); }
inline unsigned int atomicAdd(unsigned int* address, unsigned int value) {
  return detail::AtomicAdd(address, value);
}
inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
  return detail::AtomicAdd(address, value);
}
inline float atomicAdd(float* address, float value) { return detail::AtomicAdd(address, value); }
inline double atomicAdd(double* address, double value) { return detail::AtomicAdd(address, value); }

inline int atomicMax(int* address, int value) {
  return detail::AtomicUpdateIf(address, value, [](int v, int old) { return v > old; });
}
inline unsigned int atomicMax(unsigned int* address, unsigned int value) {
  return detail::AtomicUpdateIf(address, value,
                                [](unsigned int v, unsigned int old) { return v > old; });
}
inline int atomicMin(int* address, int value) {
  return detail::AtomicUpdateIf(address, value, [](int v, int old) { return v < old; });
}
inline unsigned int atomicMin(unsigned int* address, unsigned int value) {
  return detail::AtomicUpdateIf(address, value,
                                [](unsigned int v, unsigned int old) { return v < old; });
}

inline int atomicCAS(int* address, int compare, int value) {
  return detail::AtomicCas(address, compare, value);
}
inline unsigned int atomicCAS(unsigned int* address, unsigned int compare, unsigned int value) {
  return detail::AtomicCas(address, compare, value);
}
inline unsigned long long atomicCAS(unsigned long long* address, unsigned long long compare,
                                    unsigned long long value) {
  return detail::AtomicCas(address, compare, value);
}

inline int atomicExch(int* address, int value) { return detail::AtomicExch(address, value); }
inline unsigned int atomicExch(unsigned int* address, unsigned int value) {
  return detail::AtomicExch(address, value);
}
inline float atomicExch(float* address, float value) { return detail::AtomicExch(address, value); }

}  // namespace dcf::simt

using dcf::simt::atomicAdd;
using dcf::simt::atomicCAS;
using dcf::simt::atomicExch;
using dcf::simt::atomicMax;
using dcf::simt::atomicMin;
