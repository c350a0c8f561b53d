// One server-streaming Generate call: a gRPC callback reactor fed by the engine.
//
// Flow: the constructor validates the request and enqueues it; the RequestStream's on-ready
// callback (engine loop thread) and OnWriteDone (gRPC thread) both "pump": if no write is in
// flight, take everything pending from the stream (tokens coalesce while a write is in
// flight) and start one write. After the final chunk is written the call finishes with OK
// (or the engine's error). OnCancel (client cancel, deadline, broken connection) cancels the
// engine request, which frees its KV blocks.
//
// Thread-safety: all mutable state sits behind Link::mu. StartWrite and Finish are called
// without the lock held (gRPC may run reactions inline), and only by the thread that claimed
// the right to do so under the lock, so at most one write is in flight and Finish runs once.
// The engine's callback reaches the reactor through a shared Link that OnDone clears, so a
// late callback never touches a deleted reactor.
#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dcformer/v1/dcformer.grpc.pb.h"
#include "engine/serving/engine.h"
#include "grpcpp/grpcpp.h"
#include "server/serving_state.h"

namespace dcf::server {

class GenerateReactor : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(ServingState* state, grpc::CallbackServerContext* context,
                  const v1::GenerateRequest* request);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  struct Link {
    absl::Mutex mu;
    GenerateReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  };
  // What a pump decided to do once the lock is released.
  enum class Action { kNone, kWrite, kFinish };

  ~GenerateReactor() override = default;  // only OnDone deletes

  void Start(const v1::GenerateRequest& request);
  // Runs on the engine loop thread whenever the stream has new output.
  static void OnStreamReady(const std::shared_ptr<Link>& link);
  Action Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(link_->mu);
  // "deadline_exceeded" when the call's deadline has (about) passed, else "cancelled".
  std::string CancelOutcome() const;
  void Perform(Action action);
  // Fails the call before anything was enqueued.
  void Reject(const grpc::Status& status);

  ServingState* const state_;
  grpc::CallbackServerContext* const context_;
  const absl::Time start_time_ = absl::Now();
  std::shared_ptr<Link> link_;

  RequestHandle handle_;          // set once enqueued; its destructor cancels a live request
  std::string request_id_;
  bool with_logprobs_ = false;
  int prompt_tokens_ = 0;

  v1::GenerateResponse response_ ABSL_GUARDED_BY(link_->mu);  // the write in flight
  bool write_in_flight_ ABSL_GUARDED_BY(link_->mu) = false;
  bool final_written_ ABSL_GUARDED_BY(link_->mu) = false;  // final message started
  bool cancelled_ ABSL_GUARDED_BY(link_->mu) = false;
  bool finish_called_ ABSL_GUARDED_BY(link_->mu) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(link_->mu);
  int generated_tokens_ ABSL_GUARDED_BY(link_->mu) = 0;
  std::string outcome_ ABSL_GUARDED_BY(link_->mu);
  Timing timing_ ABSL_GUARDED_BY(link_->mu);
  bool have_timing_ ABSL_GUARDED_BY(link_->mu) = false;
};

}  // namespace dcf::server
