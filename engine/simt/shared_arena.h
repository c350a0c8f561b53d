// One block's shared memory in the SIMT emulator: the launch's dynamic area first, then the
// static arrays (DCF_SHARED) in the order the block first reaches their declarations. Reset
// for every block; the storage itself is allocated once per block runner and reused.
//
// Not thread-safe: used by the fibers of one block, which run on one OS thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dcf::simt::detail {

class SharedArena {
 public:
  SharedArena();

  // Starts a block: `dynamic_bytes` of dynamic shared memory, and `limit_bytes` for static
  // plus dynamic together. Fills the dynamic area with the poison byte.
  void Reset(size_t dynamic_bytes, size_t limit_bytes);

  void* dynamic_data() { return base_; }
  // All of the storage a block may use (dynamic and static arrays lie inside it).
  const unsigned char* base() const { return base_; }
  static size_t capacity();
  size_t dynamic_bytes() const { return dynamic_bytes_; }

  // The storage of the static array declared at `key`, allocated (and poisoned) on first
  // use. Returns nullptr and sets *error when the block's static arrays exceed 48 KiB or
  // static plus dynamic memory exceeds the limit.
  void* Static(const void* key, size_t bytes, size_t align, const char* name, std::string* error);

  static constexpr unsigned char kPoison = 0xff;

 private:
  std::unique_ptr<unsigned char[]> storage_;
  unsigned char* base_ = nullptr;  // 64-byte aligned start of storage_
  size_t dynamic_bytes_ = 0;
  size_t limit_bytes_ = 0;
  size_t used_ = 0;          // end of the last static array, from base_
  size_t static_bytes_ = 0;  // sum of the static arrays' sizes
  std::vector<std::pair<const void*, void*>> static_arrays_;  // key -> storage
};

}  // namespace dcf::simt::detail
