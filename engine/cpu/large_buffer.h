// A 64-byte-aligned buffer for the CPU backend's big arrays (packed weights, the KV cache).
// Buffers of 2 MiB and more are 2 MiB-aligned and advised as transparent huge pages
// (madvise MADV_HUGEPAGE, which Linux honours in its default "madvise" THP mode): a decode
// step streams hundreds of MB of weights and cache rows, and 4 KiB pages would cost a TLB
// miss every 64 cache lines. Move-only; not thread-safe to mutate.
#pragma once

#include <cstddef>
#include <memory>

namespace dcf::cpu {

class LargeBuffer {
 public:
  LargeBuffer() = default;
  // Uninitialised storage for `bytes`; throws std::bad_alloc when the memory is not there.
  explicit LargeBuffer(size_t bytes);

  void* data() { return data_.get(); }
  const void* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  size_t size_ = 0;
};

}  // namespace dcf::cpu
