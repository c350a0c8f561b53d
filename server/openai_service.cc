#include "server/openai_service.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/logging.h"
#include "engine/common/utf8.h"
#include "engine/common/status_macros.h"
#include "engine/tokenizer/streaming_detokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "server/log_text.h"
#include "server/peer_address.h"
#include "server/status_util.h"

namespace dcf::server {
namespace {

// The generation routes (AddRoutes); Admit and DrainingResponse count the requests they
// refuse on them.
constexpr char kCompletionsPath[] = "/v1/completions";
constexpr char kChatCompletionsPath[] = "/v1/chat/completions";
constexpr char kHealthPath[] = "/health";

bool IsGenerationRequest(const HttpRequest& head) {
  return head.method == "POST" &&
         (head.path == kCompletionsPath || head.path == kChatCompletionsPath);
}

// The `code` of an error the HTTP layer (or a route) answers by HTTP status alone.
const char* HttpStatusLabel(int status) {
  switch (status) {
    case 400: return "invalid_argument";
    case 401: return "unauthenticated";
    case 403: return "permission_denied";
    case 404: return "not_found";
    case 405: return "method_not_allowed";
    case 413: return "payload_too_large";
    case 415: return "unsupported_media_type";
    case 429: return "resource_exhausted";
    case 431: return "header_too_large";
    case 501: return "unimplemented";  // the gRPC code's name, as a Status' 501 has
    case 503: return "unavailable";
    case 505: return "http_version_not_supported";
    default: return status >= 500 ? "internal" : "invalid_request";
  }
}

// GET /health: what the gRPC health says, as text.
HttpResponse HealthResponse(bool serving) {
  HttpResponse r;
  r.status = serving ? 200 : 503;
  r.body = serving ? "SERVING\n" : "NOT_SERVING\n";
  return r;
}

using Json = nlohmann::json;

// Token text can be a piece of a UTF-8 character: such bytes become U+FFFD in the JSON.
std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

HttpResponse JsonResponse(int status, const Json& body) {
  HttpResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = Dump(body);
  r.body.push_back('\n');
  return r;
}

// OpenAI's finish_reason: "stop" (EOS, a stop token or string) or "length"; vLLM's "abort"
// for a request the server cancelled (drain).
const char* OpenAiFinishReason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength: return "length";
    case FinishReason::kEos:
    case FinishReason::kStopToken:
    case FinishReason::kStopString: return "stop";
    default: return "abort";
  }
}

std::string RandomId(absl::string_view prefix) {
  static absl::Mutex mu(absl::kConstInit);
  static absl::BitGen* gen = new absl::BitGen();
  absl::MutexLock lock(&mu);
  return absl::StrFormat("%s%016x%08x", prefix, absl::Uniform<uint64_t>(*gen),
                         absl::Uniform<uint32_t>(*gen));
}

// An HTTP stream in ServingState's books (the drain waits for it, --max-open-streams counts
// it). Its write deadline is the HTTP layer's (stream_write_timeout), not the watchdog's.
struct HttpOpenStream : OpenStream {
  void EndIfStalled(int64_t) override {}
};

// A whole answer at once (an error before anything was enqueued).
class FixedSource : public HttpBodySource {
 public:
  explicit FixedSource(HttpResponse response) : response_(std::move(response)) {}
  HttpPull Pull() override {
    HttpPull p;
    p.kind = HttpPull::Kind::kResponse;
    p.response = std::move(response_);
    return p;
  }

 private:
  HttpResponse response_;
};

// One request's choices, pulled by the connection (see openai_service.h).
class GenerationSource : public HttpBodySource {
 public:
  GenerationSource(ServingState* state, OpenAiRequest request, OpenAiPlan plan, HttpWake wake)
      : state_(state),
        request_(std::move(request)),
        plan_(std::move(plan)),
        wake_(std::move(wake)),
        chat_(request_.api == OpenAiApi::kChatCompletions),
        id_(RandomId(chat_ ? "chatcmpl-" : "cmpl-")),
        created_(absl::ToUnixSeconds(absl::Now())),
        link_(std::make_shared<HttpOpenStream>()) {}

  ~GenerationSource() override {
    for (Choice& c : choices_) {
      if (!c.recorded) Record(&c, "cancelled");
    }
    Unregister();
  }

