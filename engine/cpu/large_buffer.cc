#include "engine/cpu/large_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace dcf::cpu {
namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

void LargeBuffer::Free::operator()(void* p) const { std::free(p); }

LargeBuffer::LargeBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  const size_t align = bytes >= kHugePage ? kHugePage : 64;
  void* p = std::aligned_alloc(align, (bytes + align - 1) / align * align);
  if (p == nullptr) throw std::bad_alloc();
#if defined(MADV_HUGEPAGE)
  // Advice only: without THP support the buffer simply keeps 4 KiB pages.
  if (align == kHugePage) madvise(p, (bytes + align - 1) / align * align, MADV_HUGEPAGE);
#endif
  data_.reset(p);
}

}  // namespace dcf::cpu
