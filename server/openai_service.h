// The OpenAI-compatible HTTP front (--http-port): the routes it adds to an HttpRouter, on the
// same engine, ServingState (admission, drain, stream cap, API keys) and metrics as the gRPC
// TextGeneration service. docs/OPENAI_API.md documents the fields and the behaviour.
//
//   POST /v1/completions, POST /v1/chat/completions  (asynchronous routes: JSON, or SSE when
//        "stream": true, `data: {json}\n\n` events ending with `data: [DONE]\n\n`)
//   GET  /v1/models, GET /health (200 only while the gRPC health is SERVING)
//
// A request is parsed and planned by openai_request.h into one engine request per choice
// (prompts x n), each validated by the engine's own validator before any is enqueued; every
// choice's stream wakes the connection (HttpWake: an atomic flag and a post to its strand,
// never more on the engine loop thread), and the connection pulls the next SSE event only
// when its previous write is done, so output waits in the engine's RequestStreams, bounded by
// --max-stream-buffer-bytes (past it the exchange ends and the requests are cancelled). A
// non-streamed response's body is bounded by --max-send-message-bytes, counted as the choices'
// text and logprobs arrive (past it every choice is cancelled and the request gets 400). A
// client that disconnects cancels every choice in the engine (its KV blocks are freed within
// a step). Errors are OpenAI's {"error": {"message", "type", "param", "code"}} with the
// status ToHttpError (status_util.h) maps the engine Status to.
//
// Thread-safety: the handlers run on the HTTP server's threads; everything they touch is
// thread-safe (ServingState, the engine, the chat template).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/chat_template.h"
#include "server/http_server.h"
#include "server/openai_request.h"
#include "server/serving_state.h"

namespace dcf::server {

class OpenAiService {
 public:
  // `state` must outlive the HTTP server the routes are added to; `chat.chat_template` may be
  // null (chat is then refused). `serving` says what the gRPC health says now.
  OpenAiService(ServingState* state, ChatTemplateContext chat, std::function<bool()> serving)
      : state_(state), chat_(std::move(chat)), serving_(std::move(serving)) {}

  void AddRoutes(HttpRouter* router);
  // HttpServerOptions::admit: the API key of every /v1/ request (401 before its body is read).
  std::optional<HttpResponse> Admit(const HttpRequest& head) const;
  // HttpServerOptions::draining_response: 503 for every request while the server drains; a
  // generation request counts as `unavailable` (as a Generate call refused then does), and
  // /health answers NOT_SERVING as its route does.
  HttpResponse DrainingResponse(const HttpRequest& head) const;

  // {"error": {...}} with `status`; `param` null when empty, `code` (when null) a label of the
  // HTTP status.
  static HttpResponse ErrorResponse(int status, absl::string_view message,
                                    absl::string_view param = "", const char* code = nullptr);
  static HttpResponse ErrorResponse(const absl::Status& status);

 private:
  std::shared_ptr<HttpBodySource> Generate(OpenAiApi api, HttpRequest request, HttpWake wake);
  // A refused generation request: counted in requests_total by the Status' gRPC code (as
  // gRPC counts a refused Generate call), answered with ErrorResponse.
  HttpResponse Refused(const absl::Status& status) const;
  HttpResponse Models() const;

  ServingState* const state_;
  const ChatTemplateContext chat_;
  const std::function<bool()> serving_;
};

}  // namespace dcf::server
