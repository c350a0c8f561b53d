#include "engine/weights/torch_checkpoint.h"

#include <zip.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/weights/pickle_test_util.h"

namespace dcf {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testing_util::FakeTensor;
using testing_util::StateDictPickle;

const std::string kGolden =
    std::string(DCF_TEST_DATA_DIR) + "/golden/dcpythia-f16-bin/pytorch_model.bin";

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

fs::path TempPath(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / "torch_checkpoint_test";
  fs::create_directories(dir);
  return dir / name;
}

// Writes a zip of stored (uncompressed) members, as torch.save does.
void WriteZip(const fs::path& path, const std::vector<std::pair<std::string, std::string>>& m) {
  fs::remove(path);
  int err = 0;
  zip_t* zip = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  ASSERT_NE(zip, nullptr) << "zip_open error " << err;
  for (const auto& [name, bytes] : m) {  // `m` outlives zip_close: no copies needed
    zip_source_t* src = zip_source_buffer(zip, bytes.data(), bytes.size(), 0);
    ASSERT_NE(src, nullptr);
    const zip_int64_t idx = zip_file_add(zip, name.c_str(), src, ZIP_FL_ENC_UTF_8);
    ASSERT_GE(idx, 0) << zip_strerror(zip);
    zip_set_file_compression(zip, static_cast<zip_uint64_t>(idx), ZIP_CM_STORE, 0);
  }
  ASSERT_EQ(zip_close(zip), 0) << zip_strerror(zip);
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::vector<float> ReadAll(CheckpointReader& reader, const std::string& name) {
  for (const TensorInfo& t : reader.tensors()) {
    if (t.name != name) continue;
    std::vector<float> out(static_cast<size_t>(t.NumElements()));
    const absl::Status s = reader.ReadF32(name, absl::MakeSpan(out));
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }
  ADD_FAILURE() << "no tensor " << name;
  return {};
}

// ---------------------------------------------------------------------------------------
// The golden DCPythia checkpoint (tests/data/golden/dcpythia-f16-bin, config: dim 256,
// n_head 8, head_dim 32, n_layer 4, vocab 300, intermediate 1024, window 16, C=4 dynamic
// projections, K=32 rank, I=2, use_qk_norm, linear biases).

std::map<std::string, std::vector<int64_t>> ExpectedGoldenShapes() {
  const int64_t v = 300, e = 256, h = 8, hd = 32, f = 1024, c = 4, k = 32, i = 2;
  std::map<std::string, std::vector<int64_t>> s;
  s["tok_embeddings.weight"] = {v, e};
  s["norm.weight"] = {e};
  s["norm.bias"] = {e};
  s["output.weight"] = {v, e};
  for (int l = 0; l < 4; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    // Cache buffers: even layers are windowed (window 16), odd ones global (block_size 256).
    const int64_t w = l % 2 == 0 ? 16 : 256;
    s[p + "attention.wqkv.weight"] = {3 * e, e};
    s[p + "attention.wqkv.bias"] = {3 * e};
    s[p + "attention.wo.weight"] = {e, e};
    s[p + "attention.wo.bias"] = {e};
    s[p + "attention.dyn_w_proj.dw1"] = {e, 1, c, k};
    s[p + "attention.dyn_w_proj.qkw"] = {1, c, k, 2 * i, h};
    s[p + "attention.dyn_w_proj.dd"] = {e, 1, c * h};
    s[p + "attention.dyn_w_proj.dw_m"] = {e, c * k + c * h};
    s[p + "attention.dyn_w_proj.qkw_m"] = {c, k, 2 * i * h};
    s[p + "attention.dyn_w_proj.pre_proj.w"] = {1, h, h};
    s[p + "attention.dyn_w_proj.post_proj.w"] = {1, h, h};
    s[p + "attention.q_norm.scale"] = {hd};
    s[p + "attention.k_norm.scale"] = {hd};
    s[p + "attention.kv_cache.k_cache"] = {1, h, w, hd};
    s[p + "attention.kv_cache.v_cache"] = {1, h, w, hd};
    s[p + "attention.kv_cache.kw_cache"] = {1, w, 2, h, h};
    s[p + "feed_forward.w1.weight"] = {f, e};
    s[p + "feed_forward.w1.bias"] = {f};
    s[p + "feed_forward.w2.weight"] = {e, f};
    s[p + "feed_forward.w2.bias"] = {e};
    s[p + "ffn_norm.weight"] = {e};
    s[p + "ffn_norm.bias"] = {e};
    s[p + "attention_norm.weight"] = {e};
    s[p + "attention_norm.bias"] = {e};
  }
  return s;
}

TEST(TorchCheckpointTest, GoldenHasEveryTensorWithConfigShapes) {
  auto reader = OpenTorchCheckpoint(kGolden);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const auto expected = ExpectedGoldenShapes();
  const std::vector<TensorInfo>& tensors = (*reader)->tensors();
  ASSERT_EQ(tensors.size(), expected.size());
  EXPECT_EQ(tensors.front().name, "tok_embeddings.weight");  // file order
  EXPECT_EQ(tensors.back().name, "output.weight");
  for (const TensorInfo& t : tensors) {
    auto it = expected.find(t.name);
    ASSERT_NE(it, expected.end()) << "unexpected tensor " << t.name;
    EXPECT_EQ(t.shape, it->second) << t.name;
    EXPECT_EQ(t.dtype, DType::kF16) << t.name;
    std::vector<float> data(static_cast<size_t>(t.NumElements()));
    ASSERT_TRUE((*reader)->ReadF32(t.name, absl::MakeSpan(data)).ok()) << t.name;
    for (float x : data) ASSERT_TRUE(std::isfinite(x)) << t.name;
  }
}

// Expected values were computed at development time by decoding the zip members directly
// with Python's zipfile + pickle (stub find_class/persistent_load) + numpy float16 (float64
// sums of the exact fp16 values); no part of the C++ reader was involved.
TEST(TorchCheckpointTest, GoldenValuesMatchIndependentDecode) {
  auto reader = OpenTorchCheckpoint(kGolden);
  ASSERT_TRUE(reader.ok()) << reader.status();
  struct Expected {
    std::string name;
    double sum;
    float first[3];
    float last;
  };
  const std::vector<Expected> cases = {
      {"tok_embeddings.weight", -402.62316501140594, {1.8427734375f, 0.51904296875f,
                                                      -1.7119140625f}, 0.51513671875f},
      {"layers.0.attention.dyn_w_proj.qkw", 2.179540991783142,
       {0.0228271484375f, 0.0682373046875f, -0.01203155517578125f}, 0.032257080078125f},
      {"layers.0.attention.q_norm.scale", 31.8876953125, {0.853515625f, 1.0458984375f,
                                                          1.2265625f}, 0.720703125f},
      {"layers.1.attention.dyn_w_proj.dw1", 17.21864479780197,
       {0.09161376953125f, -0.0241851806640625f, -0.08477783203125f}, -0.064453125f},
      {"norm.weight", 259.55029296875, {0.86962890625f, 1.0f, 1.0390625f}, 0.8486328125f},
      {"output.weight", -10.556282222270966,
       {-0.059906005859375f, 0.058685302734375f, 0.033111572265625f}, 0.0191497802734375f},
  };
  for (const Expected& c : cases) {
    const std::vector<float> data = ReadAll(**reader, c.name);
    ASSERT_GE(data.size(), 3u);
    double sum = 0;
    for (float x : data) sum += x;
    EXPECT_NEAR(sum, c.sum, 1e-9 * std::max(1.0, std::abs(c.sum))) << c.name;
    EXPECT_THAT(std::vector<float>(data.begin(), data.begin() + 3),
                ElementsAre(c.first[0], c.first[1], c.first[2]))
        << c.name;
    EXPECT_EQ(data.back(), c.last) << c.name;
  }
  // Derived identity projections: pre_proj.w is eye(8) per the reference implementation.
  const std::vector<float> pre = ReadAll(**reader, "layers.2.attention.dyn_w_proj.pre_proj.w");
  ASSERT_EQ(pre.size(), 64u);
  for (int r = 0; r < 8; ++r) {
    for (int c = 0; c < 8; ++c) EXPECT_EQ(pre[r * 8 + c], r == c ? 1.0f : 0.0f);
  }
}

TEST(TorchCheckpointTest, ReadF32ArgumentErrors) {
  auto reader = OpenTorchCheckpoint(kGolden);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<float> small(10);
  absl::Status s = (*reader)->ReadF32("norm.weight", absl::MakeSpan(small));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = (*reader)->ReadF32("no.such.tensor", absl::MakeSpan(small));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("no.such.tensor"));
}

// ---------------------------------------------------------------------------------------
// Generated checkpoints: shared storages, offsets, non-contiguous views.

TEST(TorchCheckpointTest, SharedStorageOffsetsAndStrides) {
  std::vector<float> s0(24);  // storage "0": [24] f32, values 0..23
  for (int k = 0; k < 24; ++k) s0[k] = static_cast<float>(k);
  // storage "1": [6] f16 = 0.5 * k (0x3800 = 0.5, exact halves of small ints)
  const std::vector<uint16_t> s1 = {0x0000, 0x3800, 0x3c00, 0x3e00, 0x4000, 0x4100};
  // storage "2": [2] bf16 = {1.0, -2.0}
  const std::vector<uint16_t> s2 = {0x3f80, 0xc000};
  const std::vector<FakeTensor> views = {
      {"base", "FloatStorage", "0", 24, 0, {4, 6}, {6, 1}},
      {"transposed", "FloatStorage", "0", 24, 0, {6, 4}, {1, 6}},
      {"slice", "FloatStorage", "0", 24, 7, {2, 3}, {6, 2}},
      {"tail", "FloatStorage", "0", 24, 21, {3}, {1}},
      {"scalar", "FloatStorage", "0", 24, 5, {}, {}},
      {"expanded", "FloatStorage", "0", 24, 1, {2, 3}, {0, 1}},
      {"cube_t", "FloatStorage", "0", 24, 0, {3, 2, 4}, {1, 12, 3}},
      {"empty", "FloatStorage", "0", 24, 0, {0, 5}, {5, 1}},
      {"half_t", "HalfStorage", "1", 6, 0, {3, 2}, {1, 3}},
      {"bf16", "BFloat16Storage", "2", 2, 0, {2}, {1}},
  };
  const fs::path path = TempPath("shared.pt");
  WriteZip(path, {{"my model/data.pkl", StateDictPickle(views)},
                  {"my model/data/0", Bytes(s0)},
                  {"my model/data/1", Bytes(s1)},
                  {"my model/data/2", Bytes(s2)},
                  {"my model/version", "3\n"}});
  auto reader = OpenTorchCheckpoint(path.string());
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ((*reader)->tensors().size(), views.size());
  EXPECT_EQ((*reader)->tensors()[8].dtype, DType::kF16);
  EXPECT_EQ((*reader)->tensors()[9].dtype, DType::kBF16);
  EXPECT_THAT((*reader)->tensors()[1].shape, ElementsAre(6, 4));

  EXPECT_THAT(ReadAll(**reader, "base"), ElementsAreArray(s0));
  std::vector<float> transposed;
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 4; ++j) transposed.push_back(static_cast<float>(j * 6 + i));
  }
  EXPECT_THAT(ReadAll(**reader, "transposed"), ElementsAreArray(transposed));
  EXPECT_THAT(ReadAll(**reader, "slice"), ElementsAre(7, 9, 11, 13, 15, 17));
  EXPECT_THAT(ReadAll(**reader, "tail"), ElementsAre(21, 22, 23));
  EXPECT_THAT(ReadAll(**reader, "scalar"), ElementsAre(5));
  EXPECT_THAT(ReadAll(**reader, "expanded"), ElementsAre(1, 2, 3, 1, 2, 3));
  std::vector<float> cube;  // element [a][b][c] = a + 12 b + 3 c
  for (int a = 0; a < 3; ++a) {
    for (int b = 0; b < 2; ++b) {
      for (int c = 0; c < 4; ++c) cube.push_back(static_cast<float>(a + 12 * b + 3 * c));
    }
  }
  EXPECT_THAT(ReadAll(**reader, "cube_t"), ElementsAreArray(cube));
  EXPECT_TRUE(ReadAll(**reader, "empty").empty());
  EXPECT_THAT(ReadAll(**reader, "half_t"), ElementsAre(0.0, 1.5, 0.5, 2.0, 1.0, 2.5));
  EXPECT_THAT(ReadAll(**reader, "bf16"), ElementsAre(1.0, -2.0));
}