  // Registers the stream, then enqueues every choice as one group (Engine::EnqueueAll); an
  // error leaves nothing enqueued. Choices that together can never wait in the engine's queue
  // are refused first: OutOfRange (400), not the 429 of too many open streams, which
  // OpenAI's SDKs would retry.
  absl::Status Start(const std::string& peer) {
    int failed = -1;
    if (absl::Status s = state_->engine()->CheckQueueable(plan_.requests, &failed); !s.ok()) {
      return InEngineGroupTerms(s, failed);
    }
    link_->peer = PeerAddressOfIp(peer);
    // --max-open-streams and --max-open-streams-per-peer, counted with gRPC's streams.
    if (grpc::Status s = state_->RegisterStream(link_); !s.ok()) {
      return absl::ResourceExhaustedError(s.error_message());
    }
    registered_ = true;
    std::vector<GenerationRequest> requests = plan_.requests;
    for (GenerationRequest& g : requests) g.origin = static_cast<int>(Protocol::kHttp);
    absl::StatusOr<std::vector<RequestHandle>> handles =
        state_->engine()->EnqueueAll(std::move(requests), &failed);
    if (!handles.ok()) return InEngineGroupTerms(handles.status(), failed);
    const int n = request_.n;
    choices_.resize(handles->size());
    for (size_t i = 0; i < choices_.size(); ++i) {
      choices_[i].handle = std::move((*handles)[i]);
      choices_[i].prompt = static_cast<int>(i) / n;
      // Each prompt once, whatever n (as `usage` counts it).
      if (i % n == 0) {
        state_->metrics().AddPromptTokens(plan_.requests[i].prompt_tokens.size(),
                                          Protocol::kHttp);
      }
      HttpWake wake = wake_;
      choices_[i].handle.stream().SetOnReady([wake]() { wake(); });
    }
    return absl::OkStatus();
  }

  // An engine refusal in OpenAI's field names: of choice `failed` (its prompt's), or of the
  // group (-1: the "requests" field, which InOpenAiTerms names n, prompt or messages).
  absl::Status InEngineGroupTerms(const absl::Status& s, int failed) const {
    return InOpenAiTerms(s, request_, failed >= 0 ? failed / request_.n : 0);
  }

  HttpPull Pull() override {
    HttpPull pull;
    if (!request_.stream) {
      for (Choice& c : choices_) Take(&c, nullptr);
      // A failed choice fails the response: it is answered now, and the choices still
      // running are cancelled in the engine (nothing could send their output).
      for (const Choice& c : choices_) {
        if (c.finished && c.reason == FinishReason::kError) {
          const std::string message(c.error.message().empty() ? "engine error"
                                                              : c.error.message());
          for (Choice& r : choices_) {
            if (r.finished) {
              Record(&r, FinishReasonName(r.reason));
            } else {
              r.handle.Cancel();
              Record(&r, "cancelled");
            }
          }
          pull.kind = HttpPull::Kind::kResponse;
          pull.response = OpenAiService::ErrorResponse(500, message);
          End("error");
          return pull;
        }
      }
      // What the body holds so far is at most what it will hold: past the limit already, the
      // request ends now (after a failed choice's 500, which says more), its choices
      // cancelled in the engine.
      if (body_bytes_ > ResponseLimit()) return TooLarge(body_bytes_, /*exact=*/false);
      if (!AllFinished()) return pull;  // kWait
      HttpResponse response;
      response.status = 200;
      response.content_type = "application/json";
      response.body = WholeResponse();
      if (response.body.size() > ResponseLimit()) return TooLarge(response.body.size(), true);
      for (Choice& c : choices_) {
        state_->metrics().AddGeneratedTokens(c.generated, Protocol::kHttp);
        Record(&c, FinishReasonName(c.reason));
      }
      pull.kind = HttpPull::Kind::kResponse;
      pull.response = std::move(response);
      End();
      return pull;
    }
    if (ended_) {  // the [DONE] went out with the stream's head
      pull.kind = HttpPull::Kind::kEnd;
      End();
      return pull;
    }
    std::string out;
    for (Choice& c : choices_) Take(&c, &out);
    const bool end = AllFinished();
    if (end) {
      if (request_.include_usage) {
        Json usage = Chunk();
        usage["choices"] = Json::array();
        usage["usage"] = Usage();
        AppendEvent(usage, &out);
      }
      out += "data: [DONE]\n\n";
    }
    if (!head_sent_) {
      head_sent_ = true;
      pull.kind = HttpPull::Kind::kStreamHead;
      pull.response.status = 200;
      pull.response.content_type = "text/event-stream";
      pull.response.body = std::move(out);
      if (end) ended_ = true;  // the [DONE] is in the head's body: end at the next pull
      return pull;
    }
    if (end) {
      pull.kind = HttpPull::Kind::kEnd;
      pull.data = std::move(out);
      End();
      return pull;
    }
    if (out.empty()) return pull;  // kWait
    pull.kind = HttpPull::Kind::kData;
    pull.data = std::move(out);
    return pull;
  }

