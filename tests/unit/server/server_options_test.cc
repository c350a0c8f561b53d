#include "server/server_options.h"

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "gtest/gtest.h"

ABSL_DECLARE_FLAG(std::string, pipeline_steps);

namespace dcf::server {
namespace {

TEST(ServerOptionsTest, DefaultsServeLocalhost) {
  ServerOptions o;
  o.model_dir = "models/dcformer-kjv";
  o.metrics_host = o.host;
  EXPECT_TRUE(ValidateServerOptions(o).ok());
  EXPECT_EQ(o.host, "127.0.0.1");
  EXPECT_EQ(o.port, 50051);
  EXPECT_EQ(o.metrics_port, 9090);
}

TEST(ServerOptionsTest, FlagsParseWithDefaults) {
  auto o = ServerOptionsFromFlags();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->port, 50051);
  EXPECT_EQ(o->metrics_host, "127.0.0.1");
  EXPECT_NE(o->model_dir.find("models/dcformer-kjv"), std::string::npos);
  EXPECT_TRUE(o->engine.prefix_caching);  // on by default
  EXPECT_EQ(o->engine.pipeline_steps, PipelineSteps::kAuto);
}

TEST(ServerOptionsTest, PipelineStepsFlag) {
  absl::SetFlag(&FLAGS_pipeline_steps, "off");
  auto o = ServerOptionsFromFlags();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->engine.pipeline_steps, PipelineSteps::kOff);
  absl::SetFlag(&FLAGS_pipeline_steps, "sometimes");
  o = ServerOptionsFromFlags();
  EXPECT_EQ(o.status(), absl::InvalidArgumentError("--pipeline-steps: pipeline steps "
                                                   "'sometimes': expected auto, on or off"));
  absl::SetFlag(&FLAGS_pipeline_steps, "auto");
}

TEST(ServerOptionsTest, QueueLimitsOfOneAreAccepted) {
  ServerOptions o;
  o.model_dir = "m";
  o.metrics_host = o.host;
  o.engine.max_queued_requests = 1;
  o.engine.max_queued_prompt_tokens = 1;
  EXPECT_TRUE(ValidateServerOptions(o).ok());
}

TEST(ServerOptionsTest, RejectsBadValuesNamingTheFlag) {
  auto base = [] {
    ServerOptions o;
    o.model_dir = "m";
    o.metrics_host = o.host;
    return o;
  };
  struct Case {
    const char* flag;
    void (*mutate)(ServerOptions&);
  };
  const Case cases[] = {
      {"--port", [](ServerOptions& o) { o.port = 70000; }},
      {"--metrics-port", [](ServerOptions& o) { o.metrics_port = o.port; }},
      {"--block-size", [](ServerOptions& o) { o.engine.block_size = 0; }},
      {"--max-batch-tokens", [](ServerOptions& o) { o.engine.max_num_batched_tokens = 0; }},
      {"--kv-cache-fraction", [](ServerOptions& o) { o.engine.kv_cache_fraction = 1.5; }},
      {"--max-queued-requests", [](ServerOptions& o) { o.engine.max_queued_requests = -1; }},
      {"--max-queued-requests", [](ServerOptions& o) { o.engine.max_queued_requests = 0; }},
      {"--max-queued-prompt-tokens",
       [](ServerOptions& o) { o.engine.max_queued_prompt_tokens = 0; }},
      {"--max-queued-prompt-tokens",
       [](ServerOptions& o) { o.engine.max_queued_prompt_tokens = -1; }},
      {"--default-max-new-tokens", [](ServerOptions& o) { o.engine.default_max_new_tokens = 0; }},
      {"--max-receive-message-bytes", [](ServerOptions& o) { o.max_receive_message_bytes = 1; }},
      {"--tls-key", [](ServerOptions& o) { o.tls_cert = "c.pem"; }},
      {"--tls-client-ca", [](ServerOptions& o) { o.tls_client_ca = "ca.pem"; }},
      {"--drain-timeout", [](ServerOptions& o) { o.drain_timeout = absl::Seconds(-1); }},
      {"--max-stream-buffer-bytes", [](ServerOptions& o) { o.max_stream_buffer_bytes = 100; }},
      {"--max-stream-buffer-bytes",
       [](ServerOptions& o) { o.max_stream_buffer_bytes = o.max_send_message_bytes; }},
      {"--tls-reload-interval",
       [](ServerOptions& o) { o.tls_reload_interval = absl::Milliseconds(10); }},
      {"--threads", [](ServerOptions& o) { o.threads = -1; }},
      // Speculation flags were refused only after loading the model, by one message naming
      // the engine's fields, not the flag.
      {"--spec-tokens", [](ServerOptions& o) { o.engine.spec_tokens = 100000; }},
      {"--spec-tokens", [](ServerOptions& o) { o.engine.spec_tokens = -1; }},
      {"--spec-ngram-min", [](ServerOptions& o) { o.engine.spec_ngram_min = 0; }},
      {"--spec-ngram-min",
       [](ServerOptions& o) {
         o.engine.spec_ngram_min = 5;
         o.engine.spec_ngram_max = 2;
       }},
      {"--spec-ngram-max", [](ServerOptions& o) { o.engine.spec_ngram_max = 33; }},
      {"--spec-max-step-drafts", [](ServerOptions& o) { o.engine.spec_max_step_drafts = -1; }},
      {"--spec-step-tokens",
       [](ServerOptions& o) { o.engine.spec_step_tokens = o.engine.max_num_batched_tokens + 1; }},
  };
  for (const Case& c : cases) {
    ServerOptions o = base();
    c.mutate(o);
    absl::Status s = ValidateServerOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.flag;
    EXPECT_NE(std::string(s.message()).find(c.flag), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace dcf::server
