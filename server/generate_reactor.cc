#include "server/generate_reactor.h"

#include <chrono>
#include <memory>
#include <utility>

#include "grpc/grpc.h"

namespace dcf::server {

GenerateReactor::GenerateReactor(ServingState* state, grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request)
    : context_(context), stream_(state, this) {
  stream_.Start(*request);
}

absl::Time GenerateReactor::deadline() const {
  const auto deadline = context_->deadline();
  return deadline == std::chrono::system_clock::time_point::max() ? absl::InfiniteFuture()
                                                                  : absl::FromChrono(deadline);
}

std::function<void()> GenerateReactor::PrepareCancel(const grpc::Status& status) {
  // A reference on the core call keeps it valid for the cancel, which may run after the
  // reactor is gone; the closure drops it when destroyed (run or not).
  struct CallRef {
    explicit CallRef(grpc_call* c) : call(c) { grpc_call_ref(call); }
    ~CallRef() { grpc_call_unref(call); }
    grpc_call* const call;
  };
  auto ref = std::make_shared<CallRef>(context_->c_call());
  return [ref, code = status.error_code(), message = status.error_message()]() {
    grpc_call_cancel_with_status(ref->call, static_cast<grpc_status_code>(code), message.c_str(),
                                 nullptr);
  };
}

void GenerateReactor::OnDone() {
  stream_.OnDone();
  delete this;
}

}  // namespace dcf::server