// Opens a generated archive and expects an error mentioning `message`.
void ExpectOpenError(const std::string& file, const std::vector<FakeTensor>& views,
                     const std::vector<std::pair<std::string, std::string>>& storages,
                     absl::StatusCode code, const std::string& message) {
  std::vector<std::pair<std::string, std::string>> members = {
      {"archive/data.pkl", StateDictPickle(views)}};
  for (const auto& [key, bytes] : storages) members.push_back({"archive/data/" + key, bytes});
  const fs::path path = TempPath(file);
  WriteZip(path, members);
  auto reader = OpenTorchCheckpoint(path.string());
  ASSERT_FALSE(reader.ok()) << file;
  EXPECT_EQ(reader.status().code(), code) << reader.status();
  EXPECT_THAT(reader.status().message(), HasSubstr(message));
}

TEST(TorchCheckpointTest, ValidationErrorsNameTheTensor) {
  const std::string four_f32(16, '\0');
  ExpectOpenError("too_big.pt", {{"big", "FloatStorage", "0", 4, 0, {5}, {1}}},
                  {{"0", four_f32}}, absl::StatusCode::kInvalidArgument,
                  "tensor 'big': shape [5], strides [1], offset 0 reach element 4 but storage "
                  "'archive/data/0' holds only 4 F32 elements");
  ExpectOpenError("offset_oob.pt",
                  {{"ok", "FloatStorage", "0", 4, 0, {4}, {1}},
                   {"shifted", "FloatStorage", "0", 4, 2, {2}, {2}}},
                  {{"0", four_f32}}, absl::StatusCode::kInvalidArgument, "tensor 'shifted'");
  // The persistent id claims 64 elements but the member holds 4: the member size rules.
  ExpectOpenError("short_member.pt", {{"w", "HalfStorage", "0", 64, 0, {8, 8}, {8, 1}}},
                  {{"0", std::string(8, '\0')}}, absl::StatusCode::kInvalidArgument,
                  "tensor 'w'");
  ExpectOpenError("missing_storage.pt", {{"w", "FloatStorage", "9", 4, 0, {4}, {1}}},
                  {{"0", four_f32}}, absl::StatusCode::kInvalidArgument,
                  "tensor 'w': storage member 'archive/data/9' is missing");
  ExpectOpenError("long.pt", {{"position_ids", "LongStorage", "0", 2, 0, {2}, {1}}},
                  {{"0", four_f32}}, absl::StatusCode::kInvalidArgument,
                  "tensor 'position_ids': unsupported storage type torch.LongStorage");
  ExpectOpenError("mixed.pt",
                  {{"a", "FloatStorage", "0", 4, 0, {4}, {1}},
                   {"b", "HalfStorage", "0", 8, 0, {8}, {1}}},
                  {{"0", four_f32}}, absl::StatusCode::kInvalidArgument, "tensor 'b'");
  ExpectOpenError("overflow.pt",
                  {{"huge", "FloatStorage", "0", 4, 0, {int64_t{1} << 62, 8}, {1, 1}}},
                  {{"0", four_f32}}, absl::StatusCode::kInvalidArgument,
                  "tensor 'huge': shape");
}

