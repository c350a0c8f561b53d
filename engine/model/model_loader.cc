#include "engine/model/model_loader.h"

#include "engine/common/logging.h"
#include "engine/common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/model/model_weights.h"
#include "engine/weights/checkpoint.h"

namespace dcf {

absl::StatusOr<LoadedModel> LoadModel(const std::string& dir) {
  LoadedModel m;
  ASSIGN_OR_RETURN(m.config, ModelConfig::FromFile(dir + "/config.json"));
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, OpenCheckpointDir(dir));
  ASSIGN_OR_RETURN(ModelWeights weights, LoadModelWeights(m.config, *reader));
  reader.reset();  // unmaps the files before the backend allocates anything
  DCF_LOG(Debug) << "loaded " << weights.TotalFloats() << " fp32 parameters from " << dir;
  ASSIGN_OR_RETURN(m.backend, CpuBackend::Create(m.config, std::move(weights)));
  return m;
}

}  // namespace dcf
