// Test helpers: a tiny pickle writer that emits the opcodes torch.save uses, so tests can
// build state_dict pickles (and hostile ones) byte by byte.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dcf::testing_util {

class PickleBuilder {
 public:
  PickleBuilder& Op(uint8_t op) {
    bytes_.push_back(static_cast<char>(op));
    return *this;
  }
  PickleBuilder& Raw(std::string_view raw) {
    bytes_.append(raw);
    return *this;
  }
  PickleBuilder& Le(uint64_t v, int n) {
    for (int k = 0; k < n; ++k) bytes_.push_back(static_cast<char>((v >> (8 * k)) & 0xff));
    return *this;
  }
  PickleBuilder& Proto(int p = 2) { return Op(0x80).Le(p, 1); }
  PickleBuilder& Stop() { return Op('.'); }
  PickleBuilder& Mark() { return Op('('); }
  PickleBuilder& Tuple() { return Op('t'); }
  PickleBuilder& EmptyTuple() { return Op(')'); }
  PickleBuilder& EmptyDict() { return Op('}'); }
  PickleBuilder& Reduce() { return Op('R'); }
  PickleBuilder& SetItems() { return Op('u'); }
  PickleBuilder& SetItem() { return Op('s'); }
  PickleBuilder& False() { return Op(0x89); }
  PickleBuilder& True() { return Op(0x88); }
  PickleBuilder& Put(uint32_t idx) { return Op('r').Le(idx, 4); }
  PickleBuilder& Get(uint32_t idx) { return Op('j').Le(idx, 4); }
  PickleBuilder& Str(std::string_view s) { return Op('X').Le(s.size(), 4).Raw(s); }
  PickleBuilder& ShortStr(std::string_view s) { return Op(0x8c).Le(s.size(), 1).Raw(s); }
  PickleBuilder& Global(std::string_view module, std::string_view name) {
    return Op('c').Raw(module).Raw("\n").Raw(name).Raw("\n");
  }
  PickleBuilder& Int(int64_t v) {
    if (v >= 0 && v < 256) return Op('K').Le(v, 1);
    if (v >= 0 && v < 65536) return Op('M').Le(v, 2);
    if (v >= INT32_MIN && v <= INT32_MAX) return Op('J').Le(static_cast<uint32_t>(v), 4);
    return Op(0x8a).Le(8, 1).Le(static_cast<uint64_t>(v), 8);  // LONG1
  }
  PickleBuilder& IntTuple(const std::vector<int64_t>& v) {
    Mark();
    for (int64_t x : v) Int(x);
    return Tuple();
  }
  // Pushes the tensor torch.save writes for a view of storage `key`:
  // _rebuild_tensor_v2(persid(('storage', torch.<type>, key, 'cpu', numel)), offset, shape,
  //                    strides, False, OrderedDict())
  PickleBuilder& Tensor(std::string_view storage_type, std::string_view key, int64_t numel,
                        int64_t offset, const std::vector<int64_t>& shape,
                        const std::vector<int64_t>& strides) {
    Global("torch._utils", "_rebuild_tensor_v2");
    Mark();
    Mark().Str("storage").Global("torch", storage_type).Str(key).Str("cpu").Int(numel).Tuple();
    Op('Q');  // BINPERSID
    Int(offset).IntTuple(shape).IntTuple(strides).False();
    Global("collections", "OrderedDict").EmptyTuple().Reduce();
    return Tuple().Reduce();
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

struct FakeTensor {
  std::string name;
  std::string storage_type;  // "FloatStorage", "HalfStorage", ...
  std::string key;
  int64_t numel;             // storage size in elements
  int64_t offset;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

// The pickle torch.save writes for an OrderedDict state_dict of `tensors`, including the
// trailing BUILD of its `_metadata` attribute.
inline std::string StateDictPickle(const std::vector<FakeTensor>& tensors) {
  PickleBuilder b;
  b.Proto(2).Global("collections", "OrderedDict").EmptyTuple().Reduce().Mark();
  for (const FakeTensor& t : tensors) {
    b.Str(t.name).Tensor(t.storage_type, t.key, t.numel, t.offset, t.shape, t.strides);
  }
  b.SetItems();
  // state = {'_metadata': OrderedDict({'': {'version': 1}})}
  b.EmptyDict().Str("_metadata").Global("collections", "OrderedDict").EmptyTuple().Reduce();
  b.Str("").EmptyDict().Str("version").Int(1).SetItem().SetItem().SetItem();
  b.Op('b');  // BUILD
  return b.Stop().bytes();
}

}  // namespace dcf::testing_util
