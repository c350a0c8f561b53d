// What GetModelInfo reports: the model's config plus what the server and its backend chose.
#pragma once

#include <array>
#include <optional>
#include <string>

#include "dcformer/v1/dcformer.pb.h"
#include "engine/kv/kv_cache_manager.h"
#include "engine/execution/backend.h"
#include "engine/model/model_config.h"
#include "engine/serving/request_validator.h"

namespace dcf::server {

namespace v1 = ::dcformer::v1;

// Everything GetModelInfo reports that is not in ModelConfig, as the engine resolved it.
struct ServedModelInfo {
  std::string model_name;
  BackendInfo backend;
  size_t kv_cache_bytes = 0;
  int block_size = 0;
  std::array<int, kNumLayerGroups> kv_blocks_total{0, 0};
  bool prefix_caching = false;
  // Engine::limits(): the EOS, the tokenizer, the prompt and new-token limits and default.
  RequestLimits limits;
};
void ToProtoModelInfo(const ModelConfig& config, const ServedModelInfo& info,
                      v1::GetModelInfoResponse* out);

}  // namespace dcf::server
