#include "engine/serving/sequence.h"

#include "engine/common/logging.h"

namespace dcf {

void SetState(Sequence& seq, RequestState to) {
  DCF_CHECK(IsValidTransition(seq.state, to))
      << "sequence " << seq.seq_id << ": invalid transition " << RequestStateName(seq.state)
      << " -> " << RequestStateName(to);
  seq.state = to;
}

}  // namespace dcf
