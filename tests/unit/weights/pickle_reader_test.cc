#include "engine/weights/pickle_reader.h"

#include <cstdint>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/weights/pickle_test_util.h"

namespace dcf {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::FakeTensor;
using testing_util::PickleBuilder;
using testing_util::StateDictPickle;

absl::StatusOr<std::vector<PickledTensor>> Parse(const std::string& bytes) {
  return ParseTorchStateDict(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

std::string TwoTensorPickle() {
  return StateDictPickle({
      {"w", "HalfStorage", "0", 24, 0, {4, 6}, {6, 1}},
      {"w_t", "HalfStorage", "0", 24, 3, {2, 3}, {1, 6}},
      {"b", "BFloat16Storage", "7", 5, 0, {5}, {1}},
      {"f", "FloatStorage", "8", 1, 0, {}, {}},
  });
}

TEST(PickleReaderTest, ParsesOrderedDictStateDict) {
  auto tensors = Parse(TwoTensorPickle());
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->size(), 4u);
  const PickledTensor& w = (*tensors)[0];
  EXPECT_EQ(w.name, "w");
  EXPECT_EQ(w.storage_key, "0");
  EXPECT_EQ(w.storage_type, "HalfStorage");
  EXPECT_EQ(w.dtype, DType::kF16);
  EXPECT_EQ(w.storage_numel, 24);
  EXPECT_EQ(w.storage_offset, 0);
  EXPECT_THAT(w.shape, ElementsAre(4, 6));
  EXPECT_THAT(w.strides, ElementsAre(6, 1));
  const PickledTensor& wt = (*tensors)[1];
  EXPECT_EQ(wt.name, "w_t");
  EXPECT_EQ(wt.storage_key, "0");
  EXPECT_EQ(wt.storage_offset, 3);
  EXPECT_THAT(wt.shape, ElementsAre(2, 3));
  EXPECT_THAT(wt.strides, ElementsAre(1, 6));
  EXPECT_EQ((*tensors)[2].dtype, DType::kBF16);
  EXPECT_EQ((*tensors)[2].storage_key, "7");
  EXPECT_EQ((*tensors)[3].dtype, DType::kF32);
  EXPECT_TRUE((*tensors)[3].shape.empty());
}

// The layout of the golden file: a plain dict, globals and persistent-id pieces reused
// through the memo (BINPUT/BINGET), TUPLE2 for shapes.
TEST(PickleReaderTest, ParsesMemoizedPlainDict) {
  PickleBuilder b;
  b.Proto(2).EmptyDict().Op('q').Le(0, 1).Mark();
  b.Str("a").Global("torch._utils", "_rebuild_tensor_v2").Op('q').Le(1, 1);
  b.Mark().Mark().Str("storage").Op('q').Le(2, 1).Global("torch", "HalfStorage").Op('q').Le(3, 1);
  b.Str("0").Str("cpu").Op('q').Le(4, 1).Int(76800).Tuple().Op('Q');
  b.Int(0).Int(300).Int(256).Op(0x86).Int(256).Int(1).Op(0x86).False();
  b.Global("collections", "OrderedDict").Op('q').Le(5, 1).EmptyTuple().Reduce().Tuple().Reduce();
  b.Str("b").Op('h').Le(1, 1).Mark().Mark().Op('h').Le(2, 1).Op('h').Le(3, 1).Str("1");
  b.Op('h').Le(4, 1).Int(70000).Tuple().Op('Q').Int(65536).Int(4).Op(0x85).Int(1).Op(0x85);
  b.False().Op('h').Le(5, 1).EmptyTuple().Reduce().Tuple().Reduce();
  b.SetItems().Stop();
  auto tensors = Parse(b.bytes());
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->size(), 2u);
  EXPECT_EQ((*tensors)[0].name, "a");
  EXPECT_THAT((*tensors)[0].shape, ElementsAre(300, 256));
  EXPECT_EQ((*tensors)[0].storage_numel, 76800);
  EXPECT_EQ((*tensors)[1].name, "b");
  EXPECT_EQ((*tensors)[1].storage_key, "1");
  EXPECT_EQ((*tensors)[1].dtype, DType::kF16);
  EXPECT_EQ((*tensors)[1].storage_offset, 65536);
  EXPECT_THAT((*tensors)[1].shape, ElementsAre(4));
}

// Protocol 4 style: FRAME, SHORT_BINUNICODE, STACK_GLOBAL, MEMOIZE, LONG1, nn.Parameter.
TEST(PickleReaderTest, ParsesProtocol4ParameterWithStackGlobal) {
  PickleBuilder p;
  p.Proto(4).Op(0x95).Le(0, 8).Op('}').Op(0x94).Mark().ShortStr("p");
  p.ShortStr("torch._utils").ShortStr("_rebuild_parameter").Op(0x93);
  p.ShortStr("torch._utils").ShortStr("_rebuild_tensor_v2").Op(0x93);
  p.Mark().Mark().ShortStr("storage").ShortStr("torch").ShortStr("FloatStorage").Op(0x93);
  p.ShortStr("3").ShortStr("cpu").Op(0x8a).Le(5, 1).Le(int64_t{1} << 33, 5).Tuple().Op('Q');
  p.Op(0x8a).Le(5, 1).Le(int64_t{1} << 32, 5);  // offset 2^32 as LONG1
  p.IntTuple({2, 3}).IntTuple({3, 1}).False();
  p.Global("collections", "OrderedDict").EmptyTuple().Reduce().Tuple().Reduce();
  p.True().Global("collections", "OrderedDict").EmptyTuple().Reduce().Op(0x87).Reduce();
  p.SetItems().Stop();
  auto tensors = Parse(p.bytes());
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->size(), 1u);
  EXPECT_EQ((*tensors)[0].name, "p");
  EXPECT_EQ((*tensors)[0].dtype, DType::kF32);
  EXPECT_EQ((*tensors)[0].storage_numel, int64_t{1} << 33);
  EXPECT_EQ((*tensors)[0].storage_offset, int64_t{1} << 32);
  EXPECT_THAT((*tensors)[0].strides, ElementsAre(3, 1));
}

