#include "engine/simt/kernel_attributes.h"

#include <map>
#include <mutex>

#include "engine/simt/runtime_types.h"

namespace dcf::simt::detail {
namespace {

struct Attributes {
  std::mutex mu;
  std::map<const void*, size_t> max_dynamic_shared;  // guarded by mu
};

Attributes& Get() {
  static auto* attributes = new Attributes();
  return *attributes;
}

}  // namespace

void SetMaxDynamicSharedBytes(const void* kernel, size_t bytes) {
  std::lock_guard<std::mutex> lock(Get().mu);
  Get().max_dynamic_shared[kernel] = bytes;
}

size_t MaxDynamicSharedBytes(const void* kernel) {
  std::lock_guard<std::mutex> lock(Get().mu);
  const auto it = Get().max_dynamic_shared.find(kernel);
  return it == Get().max_dynamic_shared.end() ? kDefaultSharedPerBlock : it->second;
}

bool HasDynamicSharedOptIn(const void* kernel) {
  std::lock_guard<std::mutex> lock(Get().mu);
  return Get().max_dynamic_shared.count(kernel) != 0;
}

}  // namespace dcf::simt::detail
