// How many tokens a step may hold before it stops being bound by reading the weights: the
// step token budget of speculative decoding (engine.h, EngineOptions::spec_step_tokens).
//
// A decode step of a few tokens reads every weight once, so its time hardly grows with its
// tokens until the arithmetic catches up with the memory; past that point a drafted token
// costs about as much as a decoded one and speculation stops paying. A backend measures
// where that point lies on its own hardware and weights (Backend::MeasureMemoryBoundTokens)
// with this rule. Pure function, thread-safe.
#pragma once

#include <functional>

namespace dcf {

// A step of T tokens still counts as memory-bound while it takes at most this factor of the
// one-token step's time.
inline constexpr double kMemoryBoundSlack = 1.25;

// The largest T in {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, ...} (up to max_tokens) whose
// seconds(T) <= slack * seconds(1), trying them in that order and stopping at the first that
// is slower (a larger step is never cheaper per step). seconds(T): the best of a few timings
// of the backend's weight-reading work for T tokens. 1 when max_tokens <= 1; calls seconds
// at most once per size tried.
int MemoryBoundTokens(const std::function<double(int tokens)>& seconds, int max_tokens,
                      double slack = kMemoryBoundSlack);

}  // namespace dcf
