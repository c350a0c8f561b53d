// The host's side of the device sampler's rows (sampling.h): what a request's sampling
// parameters put in a DeviceSamplingRow. Host code only: CudaBackend::Plan and the kernel
// tests build their rows with it.
#pragma once

#include "engine/cuda/sampling.h"
#include "engine/sampling/sampling_params.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

// Sets d's temperature, filters and penalties from p. A greedy request
// (SamplingParams::Greedy: below 1e-5, whose 1 / T can overflow) becomes temperature 0, the
// kernel's greedy rows; the others get 1 / T in float, as the host sampler computes it.
inline void SetSamplingParams(const SamplingParams& p, DeviceSamplingRow* d) {
  const bool greedy = p.Greedy();
  d->temperature = greedy ? 0.0f : p.temperature;
  d->inv_temperature = greedy ? 1.0f : 1.0f / p.temperature;
  d->top_k = p.top_k;
  d->top_p = p.top_p;
  d->min_p = p.min_p;
  d->repetition_penalty = p.repetition_penalty;
  d->presence_penalty = p.presence_penalty;
  d->frequency_penalty = p.frequency_penalty;
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
