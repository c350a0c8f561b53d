// The safetensors reader and writer, the sharded layout, and corrupt-file handling.
#include <cstring>
#include <string>
#include <vector>

#include "engine/weights/checkpoint.h"
#include "engine/weights/safetensors_reader.h"
#include "engine/weights/safetensors_writer.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace dcf {
namespace {

std::string Header(const std::string& json) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json;
}

TEST(DTypeTest, HalfAndBf16RoundTrip) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f,
                  0.333251953125f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(f)), f) << f;  // all exactly representable in half
  }
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);                 // overflow -> inf
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048), 0x3c00);   // tie -> even
  EXPECT_EQ(FloatToHalf(1.0f + 3.0f / 2048), 0x3c02);   // tie -> even (up)
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  EXPECT_EQ(HalfToFloat(0x0001), 5.9604645e-08f);       // smallest subnormal
  EXPECT_EQ(BF16ToFloat(FloatToBF16(3.140625f)), 3.140625f);
  EXPECT_EQ(FloatToBF16(1.0f), 0x3f80);
}

// The bulk converter (hardware F16C where available) agrees bit for bit with the scalar
// reference on every one of the 65536 half values.
TEST(DTypeTest, BulkHalfConversionMatchesScalarOnAllValues) {
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> bulk(all.size() + 3);
  // An odd count and offset exercise the vector body and the scalar tail.
  ConvertToF32(DType::kF16, all.data() + 3, 65533, bulk.data());
  for (int i = 3; i < 65536; ++i) {
    const float ref = HalfToFloat(all[i]);
    uint32_t a, b;
    std::memcpy(&a, &ref, 4);
    std::memcpy(&b, &bulk[i - 3], 4);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(bulk[i - 3])) << i;
    } else {
      ASSERT_EQ(a, b) << "half bits " << i;
    }
  }
}

TEST(SafetensorsTest, WriteThenReadAllDtypes) {
  testing::TempDir dir;
  const std::vector<float> a = {1.0f, -2.0f, 0.5f, 3.0f, 0.25f, -0.125f};
  const std::vector<float> b = {7.0f};
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    const std::string path = dir.File("m.safetensors");
    ASSERT_TRUE(WriteSafetensors(path, {{"a", {2, 3}, a}, {"b", {1}, b}}, dt).ok());
    auto r = OpenSafetensors(path);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ((*r)->tensors().size(), 2u);
    EXPECT_EQ((*r)->tensors()[0].name, "a");
    EXPECT_EQ((*r)->tensors()[0].dtype, dt);
    EXPECT_EQ((*r)->tensors()[0].shape, (std::vector<int64_t>{2, 3}));
    std::vector<float> got(6);
    ASSERT_TRUE((*r)->ReadF32("a", absl::MakeSpan(got)).ok());
    EXPECT_EQ(got, a);  // all values exact in every dtype
    EXPECT_EQ((*r)->ReadF32("zz", absl::MakeSpan(got)).code(), absl::StatusCode::kNotFound);
    std::vector<float> small(2);
    EXPECT_FALSE((*r)->ReadF32("a", absl::MakeSpan(small)).ok());
  }
}

TEST(SafetensorsTest, CorruptFilesAreErrorsNotCrashes) {
  testing::TempDir dir;
  const std::vector<float> a(64, 1.5f);
  ASSERT_TRUE(WriteSafetensors(dir.File("good.safetensors"), {{"w", {8, 8}, a}}, DType::kF32).ok());
  const std::string good = dir.Read("good.safetensors");
  // Every truncation length fails cleanly.
  for (size_t len = 0; len < good.size(); len += (len < 64 ? 1 : 37)) {
    dir.Write("cut.safetensors", good.substr(0, len));
    EXPECT_FALSE(OpenSafetensors(dir.File("cut.safetensors")).ok()) << len;
  }
  struct Case {
    const char* what;
    std::string bytes;
    const char* message_part;
  };
  const std::string data(16, '\0');
  std::string long_header = Header("{}");
  long_header[0] = '\xff';
  const std::vector<Case> cases = {
      {"header longer than file", long_header, "header length"},
      {"not json", Header("{nope") + data, "JSON"},
      {"unknown dtype", Header(R"({"w":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})") + data,
       "I64"},
      {"offsets beyond data", Header(R"({"w":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})") + data,
       "outside"},
      {"size mismatch", Header(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})") + data,
       "needs 12"},
      {"reversed offsets", Header(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})") + data,
       "outside"},
      {"negative shape", Header(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})") + data,
       "shape"},
      {"missing offsets", Header(R"({"w":{"dtype":"F32","shape":[1]}})") + data, "data_offsets"},
  };
  for (const Case& c : cases) {
    dir.Write("bad.safetensors", c.bytes);
    auto r = OpenSafetensors(dir.File("bad.safetensors"));
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_NE(std::string(r.status().message()).find(c.message_part), std::string::npos)
        << c.what << ": " << r.status();
  }
  EXPECT_EQ(OpenSafetensors(dir.File("missing.safetensors")).status().code(),
            absl::StatusCode::kNotFound);
}

