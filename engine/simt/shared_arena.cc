#include "engine/simt/shared_arena.h"

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "engine/simt/runtime_types.h"

namespace dcf::simt::detail {
namespace {
// Dynamic (up to the opt-in maximum) plus static (up to 48 KiB) plus alignment slack.
constexpr size_t kCapacity = kMaxSharedPerBlockOptin + kDefaultSharedPerBlock + 1024;
constexpr size_t kBaseAlign = 64;
}  // namespace

SharedArena::SharedArena() : storage_(new unsigned char[kCapacity + kBaseAlign]) {
  const auto raw = reinterpret_cast<uintptr_t>(storage_.get());
  base_ = reinterpret_cast<unsigned char*>((raw + kBaseAlign - 1) & ~(kBaseAlign - 1));
}

size_t SharedArena::capacity() { return kCapacity; }

void SharedArena::Reset(size_t dynamic_bytes, size_t limit_bytes) {
  dynamic_bytes_ = dynamic_bytes;
  limit_bytes_ = limit_bytes;
  used_ = (dynamic_bytes + kBaseAlign - 1) & ~(kBaseAlign - 1);
  static_bytes_ = 0;
  static_arrays_.clear();
  std::memset(base_, kPoison, dynamic_bytes);
}

void* SharedArena::Static(const void* key, size_t bytes, size_t align, const char* name,
                          std::string* error) {
  for (const auto& [k, data] : static_arrays_) {
    if (k == key) return data;
  }
  static_bytes_ += bytes;
  const size_t offset = (used_ + align - 1) & ~(align - 1);
  char text[256];
  if (static_bytes_ > kDefaultSharedPerBlock) {
    std::snprintf(text, sizeof(text),
                  "static shared memory of the block reaches %zu bytes with array '%s' (%zu "
                  "bytes); CUDA allows 48 KiB (49152) of static shared memory",
                  static_bytes_, name, bytes);
    *error = text;
    return nullptr;
  }
  if (static_bytes_ + dynamic_bytes_ > limit_bytes_) {
    std::snprintf(text, sizeof(text),
                  "shared memory of the block: %zu static (with array '%s') + %zu dynamic "
                  "bytes exceed the kernel's limit of %zu bytes (raise it with "
                  "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize))",
                  static_bytes_, name, dynamic_bytes_, limit_bytes_);
    *error = text;
    return nullptr;
  }
  if (offset + bytes > kCapacity) {
    std::snprintf(text, sizeof(text),
                  "shared memory of the block: array '%s' does not fit the emulator's arena "
                  "(alignment padding)",
                  name);
    *error = text;
    return nullptr;
  }
  void* data = base_ + offset;
  used_ = offset + bytes;
  std::memset(data, kPoison, bytes);
  static_arrays_.emplace_back(key, data);
  return data;
}

}  // namespace dcf::simt::detail
