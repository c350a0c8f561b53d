// Stop-string matching on streamed text. Text arrives in pieces (detokenized per token); a
// stop string may span pieces. The matcher holds back the longest tail of the text that could
// still be the start of a stop string, so emitted text never has to be taken back, and cuts
// the text at the earliest match (keeping the stop string itself only when asked).
//
// Not thread-safe: one per request, used by the engine loop thread.
#pragma once

#include <string>
#include <vector>

namespace dcf {

class StopStringMatcher {
 public:
  // `stop_strings` must not contain empty strings (validated by the engine).
  StopStringMatcher(std::vector<std::string> stop_strings, bool include_stop_string);

  // Appends `piece` and returns the text that is now safe to emit. After a match, `matched()`
  // is true, the returned text ends at the match (plus the stop string when included) and
  // further pieces are ignored.
  std::string Push(const std::string& piece);

  // Returns the held-back text (call when the request ends for another reason).
  std::string Flush();

  bool matched() const { return matched_; }
  // Bytes currently held back.
  size_t held() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  bool include_;
  bool matched_ = false;
  std::string held_;  // text not emitted yet; a possible stop-string start
};

}  // namespace dcf
