// A KvCacheShape for tests: pool sizes per group, the window, and the block size.
#pragma once

#include "engine/kv/kv_cache_manager.h"

namespace dcf::testing {

inline KvCacheShape Shape(int global_blocks, int window_blocks, int window, int block_size = 4) {
  KvCacheShape s;
  s.block_size = block_size;
  s.num_blocks = {global_blocks, window_blocks};
  s.window = window;
  return s;
}

}  // namespace dcf::testing
