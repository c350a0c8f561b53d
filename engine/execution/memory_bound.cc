#include "engine/execution/memory_bound.h"

namespace dcf {

int MemoryBoundTokens(const std::function<double(int tokens)>& seconds, int max_tokens,
                      double slack) {
  if (max_tokens <= 1) return 1;
  const double one = seconds(1);
  int best = 1;
  // 1, 2, 3, 4, 6, 8, 12, 16, ...: powers of two and the halfway points between them.
  for (int base = 2; base <= max_tokens; base *= 2) {
    for (const int t : {base, base + base / 2}) {
      if (t <= best || t > max_tokens) continue;
      if (seconds(t) > slack * one) return best;
      best = t;
    }
  }
  return best;
}

}  // namespace dcf
