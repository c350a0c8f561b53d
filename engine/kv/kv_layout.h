// Layout of one cache row: what a KV-cache block stores per token and per layer.
//
//   row = [ K: N*hd | V: N*hd | key-side compose terms: 10*N ]            f32
//   terms = [ pre-key (branch 1): W1 [I][N] | W2 [I][N] | G [N]
//           | post-key (branch 3): W1 [I][N] | W2 [I][N] | G [N] ]
//
// A block holds, for each layer of its group, B rows: [layer_in_group][B][row].
#pragma once

#include "engine/model/model_config.h"

namespace dcf {

struct KvRowLayout {
  int n_head = 0;
  int head_dim = 0;

  explicit KvRowLayout(const ModelConfig& c) : n_head(c.n_head), head_dim(c.head_dim) {}
  KvRowLayout(int n, int hd) : n_head(n), head_dim(hd) {}

  // Floats of one key-side compose branch: W1 and W2 ([I][N] each) then G [N].
  int BranchFloats() const { return (2 * ModelConfig::kRank + 1) * n_head; }
  int k_offset() const { return 0; }
  int v_offset() const { return n_head * head_dim; }
  int terms_offset() const { return 2 * n_head * head_dim; }
  // Offset of key-side branch `b` (0: pre-compose key terms, 1: post-compose key terms).
  int branch_offset(int b) const { return terms_offset() + b * BranchFloats(); }
  int row_floats() const { return 2 * n_head * head_dim + 2 * BranchFloats(); }
};

}  // namespace dcf
