#include "engine/serving/request.h"

namespace dcf {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kUnspecified: return "unspecified";
    case FinishReason::kLength: return "length";
    case FinishReason::kEos: return "eos";
    case FinishReason::kStopToken: return "stop_token";
    case FinishReason::kStopString: return "stop_string";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

const char* RequestStateName(RequestState state) {
  switch (state) {
    case RequestState::kQueued: return "queued";
    case RequestState::kPrefill: return "prefill";
    case RequestState::kDecode: return "decode";
    case RequestState::kPreempted: return "preempted";
    case RequestState::kFinished: return "finished";
    case RequestState::kCancelled: return "cancelled";
    case RequestState::kFailed: return "failed";
  }
  return "unknown";
}

bool IsValidTransition(RequestState from, RequestState to) {
  using S = RequestState;
  if (IsFinal(from)) return false;
  if (to == S::kCancelled || to == S::kFailed) return true;
  switch (from) {
    case S::kQueued: return to == S::kPrefill;
    case S::kPrefill: return to == S::kDecode || to == S::kPreempted || to == S::kFinished;
    case S::kDecode: return to == S::kPreempted || to == S::kFinished;
    case S::kPreempted: return to == S::kPrefill || to == S::kFinished;
    default: return false;
  }
}

}  // namespace dcf
