// A Backend that forwards every call to another one: the base of the test decorators that
// break a real backend on purpose (fault_injecting_backend.h, engine_faults_test's failing ones).
// Subclasses override what they change, usually Launch. One that keeps state from a Launch to
// its Wait must hold it per step in flight (2 when the inner backend ChainsSteps), or say
// ChainsSteps() false.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "engine/execution/backend.h"

namespace dcf::testing {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  const ModelConfig& config() const override { return inner_->config(); }
  BackendInfo info() const override { return inner_->info(); }
  size_t BytesPerBlock(LayerGroup g, int b) const override { return inner_->BytesPerBlock(g, b); }
  absl::StatusOr<size_t> Prepare(const StepLimits& l) override { return inner_->Prepare(l); }
  absl::Status AllocateCache(const KvCacheShape& s) override { return inner_->AllocateCache(s); }
  absl::Status SetPenaltyState(int slot, absl::Span<const int32_t> prompt,
                               absl::Span<const int32_t> generated) override {
    return inner_->SetPenaltyState(slot, prompt, generated);
  }
  absl::Status Launch(const StepBatch& batch) override { return inner_->Launch(batch); }
  absl::Status Wait(StepOutput* out) override { return inner_->Wait(out); }
  absl::Status health() const override { return inner_->health(); }
  bool VerifiesDrafts() const override { return inner_->VerifiesDrafts(); }
  bool ChainsSteps() const override { return inner_->ChainsSteps(); }
  bool LaunchReturnsEarly() const override { return inner_->LaunchReturnsEarly(); }
  int MeasureMemoryBoundTokens(int max_tokens) override {
    return inner_->MeasureMemoryBoundTokens(max_tokens);
  }

 protected:
  Backend& inner() { return *inner_; }

 private:
  std::unique_ptr<Backend> inner_;
};

}  // namespace dcf::testing
