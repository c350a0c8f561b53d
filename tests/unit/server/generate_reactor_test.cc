#include "server/generate_reactor.h"

#include <set>
#include <utility>

#include "gtest/gtest.h"

namespace dcf::server {
namespace {

using State = GenerateReactor::State;

// The transitions of the header's diagram, and no others.
TEST(GenerateReactorStateTest, AllowedTransitionsAreTheDiagram) {
  const std::set<std::pair<State, State>> diagram = {
      {State::kStarting, State::kStreaming},    {State::kStarting, State::kFinishing},
      {State::kStreaming, State::kWriting},     {State::kStreaming, State::kWritingFinal},
      {State::kStreaming, State::kFinishing},   {State::kWriting, State::kStreaming},
      {State::kWriting, State::kEnding},        {State::kWritingFinal, State::kFinishing},
      {State::kWritingFinal, State::kEnding},   {State::kEnding, State::kFinishing}};
  const State all[] = {State::kStarting, State::kStreaming, State::kWriting,
                       State::kWritingFinal, State::kEnding, State::kFinishing};
  for (State from : all) {
    for (State to : all) {
      EXPECT_EQ(GenerateReactor::Allowed(from, to), diagram.count({from, to}) == 1)
          << GenerateReactor::StateName(from) << " -> " << GenerateReactor::StateName(to);
    }
  }
}

}  // namespace
}  // namespace dcf::server
