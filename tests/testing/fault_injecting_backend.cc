#include "tests/testing/fault_injecting_backend.h"

#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "engine/common/logging.h"
#include "tests/testing/forwarding_backend.h"

ABSL_FLAG(int, fault_fail_token, -1,
          "TEST BUILD ONLY: fail the backend step that prefills a prompt starting with this token "
          "id (-1: never)");
ABSL_FLAG(int, fault_stall_token, -1,
          "TEST BUILD ONLY: stall the backend step that prefills a prompt starting with this "
          "token id until "
          "--fault-release-file exists (-1: never)");
ABSL_FLAG(std::string, fault_release_file, "",
          "TEST BUILD ONLY: the file whose creation ends a stall");

namespace dcf::testing {
namespace {

class FaultInjectingBackend : public ForwardingBackend {
 public:
  FaultInjectingBackend(std::unique_ptr<Backend> inner, FaultPlan plan)
      : ForwardingBackend(std::move(inner)), plan_(std::move(plan)) {}

  absl::Status Launch(const StepBatch& batch) override {
    if (Holds(batch, plan_.fail_token)) {
      return absl::InternalError(
          absl::StrCat("injected backend fault (token ", *plan_.fail_token, ")"));
    }
    if (Holds(batch, plan_.stall_token)) {
      DCF_LOG(Warning) << "injected stall: waiting for " << plan_.release_file;
      while (access(plan_.release_file.c_str(), F_OK) != 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      DCF_LOG(Warning) << "injected stall released";
    }
    return ForwardingBackend::Launch(batch);
  }

 private:
  // True when the batch prefills a prompt that starts with `token` (position 0): generated
  // tokens never trigger a fault, only the request a test sends on purpose.
  static bool Holds(const StepBatch& batch, const std::optional<int32_t>& token) {
    if (!token.has_value()) return false;
    for (size_t i = 0; i < batch.tokens.size(); ++i) {
      if (batch.positions[i] == 0 && batch.tokens[i] == *token) return true;
    }
    return false;
  }

  const FaultPlan plan_;
};

}  // namespace

std::unique_ptr<Backend> InjectFaults(std::unique_ptr<Backend> inner, FaultPlan plan) {
  return std::make_unique<FaultInjectingBackend>(std::move(inner), std::move(plan));
}

BackendDecorator FaultInjectionFromFlags() {
  // The flags are read when the decorator runs (the server applies it after loading the
  // model), not here: main() hands it over before the command line is parsed.
  return [](std::unique_ptr<Backend> inner) {
    FaultPlan plan;
    if (absl::GetFlag(FLAGS_fault_fail_token) >= 0) {
      plan.fail_token = absl::GetFlag(FLAGS_fault_fail_token);
    }
    if (absl::GetFlag(FLAGS_fault_stall_token) >= 0) {
      plan.stall_token = absl::GetFlag(FLAGS_fault_stall_token);
      plan.release_file = absl::GetFlag(FLAGS_fault_release_file);
      DCF_CHECK(!plan.release_file.empty()) << "--fault-stall-token needs --fault-release-file";
    }
    return InjectFaults(std::move(inner), std::move(plan));
  };
}

}  // namespace dcf::testing
