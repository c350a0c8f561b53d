// Encode/decode throughput of the byte-level BPE tokenizer.
// Usage: tokenizer_bench [tokenizer.json] [megabytes=8] [threads=1]
// The text is generated deterministically: the GPT-2 reference cases plus synthetic prose with
// digits, punctuation, code, CJK, Cyrillic, Arabic and emoji, repeated with varying numbers so
// that the word cache sees both hits and misses. Prints MB/s for a cold-cache and a warm-cache
// encode pass and for decoding.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

std::string MakeText(size_t target_bytes) {
  std::vector<std::string> snippets;
  std::ifstream in(std::string(DCF_TEST_DATA_DIR) + "/tokenizer/gpt2/cases.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("text")) snippets.push_back(j["text"].get<std::string>());
  }
  const std::vector<std::string> words = {"the",         "model",       "attention",
                                          "dynamically", "composed",    "heads",
                                          "of",          "serving",     "tokens",
                                          "a",           "with",        "kernel",
                                          "cache",       "request",     "latency",
                                          "GPU",         "Transformer", "is",
                                          "and",         "for",         "batch",
                                          "über",        "naïve",       "东京",
                                          "模型",        "Привет",      "мир",
                                          "مرحبا",       "שלום",        "🚀",
                                          "👍🏽",    "x_1",         "foo()",
                                          "{key:",       "value}",      "isn't",
                                          "we'll",       "--flag",      "e\xCC\x81t\xC3\xA9",
                                          "\t",          "\n",          "..."};
  std::mt19937 rng(42);
  std::string text;
  text.reserve(target_bytes + 1024);
  while (text.size() < target_bytes) {
    const int kind = static_cast<int>(rng() % 10);
    if (kind == 0 && !snippets.empty()) {
      text += snippets[rng() % snippets.size()];
      text += '\n';
    } else if (kind == 1) {
      text += ' ';
      text += std::to_string(rng() % 100000);
      text += '.';
      text += std::to_string(rng() % 100);
      text += ',';
    } else {
      for (int w = 0; w < 12; ++w) {
        text += ' ';
        text += words[rng() % words.size()];
      }
      text += (rng() % 3 == 0) ? ".\n" : ". ";
    }
  }
  return text;
}

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 && argv[1][0] != '\0'
                               ? argv[1]
                               : std::string(DCF_TEST_DATA_DIR) + "/tokenizer/gpt2/tokenizer.json";
  const double megabytes = argc > 2 ? std::atof(argv[2]) : 8.0;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  auto t0 = std::chrono::steady_clock::now();
  auto tok = dcf::Tokenizer::FromFile(path);
  if (!tok.ok()) {
    std::fprintf(stderr, "load failed: %s\n", tok.status().ToString().c_str());
    return 1;
  }
  std::printf("load: %.1f ms\n", Seconds(t0) * 1e3);
  const std::string text = MakeText(static_cast<size_t>(megabytes * 1e6));
  const double mb = static_cast<double>(text.size()) / 1e6;

  std::vector<int32_t> ids;
  for (const char* pass : {"cold", "warm"}) {
    t0 = std::chrono::steady_clock::now();
    ids = *(*tok)->Encode(text);
    const double s = Seconds(t0);
    std::printf("encode (%s cache, 1 thread): %.2f MB in %.3f s = %.1f MB/s, %zu tokens\n", pass,
                mb, s, mb / s, ids.size());
  }
  t0 = std::chrono::steady_clock::now();
  const std::string decoded = *(*tok)->Decode(ids);
  std::printf("decode: %.1f MB/s, roundtrip %s\n", mb / Seconds(t0),
              decoded == text ? "ok" : "MISMATCH");
  if (threads > 1) {
    // Each thread encodes its own slice of lines; the shared word cache is exercised.
    t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    const size_t chunk = text.size() / threads;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back(
          [&, t] { (void)(*tok)->Encode(std::string_view(text).substr(t * chunk, chunk)); });
    }
    for (auto& th : pool) th.join();
    std::printf("encode (%d threads): %.1f MB/s total\n", threads, mb / Seconds(t0));
  }
  return decoded == text ? 0 : 1;
}
