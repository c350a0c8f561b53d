// Test helpers: what one engine request streamed, accumulated over takes.
#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "engine/serving/engine.h"
#include "gtest/gtest.h"

namespace dcf::testing {

struct Collected {
  std::vector<TokenOutput> tokens;
  std::string text;
  GenerationChunk final_chunk;
  bool finished = false;

  std::vector<int32_t> ids() const {
    std::vector<int32_t> v;
    for (const auto& t : tokens) v.push_back(t.token);
    return v;
  }
  // Blocks for the next chunk (at most 60 s so a bug fails instead of hanging).
  void TakeOne(RequestStream& s) {
    GenerationChunk c;
    ASSERT_TRUE(s.WaitTake(&c, absl::Seconds(60))) << "no output from " << s.id();
    for (auto& t : c.tokens) tokens.push_back(t);
    text += c.text;
    if (c.finished) {
      finished = true;
      final_chunk = c;
    }
  }
  void Drain(RequestStream& s) {
    while (!finished) {
      TakeOne(s);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
};

// Enqueues `r` and collects its whole stream. An Enqueue error is a test failure and leaves
// the result unfinished (finish_reason kUnspecified), so later expectations fail too.
inline Collected RunToEnd(Engine& engine, const GenerationRequest& r) {
  Collected c;
  auto h = engine.Enqueue(r);
  EXPECT_TRUE(h.ok()) << h.status();
  if (h.ok()) c.Drain(h->stream());
  return c;
}

}  // namespace dcf::testing
