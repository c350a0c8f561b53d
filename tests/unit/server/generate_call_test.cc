#include "server/generate_call.h"

#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace dcf::server {
namespace {

using State = GenerateCall::State;
using Io = GenerateCall::Effects::Io;

constexpr size_t kLimit = 100;  // --max-stream-buffer-bytes of these tests

const State kAllStates[] = {State::kStarting,     State::kStreaming, State::kWriting,
                            State::kWritingFinal, State::kEnding,    State::kFinishing};

// What gRPC and the engine did to one call so far, next to the call itself: the events the
// explorer may deliver next are the ones they could deliver.
struct World {
  GenerateCall call;
  bool write_outstanding = false;  // a kWrite effect whose WriteDone has not been delivered
  bool finished = false;           // a kFinish effect was returned
  bool cancel_delivered = false;   // OnCancel
  bool final_taken = false;
  bool final_written = false;      // the final chunk's write completed ok
  int chunks_taken = 0;
  int tokens_written = 0;          // tokens of writes that completed ok
  int last_chunk_tokens = 0;
  int overflows = 0, underflows = 0, stalls = 0;  // each noise event at most twice a path
  bool rejected = false;
  bool client_end_first = false;   // the first event that ended the call early was the client's
  bool server_end_first = false;   // ...was the server's (overflow, stall)
  std::vector<std::string> path;   // for failure messages
};

std::string Path(const World& w) {
  std::string out;
  for (const std::string& e : w.path) out += e + " ";
  return out;
}

struct Event {
  const char* name;
  std::function<bool(const World&)> enabled;
  std::function<GenerateCall::Effects(World*)> deliver;
};

// Every event gRPC, the engine, the writer pool and the watchdog can deliver, and when.
std::vector<Event> Events() {
  const auto ending = [](World* w) {
    return w->call.state() == State::kStreaming || w->call.state() == State::kWriting ||
           w->call.state() == State::kWritingFinal;
  };
  return {
      {"Reject", [](const World& w) { return w.call.state() == State::kStarting; },
       [](World* w) {
         w->rejected = true;
         return w->call.Reject("invalid_argument",
                               grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad"));
       }},
      {"Enqueued", [](const World& w) { return w.call.state() == State::kStarting; },
       [](World* w) { return w->call.Enqueued(); }},
      {"ChunkTaken",
       [](const World& w) { return w.call.ready_for_chunk() && !w.final_taken && w.chunks_taken < 2; },
       [](World* w) {
         ++w->chunks_taken;
         w->last_chunk_tokens = 2;
         return w->call.ChunkTaken(2, false);
       }},
      {"ChunkTaken(final)",
       [](const World& w) { return w.call.ready_for_chunk() && !w.final_taken; },
       [](World* w) {
         w->final_taken = true;
         w->last_chunk_tokens = 1;
         return w->call.ChunkTaken(1, true, "length", grpc::Status::OK);
       }},
      {"WriteDone(ok)", [](const World& w) { return w.write_outstanding; },
       [](World* w) {
         if (w->call.state() == State::kWritingFinal) w->final_written = true;
         return w->call.WriteDone(true, "");
       }},
      {"WriteDone(failed)", [](const World& w) { return w.write_outstanding; },
       [ending](World* w) {
         if (ending(w) && !w->server_end_first) w->client_end_first = true;
         return w->call.WriteDone(false, "cancelled");
       }},
      {"Cancelled",
       [](const World& w) { return !w.cancel_delivered && w.call.state() != State::kStarting; },
       [ending](World* w) {
         w->cancel_delivered = true;
         if (ending(w) && !w->server_end_first) w->client_end_first = true;
         return w->call.Cancelled("cancelled");
       }},
      {"OutputPending(over)", [](const World& w) { return !w.final_taken && w.overflows < 2; },
       [](World* w) {
         ++w->overflows;
         if (w->call.state() == State::kWriting && !w->client_end_first) w->server_end_first = true;
         return w->call.OutputPending(kLimit + 1, kLimit);
       }},
      {"OutputPending(under)", [](const World& w) { return w.underflows < 2; },
       [](World* w) {
         ++w->underflows;
         return w->call.OutputPending(kLimit, kLimit);
       }},
      {"WriteStalled", [](const World& w) { return w.stalls < 2; },
       [](World* w) {
         ++w->stalls;
         const State s = w->call.state();
         if ((s == State::kWriting || s == State::kWritingFinal) && !w->client_end_first) {
           w->server_end_first = true;
         }
         return w->call.WriteStalled(absl::Seconds(30), "--write-stall-timeout");
       }},
  };
}

struct Explorer {
  std::vector<Event> events = Events();
  std::set<std::pair<State, State>> transitions;
  long paths = 0;

  // Checks what must hold after every event, and that the call can always still end.
  void Check(const World& w) {
    const GenerateCall& c = w.call;
    ASSERT_EQ(c.violations(), 0) << c.first_violation() << " after " << Path(w);
    ASSERT_EQ(c.writing(), w.write_outstanding) << Path(w);
    ASSERT_EQ(c.state() == State::kFinishing, w.finished) << Path(w);
    ASSERT_EQ(c.generated_tokens(), w.tokens_written) << Path(w);
    if (!w.finished) return;
    // The outcome of a finished call is what the client saw.
    if (w.rejected) {
      EXPECT_EQ(c.outcome(), "invalid_argument") << Path(w);
    } else if (w.server_end_first) {
      EXPECT_EQ(c.outcome(), "resource_exhausted") << Path(w);
      EXPECT_EQ(c.status().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Path(w);
    } else if (w.client_end_first) {
      EXPECT_EQ(c.outcome(), "cancelled") << Path(w);
      EXPECT_TRUE(c.client_ended()) << Path(w);
      EXPECT_EQ(c.status().error_code(), grpc::StatusCode::CANCELLED) << Path(w);
    } else {
      EXPECT_TRUE(w.final_written) << Path(w);
      EXPECT_EQ(c.outcome(), "length") << Path(w);
      EXPECT_TRUE(c.status().ok()) << Path(w);
    }
    // "length" (a finish reason) only when the final message went out.
    if (c.outcome() == "length") {
      EXPECT_TRUE(w.final_written) << Path(w);
    }
  }

  void Explore(const World& w) {
    ++paths;
    Check(w);
    if (::testing::Test::HasFatalFailure()) return;
    // The client can always go away, and the call then always ends.
    if (w.call.state() != State::kStarting && !w.finished) {
      World gone = w;
      if (!gone.cancel_delivered) Deliver(events[6], &gone);
      if (gone.write_outstanding) Deliver(events[5], &gone);
      ASSERT_TRUE(gone.finished) << "stuck after " << Path(gone);
    }
    for (const Event& e : events) {
      if (!e.enabled(w)) continue;
      World next = w;
      Deliver(e, &next);
      if (::testing::Test::HasFatalFailure()) return;
      Explore(next);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }

  void Deliver(const Event& e, World* w) {
    const State before = w->call.state();
    w->path.push_back(e.name);
    const bool was_writing = w->write_outstanding;
    const bool done_event = std::string(e.name).rfind("WriteDone", 0) == 0;
    const GenerateCall::Effects fx = e.deliver(w);
    if (done_event) {
      w->write_outstanding = false;
      // What the write carried: 2 per chunk, 1 for the final one.
      if (std::string(e.name) == "WriteDone(ok)") w->tokens_written += w->last_chunk_tokens;
    }
    if (before != w->call.state()) transitions.insert({before, w->call.state()});
    switch (fx.io) {
      case Io::kNone:
        break;
      case Io::kWrite:
        ASSERT_FALSE(was_writing && !done_event) << "two writes in flight: " << Path(*w);
        ASSERT_FALSE(w->finished) << "a write after the finish: " << Path(*w);
        w->write_outstanding = true;
        break;
      case Io::kFinish:
        ASSERT_FALSE(w->finished) << "finished twice: " << Path(*w);
        ASSERT_FALSE(w->write_outstanding) << "finished with a write in flight: " << Path(*w);
        w->finished = true;
        break;
    }
    if (fx.cancel_call) {
      EXPECT_EQ(w->call.status().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Path(*w);
      EXPECT_TRUE(w->write_outstanding) << "cancel_call without a write to unblock: " << Path(*w);
    }
  }
};

// Every sequence of events gRPC, the engine and the watchdog can deliver (up to two chunks
// before the final one): no violation, one write at a time, one finish never during a write,
// tokens counted as written, the outcome the client saw, and the call can always end.
TEST(GenerateCallTest, EveryEventSequenceKeepsTheRules) {
  Explorer explorer;
  explorer.Explore(World{});
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_GT(explorer.paths, 10000);
  std::printf("%ld event sequences explored\n", explorer.paths);
  // Every transition of the table happens, and no other.
  std::set<std::pair<State, State>> table;
  for (State from : kAllStates) {
    for (State to : kAllStates) {
      if (GenerateCall::Allowed(from, to)) table.insert({from, to});
    }
  }
  EXPECT_EQ(explorer.transitions, table);
  EXPECT_EQ(table.size(), 11u);
}

TEST(GenerateCallTest, AnEventTheStateDoesNotAllowIsAViolation) {
  GenerateCall call;
  EXPECT_EQ(call.WriteDone(true, ""), GenerateCall::Effects{});  // no write in flight
  EXPECT_EQ(call.violations(), 1);
  EXPECT_EQ(call.first_violation(), "WriteDone in state starting");
  EXPECT_EQ(call.state(), State::kStarting);
  EXPECT_EQ(call.ChunkTaken(1, false), GenerateCall::Effects{});  // not enqueued yet
  EXPECT_EQ(call.Cancelled("cancelled"), GenerateCall::Effects{});  // before Start returned
  EXPECT_EQ(call.violations(), 3);
  call.Enqueued();
  call.Enqueued();
  EXPECT_EQ(call.violations(), 4);
  EXPECT_EQ(call.state(), State::kStreaming);
  EXPECT_EQ(call.first_violation(), "WriteDone in state starting");  // the first stays
}

TEST(GenerateCallTest, CancelDuringTheFinalWriteCountsTheCancel) {
  // The final message was taken (max_new_tokens=1) but the client, whose window is closed,
  // cancels before it leaves: not "length".
  GenerateCall call;
  call.Enqueued();
  EXPECT_EQ(call.ChunkTaken(1, true, "length", grpc::Status::OK).io, Io::kWrite);
  const GenerateCall::Effects cancel = call.Cancelled("cancelled");
  EXPECT_TRUE(cancel.cancel_engine);
  EXPECT_EQ(cancel.io, Io::kNone);  // waits for the write, which the cancel fails
  EXPECT_EQ(call.state(), State::kEnding);
  EXPECT_EQ(call.WriteDone(false, "cancelled").io, Io::kFinish);
  EXPECT_EQ(call.outcome(), "cancelled");
  EXPECT_EQ(call.status().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(call.generated_tokens(), 0);

  // The final write fails without an OnCancel first: the same.
  GenerateCall failed;
  failed.Enqueued();
  failed.ChunkTaken(1, true, "length", grpc::Status::OK);
  EXPECT_EQ(failed.WriteDone(false, "deadline_exceeded").io, Io::kFinish);
  EXPECT_EQ(failed.outcome(), "deadline_exceeded");
  EXPECT_EQ(failed.generated_tokens(), 0);
  failed.Cancelled("cancelled");  // gRPC's OnCancel, seen later, refines the client's outcome
  EXPECT_EQ(failed.outcome(), "cancelled");
  EXPECT_EQ(failed.violations(), 0);
}

TEST(GenerateCallTest, TokensCountWhenTheirWriteCompletes) {
  GenerateCall call;
  call.Enqueued();
  call.ChunkTaken(5, false);
  EXPECT_EQ(call.generated_tokens(), 0);
  call.WriteDone(true, "");
  EXPECT_EQ(call.generated_tokens(), 5);
  EXPECT_EQ(call.messages_written(), 1);
  call.ChunkTaken(7, false);
  const GenerateCall::Effects stalled = call.WriteStalled(absl::Seconds(30), "--write-stall-timeout");
  EXPECT_TRUE(stalled.cancel_call);
  EXPECT_EQ(call.status().error_message(),
            "the client is not reading its stream: a message was not sent within 30s "
            "(--write-stall-timeout)");
  call.WriteDone(false, "cancelled");
  EXPECT_EQ(call.generated_tokens(), 5);  // the 7 never reached the client
  EXPECT_EQ(call.outcome(), "resource_exhausted");
}

TEST(GenerateCallTest, FirstMessageStallNamesItsBound) {
  GenerateCall call;
  call.Enqueued();
  call.ChunkTaken(1, false);
  call.WriteStalled(absl::Seconds(5), "--first-write-timeout");
  EXPECT_EQ(call.status().error_message(),
            "the client is not reading its stream: its first message was not sent within 5s "
            "(--first-write-timeout)");
  EXPECT_EQ(call.state(), State::kEnding);
}

TEST(GenerateCallTest, OverflowEndsOnlyAWritingCall) {
  GenerateCall call;
  call.Enqueued();
  EXPECT_EQ(call.OutputPending(kLimit * 10, kLimit), GenerateCall::Effects{});  // not writing
  call.ChunkTaken(1, false);
  EXPECT_EQ(call.OutputPending(kLimit * 10, 0), GenerateCall::Effects{});  // no limit
  EXPECT_EQ(call.OutputPending(kLimit, kLimit), GenerateCall::Effects{});
  const GenerateCall::Effects over = call.OutputPending(kLimit + 1, kLimit);
  EXPECT_TRUE(over.cancel_engine);
  EXPECT_TRUE(over.cancel_call);
  EXPECT_EQ(call.status().error_message(),
            "the client is not reading its stream: more than 100 bytes of output were waiting "
            "(--max-stream-buffer-bytes)");
}

TEST(GenerateCallTest, StateNames) {
  EXPECT_STREQ(GenerateCall::StateName(State::kWritingFinal), "writing_final");
  EXPECT_STREQ(GenerateCall::StateName(State::kFinishing), "finishing");
}

}  // namespace
}  // namespace dcf::server