TEST(PickleReaderTest, NegativeLong1) {
  // {'x': tensor with offset -2} -> rejected as a negative offset, proving LONG1 sign handling.
  PickleBuilder b;
  b.Proto(2).EmptyDict().Str("x").Global("torch._utils", "_rebuild_tensor_v2").Mark();
  b.Mark().Str("storage").Global("torch", "HalfStorage").Str("0").Str("cpu").Int(4).Tuple();
  b.Op('Q').Op(0x8a).Le(1, 1).Le(0xfe, 1).IntTuple({2}).IntTuple({1}).False();
  b.Global("collections", "OrderedDict").EmptyTuple().Reduce().Tuple().Reduce().SetItem().Stop();
  auto tensors = Parse(b.bytes());
  ASSERT_FALSE(tensors.ok());
  EXPECT_THAT(tensors.status().message(), HasSubstr("'x': negative storage offset"));
}

TEST(PickleReaderTest, UnsupportedStorageTypeIsTaggedNotRefused) {
  auto tensors = Parse(StateDictPickle({{"ids", "LongStorage", "0", 4, 0, {4}, {1}}}));
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  EXPECT_EQ((*tensors)[0].storage_type, "LongStorage");
  EXPECT_FALSE((*tensors)[0].dtype.has_value());
}

// A global outside the allow-list is refused by name; nothing runs.
struct ForbiddenCase {
  std::string module;
  std::string name;
  bool stack_global;
};

class ForbiddenGlobalTest : public ::testing::TestWithParam<ForbiddenCase> {};

TEST_P(ForbiddenGlobalTest, RefusedWithName) {
  const ForbiddenCase& c = GetParam();
  const std::filesystem::path marker =
      std::filesystem::path(::testing::TempDir()) / "pickle_reader_pwned";
  std::filesystem::remove(marker);
  PickleBuilder b;
  b.Proto(2);
  if (c.stack_global) {
    b.ShortStr(c.module).ShortStr(c.name).Op(0x93);
  } else {
    b.Global(c.module, c.name);
  }
  b.Str("touch " + marker.string()).Op(0x85).Reduce().Stop();
  auto result = Parse(b.bytes());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(),
              HasSubstr("forbidden global '" + c.module + "." + c.name + "'"));
  EXPECT_FALSE(std::filesystem::exists(marker));
}

INSTANTIATE_TEST_SUITE_P(
    Globals, ForbiddenGlobalTest,
    ::testing::Values(ForbiddenCase{"os", "system", false},
                      ForbiddenCase{"builtins", "eval", true},
                      ForbiddenCase{"posix", "system", false},
                      ForbiddenCase{"__builtin__", "exec", true},
                      ForbiddenCase{"torch.storage", "_load_from_bytes", false},
                      ForbiddenCase{"torch", "load", true},
                      ForbiddenCase{"torch._utils", "_rebuild_device_tensor_from_numpy", false},
                      ForbiddenCase{"collections", "OrderedDictX", false},
                      ForbiddenCase{"torch ", "HalfStorage", false}));

TEST(PickleReaderTest, CallingAStorageClassIsRefused) {
  PickleBuilder b;
  b.Proto(2).Global("torch", "HalfStorage").EmptyTuple().Reduce().Stop();
  auto result = Parse(b.bytes());
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("calling 'torch.HalfStorage'"));
}

TEST(PickleReaderTest, EveryTruncationIsAnError) {
  const std::string full = TwoTensorPickle();
  ASSERT_TRUE(Parse(full).ok());
  for (size_t len = 0; len < full.size(); ++len) {
    auto result = Parse(full.substr(0, len));
    EXPECT_FALSE(result.ok()) << "prefix of " << len << " bytes parsed";
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(PickleReaderTest, UnknownOpcodeNamesByteAndOffset) {
  PickleBuilder b;
  b.Proto(2).EmptyDict().Op(0xff).Stop();
  auto result = Parse(b.bytes());
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("opcode 0xff"));
  EXPECT_THAT(result.status().message(), HasSubstr("offset 3"));

  PickleBuilder newobj;  // NEWOBJ builds arbitrary objects: not part of a state_dict
  newobj.Proto(2).Global("collections", "OrderedDict").EmptyTuple().Op(0x81).Stop();
  result = Parse(newobj.bytes());
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("opcode 0x81"));
}