  // The client reads slower than the engine writes: output waits in the request streams;
  // past --max-stream-buffer-bytes the exchange ends and the requests are cancelled.
  bool KeepWaiting() override {
    const size_t limit = state_->options().max_stream_buffer_bytes;
    size_t pending = 0;
    for (const Choice& c : choices_) {
      if (c.handle.shared_stream() != nullptr) pending += c.handle.stream().pending_bytes();
    }
    if (limit > 0 && pending > limit) {
      abort_outcome_ = "resource_exhausted";
      return false;
    }
    return true;
  }

  void OnAbort(absl::string_view reason) override {
    const char* outcome = abort_outcome_ != nullptr ? abort_outcome_ : "cancelled";
    for (Choice& c : choices_) {
      c.handle.Cancel();  // frees its KV blocks within a step
      if (!c.recorded) Record(&c, outcome);
    }
    DCF_LOG(Info) << "request id=" << id_ << " protocol=http outcome=" << outcome
                  << " choices=" << choices_.size() << " (" << reason << ")";
    Unregister();
  }

 private:
  // A non-streamed choice's logprobs as its JSON will hold them: the elements of each array,
  // serialized (comma-separated) as each chunk arrives, so the body's size is known as it
  // grows and no tree of every token is built. Chat: `content`; completions: the four columns.
  struct LogprobsText {
    std::string content;
    std::string tokens, token_logprobs, top_logprobs, text_offset;
    size_t size() const {
      return content.size() + tokens.size() + token_logprobs.size() + top_logprobs.size() +
             text_offset.size();
    }
  };

  struct Choice {
    RequestHandle handle;
    int prompt = 0;
    std::string text;          // non-streamed: the whole text
    LogprobsText logprobs;     // non-streamed, with logprobs: every token's, serialized
    int generated = 0;
    // Completions logprobs: characters (code points) of the text so far, and the tokens'
    // text as `text` has it (an unfinished character held back). No echo comes before it:
    // echo with logprobs is refused (openai_request.cc).
    int text_offset = 0;
    std::unique_ptr<StreamingDetokenizer> offsets;
    bool started = false;  // streamed: the first event (role, echo) was sent
    bool finished = false;
    bool recorded = false;
    FinishReason reason = FinishReason::kUnspecified;
    absl::Status error;
  };

  bool AllFinished() const {
    for (const Choice& c : choices_) {
      if (!c.finished) return false;
    }
    return true;
  }

  void Record(Choice* c, const std::string& outcome) {
    c->recorded = true;
    state_->metrics().RecordRequest(outcome, Protocol::kHttp);
  }

  // --max-send-message-bytes: gRPC's largest response message, and the largest non-streamed
  // OpenAI body (a stream's events are each small, and bounded while waiting for the client by
  // --max-stream-buffer-bytes).
  size_t ResponseLimit() const {
    return static_cast<size_t>(state_->options().max_send_message_bytes);
  }

  // The non-streamed response passed ResponseLimit() (`bytes`: its size, or while generating
  // a lower bound of it): every choice is cancelled in the engine (its KV blocks are freed
  // within a step) and counted out_of_range; the client gets the 400 (a retry would fail the
  // same way: not the 429 OpenAI's SDKs retry).
  HttpPull TooLarge(size_t bytes, bool exact) {
    const size_t limit = ResponseLimit();
    for (Choice& c : choices_) {
      c.handle.Cancel();
      if (!c.recorded) Record(&c, "out_of_range");
    }
    DCF_LOG(Info) << "request id=" << id_ << " protocol=http outcome=out_of_range choices="
                  << choices_.size() << " (non-streamed response " << (exact ? "of " : "past ")
                  << bytes << " bytes, over --max-send-message-bytes " << limit << ")";
    Unregister();
    HttpPull pull;
    pull.kind = HttpPull::Kind::kResponse;
    pull.response = OpenAiService::ErrorResponse(absl::OutOfRangeError(absl::StrCat(
        "the response would be ", exact ? "" : "more than ", bytes, " bytes, over the ",
        limit, " bytes a non-streamed response may have (--max-send-message-bytes): set "
        "\"stream\": true (each event is small) or ask for less (n, max_tokens, logprobs)")));
    return pull;
  }