TEST(TorchCheckpointTest, ForbiddenGlobalInDataPkl) {
  testing_util::PickleBuilder b;
  b.Proto(2).Global("os", "system").Str("true").Op(0x85).Reduce().Stop();
  const fs::path path = TempPath("evil.pt");
  WriteZip(path, {{"archive/data.pkl", b.bytes()}});
  auto reader = OpenTorchCheckpoint(path.string());
  ASSERT_FALSE(reader.ok());
  EXPECT_THAT(reader.status().message(), HasSubstr("forbidden global 'os.system'"));
}

TEST(TorchCheckpointTest, ContainerErrors) {
  auto missing = OpenTorchCheckpoint(TempPath("does_not_exist.pt").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);

  const fs::path text = TempPath("text.pt");
  WriteFile(text, "this is not a zip archive at all, just some text\n");
  auto not_zip = OpenTorchCheckpoint(text.string());
  EXPECT_EQ(not_zip.status().code(), absl::StatusCode::kInvalidArgument);

  const fs::path no_pkl = TempPath("no_pkl.pt");
  WriteZip(no_pkl, {{"archive/data/0", std::string(16, '\0')}, {"archive/version", "3\n"}});
  auto no_pkl_reader = OpenTorchCheckpoint(no_pkl.string());
  EXPECT_EQ(no_pkl_reader.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_pkl_reader.status().message(), HasSubstr("data.pkl"));

  const fs::path big_endian = TempPath("big_endian.pt");
  WriteZip(big_endian,
           {{"archive/data.pkl", StateDictPickle({{"w", "FloatStorage", "0", 4, 0, {4}, {1}}})},
            {"archive/byteorder", "big"},
            {"archive/data/0", std::string(16, '\0')}});
  auto be = OpenTorchCheckpoint(big_endian.string());
  EXPECT_THAT(be.status().message(), HasSubstr("byte order 'big'"));
}