TEST(PickleReaderTest, StructuralErrors) {
  struct Case {
    std::string bytes;
    std::string message;
  };
  const std::vector<Case> cases = {
      {PickleBuilder().Proto(2).Reduce().Stop().bytes(), "stack underflow"},
      {PickleBuilder().Proto(2).Get(7).Stop().bytes(), "memo key 7 not defined"},
      {PickleBuilder().Proto(6).EmptyDict().Stop().bytes(), "protocol 6"},
      {PickleBuilder().Proto(2).Op('u').Stop().bytes(), "no MARK"},
      {PickleBuilder().Proto(2).EmptyDict().Str("a").Int(1).SetItem().Stop().bytes(),
       "value of 'a' is a int, not a tensor"},
      {PickleBuilder().Proto(2).Op(']').Stop().bytes(), "top-level object is a list"},
      {PickleBuilder().Proto(2).EmptyDict().EmptyDict().Stop().bytes(), "STOP with 2 values"},
      {PickleBuilder().Proto(2).Op(0x8d).Le(uint64_t{1} << 62, 8).Stop().bytes(), "truncated"},
      {PickleBuilder().Proto(2).Op(0x8a).Le(9, 1).Le(0, 8).Le(0, 1).Stop().bytes(),
       "does not fit in int64"},
      {PickleBuilder().Proto(2).Op('c').Raw("os").bytes(), "unterminated"},
      {PickleBuilder().Proto(2).Int(3).Op('Q').Stop().bytes(), "persistent id"},
      {StateDictPickle({{"neg", "HalfStorage", "0", 4, 0, {2, 2}, {-1, 1}}}),
       "'neg': negative stride in dimension 0"},
      {StateDictPickle({{"dup", "HalfStorage", "0", 4, 0, {2}, {1}},
                        {"dup", "HalfStorage", "0", 4, 0, {2}, {1}}}),
       "duplicate state_dict key 'dup'"},
      {StateDictPickle({{"k", "HalfStorage", "../x", 4, 0, {2}, {1}}}), "invalid storage key"},
  };
  for (const Case& c : cases) {
    auto result = Parse(c.bytes);
    ASSERT_FALSE(result.ok()) << c.message;
    EXPECT_THAT(result.status().message(), HasSubstr(c.message));
  }
}

TEST(PickleReaderTest, DeepNestingIsCapped) {
  PickleBuilder b;
  b.Proto(2);
  for (int i = 0; i < 200000; ++i) b.Mark();
  auto result = Parse(b.bytes());
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("too many nested MARKs"));

  PickleBuilder dups;  // DUP without end: the value stack cap, not memory, stops it
  dups.Proto(2).EmptyDict();
  for (int i = 0; i < (1 << 21); ++i) dups.Op('2');
  result = Parse(dups.bytes());
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("value stack too deep"));
}

// Random byte mutations of a valid pickle never crash (run under ASan in CI) and never yield
// garbage: each one is refused with the parser's one error form (InvalidArgument "pickle:
// ..."), or parses into a state dict that keeps the contract of
// ParseTorchStateDict (distinct names, one stride per dimension, nothing negative).
TEST(PickleReaderTest, MutationsNeverCrash) {
  const std::string full = TwoTensorPickle();
  std::mt19937 rng(1234);
  int refused = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    std::string mutated = full;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      mutated[rng() % mutated.size()] = static_cast<char>(rng() & 0xff);
    }
    const auto parsed = Parse(mutated);
    if (!parsed.ok()) {
      ++refused;
      ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << parsed.status();
      ASSERT_THAT(std::string(parsed.status().message()), ::testing::StartsWith("pickle: "))
          << iter;
      continue;
    }
    std::set<std::string> names;
    for (const PickledTensor& t : *parsed) {
      ASSERT_TRUE(names.insert(t.name).second) << "duplicate name " << t.name << " at " << iter;
      ASSERT_EQ(t.shape.size(), t.strides.size()) << t.name;
      ASSERT_GE(t.storage_offset, 0) << t.name;
      ASSERT_GE(t.storage_numel, 0) << t.name;
      for (size_t d = 0; d < t.shape.size(); ++d) {
        ASSERT_GE(t.shape[d], 0) << t.name;
        ASSERT_GE(t.strides[d], 0) << t.name;
      }
      ASSERT_FALSE(t.storage_key.empty()) << t.name;
    }
  }
  ::testing::Test::RecordProperty("mutations_refused_of_5000", refused);
}

}  // namespace
}  // namespace dcf