  // The exchange's last response went out: logged with `outcome` (default: the first
  // choice's finish reason).
  void End(absl::string_view outcome = {}) {
    DCF_LOG(Info) << "request id=" << id_ << " protocol=http outcome="
                  << (!outcome.empty()      ? std::string(outcome)
                      : choices_.empty() ? std::string("-")
                                         : FinishReasonName(choices_[0].reason))
                  << " choices=" << choices_.size() << " prompt_tokens=" << PromptTokens()
                  << " generated_tokens=" << GeneratedTokens()
                  << " total_ms=" << absl::ToDoubleMilliseconds(absl::Now() - start_);
    Unregister();
  }

  void Unregister() {
    if (!registered_) return;
    registered_ = false;
    state_->StreamDone(link_);
  }

  int PromptTokens() const {
    int total = 0;
    for (int p : plan_.prompt_tokens) total += p;
    return total;
  }
  int GeneratedTokens() const {
    int total = 0;
    for (const Choice& c : choices_) total += c.generated;
    return total;
  }
  Json Usage() const {
    const int prompt = PromptTokens(), generated = GeneratedTokens();
    return {{"prompt_tokens", prompt},
            {"completion_tokens", generated},
            {"total_tokens", prompt + generated}};
  }

  Json Chunk() const {
    return {{"id", id_},
            {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", state_->info().model_name}};
  }

  static void AppendEvent(const Json& event, std::string* out) {
    absl::StrAppend(out, "data: ", Dump(event), "\n\n");
  }

  std::string TokenText(int32_t id) const {
    const Tokenizer* tokenizer = state_->limits().tokenizer;
    if (tokenizer == nullptr) return absl::StrCat("token_id:", id);
    std::optional<std::string_view> bytes = tokenizer->TokenBytes(id);
    return bytes.has_value() ? std::string(*bytes) : std::string();
  }
  static Json Bytes(const std::string& s) {
    Json b = Json::array();
    for (unsigned char ch : s) b.push_back(static_cast<int>(ch));
    return b;
  }

  // Characters (code points) of valid UTF-8.
  static int CodePoints(std::string_view utf8) {
    return static_cast<int>(std::count_if(utf8.begin(), utf8.end(), [](char ch) {
      return (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
    }));
  }

  // Completions' text_offset of `token` (whose text is `token_text`, TokenText), the next of
  // `c`, which then moves past it: offsets
  // index `text` in characters (code points), as OpenAI's and vLLM's do, so the tokens of a
  // character split across several all sit at its start, and a token after bytes that never
  // became a character sits after their U+FFFD. (Bytes of token text before: those of a split
  // character each counted, and past the text's end.)
  int NextTextOffset(int32_t token, const std::string& token_text, Choice* c) const {
    const int offset = c->text_offset;
    const Tokenizer* tokenizer = state_->limits().tokenizer;
    if (tokenizer == nullptr) {  // no text: the ids' placeholders
      c->text_offset += static_cast<int>(token_text.size());
      return offset;
    }
    if (c->offsets == nullptr) {
      // As the engine's text: special tokens skipped (OutputProcessor).
      c->offsets = std::make_unique<StreamingDetokenizer>(*tokenizer, /*skip_special_tokens=*/true);
    }
    absl::StatusOr<std::string> text = c->offsets->Push(token);
    if (!text.ok()) return offset;
    const int added = CodePoints(*text);
    c->text_offset += added;
    // What the token added ends with its own characters; before them may come bytes that
    // earlier tokens left held back and this one did not complete, flushed as U+FFFD. The
    // token starts where its own characters do (at the start of what it added when it
    // completes a held-back character, and where the text is when it adds nothing).
    std::string alone;
    AppendUtf8Lossy(token_text, &alone, /*hold_incomplete_tail=*/true);
    return offset + std::max(0, added - CodePoints(alone));
  }

  // Logprobs of `tokens` of choice `c` in the API's shape (completions: c's text_offset
  // advances).
  Json Logprobs(const std::vector<TokenOutput>& tokens, Choice* c) const {
    if (chat_) {
      Json content = Json::array();
      for (const TokenOutput& t : tokens) content.push_back(ChatTokenLogprobs(t));
      return {{"content", content}};
    }
    Json out = {{"tokens", Json::array()},
                {"token_logprobs", Json::array()},
                {"top_logprobs", Json::array()},
                {"text_offset", Json::array()}};
    for (const TokenOutput& t : tokens) {
      const std::string s = TokenText(t.token);
      out["tokens"].push_back(s);
      out["token_logprobs"].push_back(t.logprob);
      out["top_logprobs"].push_back(CompletionTopLogprobs(t));
      out["text_offset"].push_back(NextTextOffset(t.token, s, c));
    }
    return out;
  }

  // Chat: one element of logprobs.content.
  Json ChatTokenLogprobs(const TokenOutput& t) const {
    const std::string s = TokenText(t.token);
    Json top = Json::array();
    for (const TopLogprob& alt : t.top) {
      const std::string a = TokenText(alt.token);
      top.push_back({{"token", a}, {"logprob", alt.logprob}, {"bytes", Bytes(a)}});
    }
    return {{"token", s}, {"logprob", t.logprob}, {"bytes", Bytes(s)}, {"top_logprobs", top}};
  }
  // Completions: one element of logprobs.top_logprobs.
  Json CompletionTopLogprobs(const TokenOutput& t) const {
    Json top = Json::object();
    for (const TopLogprob& alt : t.top) top[TokenText(alt.token)] = alt.logprob;
    return top;
  }

  // Non-streamed: what Logprobs() would give for `tokens`, appended to c's serialized arrays.
  void AppendLogprobs(const std::vector<TokenOutput>& tokens, Choice* c) const {
    auto append = [](const Json& element, std::string* array) {
      if (!array->empty()) array->push_back(',');
      *array += Dump(element);
    };
    LogprobsText& lp = c->logprobs;
    for (const TokenOutput& t : tokens) {
      if (chat_) {
        append(ChatTokenLogprobs(t), &lp.content);
        continue;
      }
      const std::string s = TokenText(t.token);
      append(s, &lp.tokens);
      append(t.logprob, &lp.token_logprobs);
      append(CompletionTopLogprobs(t), &lp.top_logprobs);
      append(NextTextOffset(t.token, s, c), &lp.text_offset);
    }
  }

  // The JSON of Logprobs() from the serialized arrays (nlohmann's objects dump their keys in
  // sorted order; so does this).
  std::string LogprobsJson(const LogprobsText& lp) const {
    if (chat_) return absl::StrCat("{\"content\":[", lp.content, "]}");
    return absl::StrCat("{\"text_offset\":[", lp.text_offset, "],\"token_logprobs\":[",
                        lp.token_logprobs, "],\"tokens\":[", lp.tokens, "],\"top_logprobs\":[",
                        lp.top_logprobs, "]}");
  }

  // Takes what `c`'s stream has; streamed (`out` set): appends its events.
  void Take(Choice* c, std::string* out) {
    if (c->finished) return;
    GenerationChunk chunk;
    if (!c->handle.stream().TryTake(&chunk)) return;
    const int index = static_cast<int>(c - choices_.data());
    c->generated += static_cast<int>(chunk.tokens.size());
    // Tokens count as sent when they are handed to the connection: streamed, in this Pull;
    // non-streamed, with the 200 (a 400 over the size limit or a 500 sends none).
    if (out != nullptr) {
      state_->metrics().AddGeneratedTokens(static_cast<int64_t>(chunk.tokens.size()),
                                           Protocol::kHttp);
    }
    if (chunk.finished) {
      c->finished = true;
      c->reason = chunk.finish_reason;
      c->error = chunk.error;
      // Streamed: counted as it ends. Non-streamed: once the response is decided (Pull), since
      // a response over the size limit fails every choice.
      if (out != nullptr) Record(c, FinishReasonName(chunk.finish_reason));
    }
    const std::string& echo = plan_.prompt_texts[c->prompt];
    if (out == nullptr) {
      const size_t before = c->text.size() + c->logprobs.size();
      if (!c->started && request_.echo) c->text = echo;
      c->started = true;
      c->text += chunk.text;
      if (request_.logprobs) AppendLogprobs(chunk.tokens, c);
      // The text's bytes are at most its JSON string's (escapes and U+FFFD only add), the
      // logprobs are as serialized: a lower bound of what the choice adds to the body.
      body_bytes_ += c->text.size() + c->logprobs.size() - before;
      return;
    }
    if (chunk.finished && chunk.finish_reason == FinishReason::kError) {
      // vLLM's in-stream error: an error event, then [DONE].
      const std::string message(chunk.error.message().empty() ? "engine error"
                                                              : chunk.error.message());
      AppendEvent({{"error",
                    {{"message", message}, {"type", "server_error"}, {"param", nullptr},
                     {"code", "internal"}}}},
                  out);
      return;
    }
    std::string text = chunk.text;
    if (!c->started && !chat_ && request_.echo) text = echo + text;
    Json choice = {{"index", index}};
    if (chat_) {
      Json delta = Json::object();
      if (!c->started) delta["role"] = "assistant";
      if (!text.empty() || !c->started) delta["content"] = text;
      choice["delta"] = delta;
    } else {
      choice["text"] = text;
    }
    const bool has_content = !text.empty() || !chunk.tokens.empty() || !c->started;
    choice["logprobs"] = request_.logprobs && !chunk.tokens.empty()
                             ? Logprobs(chunk.tokens, c)
                             : Json(nullptr);
    choice["finish_reason"] =
        chunk.finished ? Json(OpenAiFinishReason(chunk.finish_reason)) : Json(nullptr);
    c->started = true;
    if (!has_content && !chunk.finished) return;
    Json event = Chunk();
    event["choices"] = Json::array({choice});
    if (request_.include_usage) event["usage"] = nullptr;
    AppendEvent(event, out);
  }

  // The non-streamed body, as nlohmann would dump the whole tree (keys sorted, "choices"
  // first), built one choice at a time; each choice's text and logprobs are freed as they go
  // in.
  std::string WholeResponse() {
    std::string body = "{\"choices\":[";
    body.reserve(body_bytes_ + 256 * (choices_.size() + 1));
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& c = choices_[i];
      Json choice = {{"index", static_cast<int>(i)},
                     {"logprobs", nullptr},
                     {"finish_reason", OpenAiFinishReason(c.reason)}};
      if (chat_) {
        choice["message"] = {{"role", "assistant"}, {"content", std::move(c.text)}};
      } else {
        choice["text"] = std::move(c.text);
      }
      std::string s = Dump(choice);
      if (request_.logprobs) {
        // Only "finish_reason" and "index" precede it: the first match is the key.
        constexpr std::string_view kNull = "\"logprobs\":null";
        const size_t at = s.find(kNull);
        DCF_CHECK(at != std::string::npos);
        s.replace(at + kNull.size() - 4, 4, LogprobsJson(c.logprobs));
      }
      c.logprobs = LogprobsText();
      if (i > 0) body.push_back(',');
      body += s;
    }
    body += "],";
    const Json rest = {{"id", id_},
                       {"object", chat_ ? "chat.completion" : "text_completion"},
                       {"created", created_},
                       {"model", state_->info().model_name},
                       {"usage", Usage()}};
    body.append(Dump(rest), 1);  // without its "{"
    body.push_back('\n');
    return body;
  }

  ServingState* const state_;
  const OpenAiRequest request_;
  const OpenAiPlan plan_;
  const HttpWake wake_;
  const bool chat_;
  const std::string id_;
  const int64_t created_;
  const absl::Time start_ = absl::Now();
  const std::shared_ptr<HttpOpenStream> link_;
  bool registered_ = false;
  std::vector<Choice> choices_;
  bool head_sent_ = false;
  bool ended_ = false;
  const char* abort_outcome_ = nullptr;
  // Non-streamed: a lower bound of the body's size so far (the choices' text and logprobs).
  size_t body_bytes_ = 0;
};

}  // namespace

HttpResponse OpenAiService::ErrorResponse(int status, absl::string_view message,
                                          absl::string_view param, const char* code) {
  if (code == nullptr) code = HttpStatusLabel(status);
  Json error = {{"message", std::string(message)},
                {"type", HttpErrorType(status)},
                {"param", param.empty() ? Json(nullptr) : Json(std::string(param))},
                {"code", code}};
  HttpResponse r = JsonResponse(status, {{"error", error}});
  if (status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

HttpResponse OpenAiService::ErrorResponse(const absl::Status& status) {
  // `code`: the label of the gRPC code the same Status gets (requests_total's outcome), so
  // that out_of_range (can never fit) and invalid_argument stay apart under one 400.
  return ErrorResponse(ToHttpError(status).status, status.message(), OpenAiParam(status),
                       GrpcCodeLabel(ToGrpcStatus(status).error_code()));
}

std::optional<HttpResponse> OpenAiService::Admit(const HttpRequest& head) const {
  const ApiKeyChecker* auth = state_->auth();
  if (auth == nullptr || !absl::StartsWith(head.path, "/v1/")) return std::nullopt;
  const std::string* header = head.Header("authorization");
  const absl::Status s =
      header == nullptr
          ? absl::UnauthenticatedError("missing 'Authorization: Bearer <api key>' header")
          : auth->CheckHeader(*header);
  if (s.ok()) return std::nullopt;
  // A refused generation request counts as gRPC counts a refused Generate call.
  if (IsGenerationRequest(head)) {
    state_->metrics().RecordRequest("unauthenticated", Protocol::kHttp);
    DCF_LOG(Info) << "request id=- protocol=http outcome=unauthenticated status=401";
  }
  return ErrorResponse(401, s.message());
}

HttpResponse OpenAiService::DrainingResponse(const HttpRequest& head) const {
  const absl::Status refused = absl::UnavailableError("server is shutting down");
  if (head.path == kHealthPath && (head.method == "GET" || head.method == "HEAD")) {
    return HealthResponse(/*serving=*/false);
  }
  return IsGenerationRequest(head) ? Refused(refused) : ErrorResponse(refused);
}

HttpResponse OpenAiService::Refused(const absl::Status& status) const {
  const std::string outcome = GrpcCodeLabel(ToGrpcStatus(status).error_code());
  state_->metrics().RecordRequest(outcome, Protocol::kHttp);
  HttpResponse response = ErrorResponse(status);
  // The line every request gets (as a refused Generate call's): no message, which may quote
  // the request.
  DCF_LOG(Info) << "request id=- protocol=http outcome=" << outcome
                << " status=" << response.status;
  return response;
}

void OpenAiService::AddRoutes(HttpRouter* router) {
  router->AddAsync("POST", kCompletionsPath, [this](HttpRequest request, HttpWake wake) {
    return Generate(OpenAiApi::kCompletions, std::move(request), std::move(wake));
  });
  router->AddAsync("POST", kChatCompletionsPath, [this](HttpRequest request, HttpWake wake) {
    return Generate(OpenAiApi::kChatCompletions, std::move(request), std::move(wake));
  });
  router->Add("GET", "/v1/models", [this](const HttpRequest&) { return Models(); });
  router->Add("GET", kHealthPath, [this](const HttpRequest&) {
    return HealthResponse(serving_() && state_->CheckAccepting().ok());
  });
}

HttpResponse OpenAiService::Models() const {
  if (absl::Status s = state_->CheckAccepting(); !s.ok()) return ErrorResponse(s);
  const ServedModelInfo& info = state_->info();
  Json model = {{"id", info.model_name},
                {"object", "model"},
                {"created", 0},
                {"owned_by", "dcformer-serve"},
                {"max_model_len", info.limits.context}};
  return JsonResponse(200, {{"object", "list"}, {"data", Json::array({model})}});
}

std::shared_ptr<HttpBodySource> OpenAiService::Generate(OpenAiApi api, HttpRequest request,
                                                        HttpWake wake) {
  auto refuse = [this](const absl::Status& s) -> std::shared_ptr<HttpBodySource> {
    return std::make_shared<FixedSource>(Refused(s));
  };
  if (absl::Status s = state_->CheckAccepting(); !s.ok()) return refuse(s);
  absl::StatusOr<OpenAiRequest> parsed = ParseOpenAiRequest(api, request.body);
  if (!parsed.ok()) return refuse(parsed.status());
  if (parsed->model != state_->info().model_name) {
    return refuse(absl::NotFoundError(absl::StrCat("model: the model '", parsed->model,
                                                   "' does not exist; this server serves '",
                                                   state_->info().model_name, "'")));
  }
  absl::StatusOr<OpenAiPlan> plan = PlanOpenAiRequest(*parsed, state_->limits(), chat_);
  if (!plan.ok()) return refuse(plan.status());
  auto source = std::make_shared<GenerationSource>(state_, *std::move(parsed), *std::move(plan),
                                                   std::move(wake));
  if (absl::Status s = source->Start(request.peer); !s.ok()) return refuse(s);
  return source;
}

}  // namespace dcf::server
