// libFuzzer target for the byte-level BPE tokenizer (GPT-2 vocabulary).
// The first input byte picks the mode:
//  * even: the rest is text. Encode must succeed; the ids' raw bytes must concatenate to the
//    text exactly; Decode must equal the lossy UTF-8 conversion of the text (so equal the text
//    itself when it is valid UTF-8); streaming decode must equal Decode.
//  * odd: the rest is a sequence of little-endian uint16 token ids (mod vocab_size); streaming
//    decode one id at a time must equal Decode and emit valid UTF-8 pieces only.
// Any violated property aborts, which libFuzzer reports as a crash.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "engine/common/utf8.h"

namespace {

const dcf::Tokenizer& Gpt2() {
  static const dcf::Tokenizer* tok = [] {
    const char* env = std::getenv("DCF_FUZZ_TOKENIZER_JSON");
    const std::string path =
        env != nullptr ? env : std::string(DCF_TEST_DATA_DIR) + "/tokenizer/gpt2/tokenizer.json";
    auto t = dcf::Tokenizer::FromFile(path);
    if (!t.ok()) {
      std::fprintf(stderr, "cannot load %s: %s\n", path.c_str(), t.status().ToString().c_str());
      std::abort();
    }
    return t->release();
  }();
  return *tok;
}

void Check(bool cond, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "tokenizer_fuzz: property violated: %s\n", what);
    std::abort();
  }
}

std::string Stream(const dcf::Tokenizer& tok, const std::vector<int32_t>& ids) {
  dcf::StreamingDetokenizer detok(tok);
  std::string all;
  for (int32_t id : ids) {
    auto piece = detok.Push(id);
    Check(piece.ok(), "Push of a valid id failed");
    Check(dcf::IsValidUtf8(*piece), "streamed piece is not valid UTF-8");
    all += *piece;
  }
  const std::string tail = detok.Finish();
  Check(dcf::IsValidUtf8(tail), "Finish() is not valid UTF-8");
  return all + tail;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const dcf::Tokenizer& tok = Gpt2();
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<int32_t> ids;
  if (data[0] % 2 == 0) {
    auto encoded = tok.Encode(rest);
    Check(encoded.ok(), "Encode failed");
    ids = *std::move(encoded);
    std::string bytes;
    for (int32_t id : ids) {
      auto b = tok.TokenBytes(id);
      Check(b.has_value(), "Encode produced an unknown id");
      bytes.append(*b);
    }
    Check(bytes == rest, "token bytes do not concatenate to the input");
    std::string lossy;
    dcf::AppendUtf8Lossy(rest, &lossy, /*hold_incomplete_tail=*/false);
    auto decoded = tok.Decode(ids);
    Check(decoded.ok(), "Decode failed");
    Check(*decoded == lossy, "Decode(Encode(x)) != lossy(x)");
    if (dcf::IsValidUtf8(rest)) Check(*decoded == rest, "Decode(Encode(x)) != x for valid UTF-8");
  } else {
    for (size_t i = 0; i + 1 < rest.size(); i += 2) {
      const uint32_t v = static_cast<uint8_t>(rest[i]) | (static_cast<uint8_t>(rest[i + 1]) << 8);
      ids.push_back(static_cast<int32_t>(v % static_cast<uint32_t>(tok.vocab_size())));
    }
  }
  auto decoded = tok.Decode(ids);
  Check(decoded.ok(), "Decode failed");
  Check(dcf::IsValidUtf8(*decoded), "Decode output is not valid UTF-8");
  Check(Stream(tok, ids) == *decoded, "streaming decode != Decode");
  return 0;
}
