// Block-shared memory for the SIMT emulator: the views behind DCF_SHARED and
// DCF_DYNAMIC_SHARED (cuda_compat.h). A view's operator[] checks the index against the
// array's size (static: N elements; dynamic: the launch's byte count / sizeof(T)) and stops
// the launch with a message naming the array, the index and the size when it is out of
// bounds; otherwise it returns T& into the block's storage. Kernels never hold raw pointers
// into shared memory: the only pointer use is `&name[i]` as an atomic's operand.
//
// With the racecheck on (racecheck.h) every access is recorded for it.
//
// Fresh shared memory is filled with 0xFF bytes (NaN for floats, -1 for ints) at the start
// of every block, so a read before the first write shows up in results deterministically.
#pragma once

#include <cstddef>
#include <type_traits>

#include "engine/simt/racecheck.h"

namespace dcf::simt {
namespace detail {

// The block's storage for the static array declared at `key` (an address unique to the
// declaration): allocated on the block's first use, the same for every thread of the block.
void* StaticShared(const void* key, size_t bytes, size_t align, const char* name);

struct DynamicSharedSpan {
  void* data;    // 16-byte aligned
  size_t bytes;  // the launch's dynamic shared memory size
};
DynamicSharedSpan DynamicShared();

[[noreturn]] void SharedIndexFault(const char* name, long long index, size_t size);
[[noreturn]] void SharedIndexFault(const char* name, unsigned long long index, size_t size);

template <typename I>
inline void CheckSharedIndex(const char* name, I i, size_t size) {
  static_assert(std::is_integral_v<I>, "a shared-memory index must be an integer");
  if constexpr (std::is_signed_v<I>) {
    if (i < 0 || static_cast<unsigned long long>(i) >= size) [[unlikely]] {
      SharedIndexFault(name, static_cast<long long>(i), size);
    }
  } else {
    if (static_cast<unsigned long long>(i) >= size) [[unlikely]] {
      SharedIndexFault(name, static_cast<unsigned long long>(i), size);
    }
  }
}

}  // namespace detail

// A block-shared array of N elements of T (DCF_SHARED). Cheap to copy: copies view the same
// storage, so a device helper may take it as a template parameter.
template <typename T, size_t N>
class SharedArray {
 public:
  static_assert(std::is_trivially_default_constructible_v<T> && std::is_trivially_destructible_v<T>,
                "shared memory holds trivial types only, as in CUDA");
  static_assert(N > 0, "a shared array needs at least one element");
  SharedArray(T* data, const char* name) : data_(data), name_(name) {}
  template <typename I>
  T& operator[](I i) const {
    detail::CheckSharedIndex(name_, i, N);
    if (detail::racecheck_active) [[unlikely]] {
      detail::RaceTouch(&data_[i], sizeof(T), name_, static_cast<long long>(i));
    }
    return data_[i];
  }
  static constexpr size_t size() { return N; }

 private:
  T* data_;
  const char* name_;
};

// The launch's dynamic shared memory viewed as an array of T (DCF_DYNAMIC_SHARED).
template <typename T>
class DynamicSharedArray {
 public:
  static_assert(alignof(T) <= 16, "dynamic shared memory is 16-byte aligned");
  static_assert(std::is_trivially_default_constructible_v<T> && std::is_trivially_destructible_v<T>,
                "shared memory holds trivial types only, as in CUDA");
  DynamicSharedArray(detail::DynamicSharedSpan span, const char* name)
      : data_(static_cast<T*>(span.data)), size_(span.bytes / sizeof(T)), name_(name) {}
  template <typename I>
  T& operator[](I i) const {
    detail::CheckSharedIndex(name_, i, size_);
    if (detail::racecheck_active) [[unlikely]] {
      detail::RaceTouch(&data_[i], sizeof(T), name_, static_cast<long long>(i));
    }
    return data_[i];
  }
  size_t size() const { return size_; }

 private:
  T* data_;
  size_t size_;
  const char* name_;
};

}  // namespace dcf::simt