// ---------------------------------------------------------------------------------------
// Damaged copies of the golden file: errors, never crashes.

// Offset of the data of the local-header member `name` (first occurrence of the name is
// in its local header, which precedes the central directory).
size_t MemberDataOffset(const std::string& file, const std::string& name) {
  const size_t pos = file.find(name);
  EXPECT_NE(pos, std::string::npos);
  EXPECT_GE(pos, 30u);
  EXPECT_EQ(file.compare(pos - 30, 4, "PK\x03\x04"), 0);
  const auto u16 = [&](size_t at) {
    return static_cast<size_t>(static_cast<uint8_t>(file[at])) |
           static_cast<size_t>(static_cast<uint8_t>(file[at + 1])) << 8;
  };
  return pos + u16(pos - 4) + u16(pos - 2);  // + name length + extra length
}

// Every tensor of a checkpoint: name -> (shape, values as f32).
using AllTensors = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>;

// Opens `bytes` as a checkpoint and reads every tensor; the first error otherwise.
absl::StatusOr<AllTensors> ReadAll(const std::string& file, const std::string& bytes) {
  const fs::path path = TempPath(file);
  WriteFile(path, bytes);
  auto reader = OpenTorchCheckpoint(path.string());
  if (!reader.ok()) return reader.status();
  AllTensors all;
  for (const TensorInfo& t : (*reader)->tensors()) {
    std::vector<float> data(static_cast<size_t>(t.NumElements()));
    absl::Status s = (*reader)->ReadF32(t.name, absl::MakeSpan(data));
    if (!s.ok()) return s;
    all[t.name] = {t.shape, std::move(data)};
  }
  return all;
}

