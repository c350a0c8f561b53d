#include "server/model_info.h"

#include "engine/execution/backend_options.h"

namespace dcf::server {

void ToProtoModelInfo(const ModelConfig& config, const ServedModelInfo& info,
                      v1::GetModelInfoResponse* out) {
  out->Clear();
  out->set_model_name(info.model_name);
  out->set_architecture(config.architecture == Architecture::kDcPythia ? "dcpythia" : "dcformer");
  out->set_num_layers(config.n_layer);
  out->set_num_heads(config.n_head);
  out->set_head_dim(config.head_dim);
  out->set_hidden_size(config.dim);
  out->set_context_length(config.max_positions);
  out->set_vocab_size(config.vocab_size);
  if (info.limits.eos_token_id.has_value()) out->add_eos_token_ids(*info.limits.eos_token_id);
  out->set_block_size(info.block_size);
  out->set_backend(info.backend.name);
  out->set_dtype(ComputeDTypeName(info.backend.dtype));
  out->set_device(info.backend.device);
  out->set_kv_cache_bytes(static_cast<int64_t>(info.kv_cache_bytes));
  out->set_prefix_caching(info.prefix_caching);
  for (LayerGroup group : {LayerGroup::kGlobal, LayerGroup::kWindow}) {
    if (config.NumLayersIn(group) == 0) continue;
    v1::LayerGroup* g = out->add_layer_groups();
    g->set_name(group == LayerGroup::kGlobal ? "global" : "window");
    g->set_window(group == LayerGroup::kGlobal ? 0 : config.window_size);
    for (int l = 0; l < config.n_layer; ++l) {
      if (config.GroupOf(l) == group) g->add_layers(l);
    }
    g->set_kv_blocks_total(info.kv_blocks_total[static_cast<int>(group)]);
  }
  out->set_has_tokenizer(info.limits.tokenizer != nullptr);
  out->set_max_prompt_tokens(info.limits.max_prompt_tokens);
  out->set_max_new_tokens(info.limits.max_new_tokens_limit);
  out->set_default_max_new_tokens(info.limits.default_max_new_tokens);
}

}  // namespace dcf::server