// The format requires data_offsets to tile the data region (no overlap, no hole, nothing
// after the last tensor): anything else is refused, naming the tensors.
TEST(SafetensorsTest, OffsetsMustTileTheDataRegion) {
  testing::TempDir dir;
  const std::string data(16, '\0');
  struct Case {
    const char* what;
    std::string header;
    std::vector<const char*> message_parts;
  };
  const std::vector<Case> cases = {
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
       R"("c":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
       {"tensor 'b' (data_offsets [4, 12)) overlaps tensor 'a' (data_offsets [0, 8))"}},
      {"same bytes twice",
       R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
       R"("b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
       {"tensor 'b'", "overlaps tensor 'a'"}},
      {"hole",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
       {"bytes [8, 12) of the data region belong to no tensor", "tensor 'b'"}},
      {"one byte off",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[1,9]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[9,13]}})",
       {"bytes [0, 1)", "tensor 'a'"}},
      {"trailing bytes",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       {"the data region has 16 bytes but the tensors cover only [0, 8)"}},
  };
  for (const Case& c : cases) {
    dir.Write("bad.safetensors", Header(c.header) + data);
    auto r = OpenSafetensors(dir.File("bad.safetensors"));
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << c.what;
    for (const char* part : c.message_parts) {
      EXPECT_NE(std::string(r.status().message()).find(part), std::string::npos)
          << c.what << ": " << r.status();
    }
  }
  // Tiling in any header order, zero-size tensors at a boundary and a space-padded header load.
  const std::string ok = R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                         R"("z":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
                         R"("e":{"dtype":"F32","shape":[0],"data_offsets":[16,16]},)"
                         R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}   )";
  dir.Write("ok.safetensors", Header(ok) + data);
  auto r = OpenSafetensors(dir.File("ok.safetensors"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->tensors().size(), 4u);
}

TEST(CheckpointDirTest, ShardedSafetensorsMerge) {
  testing::TempDir dir;
  const std::vector<float> a = {1, 2}, b = {3, 4, 5};
  ASSERT_TRUE(WriteSafetensors(dir.File("model-00001-of-00002.safetensors"), {{"a", {2}, a}},
                               DType::kF32).ok());
  ASSERT_TRUE(WriteSafetensors(dir.File("model-00002-of-00002.safetensors"), {{"b", {3}, b}},
                               DType::kBF16).ok());
  dir.Write("model.safetensors.index.json",
            R"({"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                "b": "model-00002-of-00002.safetensors"}})");
  auto r = OpenCheckpointDir(dir.path());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ((*r)->tensors().size(), 2u);
  std::vector<float> got(3);
  ASSERT_TRUE((*r)->ReadF32("b", absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, b);

  // The index promises a tensor a shard does not hold.
  dir.Write("model.safetensors.index.json",
            R"({"weight_map": {"a": "model-00002-of-00002.safetensors",
                "b": "model-00002-of-00002.safetensors"}})");
  auto bad = OpenCheckpointDir(dir.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("'a'"), std::string::npos);
  // A shard path escaping the directory is refused.
  dir.Write("model.safetensors.index.json", R"({"weight_map": {"a": "../x.safetensors"}})");
  EXPECT_FALSE(OpenCheckpointDir(dir.path()).ok());
  dir.Write("model.safetensors.index.json", R"([1, 2])");
  EXPECT_FALSE(OpenCheckpointDir(dir.path()).ok());
  EXPECT_EQ(OpenCheckpointDir(dir.File("nope")).status().code(), absl::StatusCode::kNotFound);
}

TEST(CheckpointDirTest, EmptyDirectoryHasNoWeights) {
  testing::TempDir dir;
  auto r = OpenCheckpointDir(dir.path());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(r.status().message()).find("no weights"), std::string::npos);
}

}  // namespace
}  // namespace dcf