absl::Status OpenAndReadAll(const std::string& file, const std::string& bytes) {
  return ReadAll(file, bytes).status();
}

TEST(TorchCheckpointTest, TruncatedGoldenIsAnError) {
  const std::string golden = ReadFile(kGolden);
  ASSERT_GT(golden.size(), 1000000u);
  for (size_t len : {size_t{0}, size_t{1}, size_t{30}, size_t{4096}, golden.size() / 2,
                     golden.size() - 100, golden.size() - 22, golden.size() - 1}) {
    const absl::Status s = OpenAndReadAll("truncated.pt", golden.substr(0, len));
    EXPECT_FALSE(s.ok()) << "truncated to " << len;
    EXPECT_TRUE(s.code() == absl::StatusCode::kInvalidArgument ||
                s.code() == absl::StatusCode::kDataLoss)
        << s;
  }
}

TEST(TorchCheckpointTest, CorruptGoldenBytesAreDetected) {
  const std::string golden = ReadFile(kGolden);
  // A flipped byte inside data.pkl: its CRC fails when it is read at open time.
  std::string bad_pkl = golden;
  bad_pkl[MemberDataOffset(golden, "pytorch_model/data.pkl") + 500] ^= 0x5a;
  absl::Status s = OpenAndReadAll("bad_pkl.pt", bad_pkl);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;

  // A flipped byte inside storage 0 (tok_embeddings.weight): ReadF32 reports the CRC.
  std::string bad_storage = golden;
  bad_storage[MemberDataOffset(golden, "pytorch_model/data/0") + 1000] ^= 0x01;
  const fs::path path = TempPath("bad_storage.pt");
  WriteFile(path, bad_storage);
  auto reader = OpenTorchCheckpoint(path.string());
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<float> emb(300 * 256);
  s = (*reader)->ReadF32("tok_embeddings.weight", absl::MakeSpan(emb));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;

  // 1000 bytes cut out of storage 0: the member no longer matches the central directory.
  const size_t s0 = MemberDataOffset(golden, "pytorch_model/data/0");
  s = OpenAndReadAll("cut_member.pt", golden.substr(0, s0 + 2000) + golden.substr(s0 + 3000));
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.code() == absl::StatusCode::kInvalidArgument ||
              s.code() == absl::StatusCode::kDataLoss)
      << s;

  // Random flips anywhere (headers, central directory, data): each one is either refused
  // with InvalidArgument or DataLoss, or (a byte nothing reads) changes nothing: never a
  // silently different tensor.
  const absl::StatusOr<AllTensors> want = ReadAll("golden_copy.pt", golden);
  ASSERT_TRUE(want.ok()) << want.status();
  std::mt19937 rng(42);
  int refused = 0;
  for (int iter = 0; iter < 40; ++iter) {
    std::string mutated = golden;
    const size_t at = rng() % mutated.size();
    mutated[at] ^= static_cast<char>(1 + rng() % 255);
    const absl::StatusOr<AllTensors> got = ReadAll("random_flip.pt", mutated);
    if (!got.ok()) {
      ++refused;
      EXPECT_TRUE(got.status().code() == absl::StatusCode::kInvalidArgument ||
                  got.status().code() == absl::StatusCode::kDataLoss)
          << "flip at " << at << ": " << got.status();
      EXPECT_FALSE(got.status().message().empty());
    } else {
      EXPECT_TRUE(*got == *want) << "flip at " << at << " was accepted with other tensors";
    }
  }
  // The storages are nearly the whole file, and every one of their bytes is covered by a
  // CRC: a flip there cannot be accepted (the per-flip checks above are the test).
  ::testing::Test::RecordProperty("flips_refused_of_40", refused);
}

}  // namespace
}  // namespace dcf

// A 4.4 KB archive whose zip directory claims a 4 GiB storage (and a tensor with a huge
// stride reaching into it): refused at open from the sizes alone, before any allocation.
// Made by tests/data/hostile/make_size_bomb.py (stdlib only).
TEST(TorchCheckpointTest, ZipSizeClaimsAreCheckedAgainstStoredBytes) {
  auto r = dcf::OpenTorchCheckpoint(std::string(DCF_TEST_DATA_DIR) + "/hostile/size_bomb.bin");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("claims 4294967280 bytes"), std::string::npos)
      << r.status();
}
