#include "engine/simt/racecheck.h"

#include <cstring>

#include "engine/simt/block_runner.h"

namespace dcf::simt::detail {

thread_local constinit bool racecheck_active = false;

void RaceTouch(const void* p, size_t bytes, const char* name, long long index) {
  BlockRunner::Active()->race_check().Touch(p, bytes, name, index);
}

void RaceAtomic(const void* p) { BlockRunner::Active()->race_check().Atomic(p); }

void RaceCheck::BeginBlock(const unsigned char* base, size_t bytes, int warps) {
  base_ = base;
  bytes_ = bytes;
  if (cells_.size() < bytes) cells_.resize(bytes);
  warp_epoch_.assign(warps, 0);
  accesses_.clear();
  snapshots_.clear();
  // Epochs and segments are never reused within a runner, so stale cells never match.
  ++block_epoch_;
  ++segment_;
}

void RaceCheck::Touch(const void* p, size_t bytes, const char* name, long long index) {
  const auto* b = static_cast<const unsigned char*>(p);
  if (b < base_ || b + bytes > base_ + bytes_) return;
  const auto offset = static_cast<uint32_t>(b - base_);
  if (cells_[offset].seen == segment_) return;  // already recorded in this segment
  for (size_t i = 0; i < bytes; ++i) cells_[offset + i].seen = segment_;
  const auto at = static_cast<uint32_t>(snapshots_.size());
  snapshots_.insert(snapshots_.end(), b, b + bytes);
  accesses_.push_back(Access{offset, static_cast<uint32_t>(bytes), at, name, index, false});
}

void RaceCheck::Atomic(const void* p) {
  const auto* b = static_cast<const unsigned char*>(p);
  if (b < base_ || b >= base_ + bytes_) return;
  const auto offset = static_cast<uint32_t>(b - base_);
  // `&smem[i]` recorded the element just before: the access is the atomic's.
  for (Access& a : accesses_) {
    if (a.offset == offset) a.atomic = true;
  }
}

bool RaceCheck::Conflicts(int other, uint32_t other_warp_epoch, int thread, int warp) const {
  if (other == thread) return false;
  if (other / 32 != warp) return true;
  return other_warp_epoch == warp_epoch_[warp];
}

bool RaceCheck::EndSegment(int thread, int warp, Hazard* hazard) {
  bool clean = true;
  const uint32_t e = block_epoch_;
  const uint32_t we = warp_epoch_[warp];
  for (const Access& a : accesses_) {
    if (a.atomic) continue;
    const bool wrote = std::memcmp(base_ + a.offset, &snapshots_[a.snapshot], a.bytes) != 0;
    for (uint32_t i = 0; i < a.bytes && clean; ++i) {
      Cell& c = cells_[a.offset + i];
      if (c.w_epoch == e && Conflicts(c.writer, c.w_warp_epoch, thread, warp)) {
        *hazard = Hazard{wrote ? "Write-after-Write" : "Read-after-Write", a.name, a.index,
                         c.writer, true};
        clean = false;
      } else if (wrote && c.r_epoch == e &&
                 (Conflicts(c.reader, c.r_warp_epoch, thread, warp) ||
                  (c.readers && c.reader == thread && c.r_warp_epoch == we))) {
        *hazard = Hazard{"Write-after-Read", a.name, a.index, c.reader, false};
        clean = false;
      }
      if (wrote) {
        c.w_epoch = e;
        c.w_warp_epoch = we;
        c.writer = static_cast<int16_t>(thread);
      } else {
        c.readers = c.r_epoch == e && (c.readers || c.reader != thread);
        c.r_epoch = e;
        c.r_warp_epoch = we;
        c.reader = static_cast<int16_t>(thread);
      }
    }
    if (!clean) break;
  }
  accesses_.clear();
  snapshots_.clear();
  ++segment_;
  return clean;
}

}  // namespace dcf::simt::detail
