#include "engine/weights/pickle_reader.h"

#include <cstring>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "engine/common/status_macros.h"

namespace dcf {
namespace {

// Caps that keep a hostile pickle from exhausting memory. A real state_dict of a 7B model
// needs a few thousand values and a stack depth below 20.
constexpr size_t kMaxStack = 1 << 20;
constexpr size_t kMaxMarks = 1 << 16;
constexpr size_t kMaxMemo = 1 << 21;
constexpr size_t kMaxValues = 1 << 21;
constexpr size_t kMaxRank = 64;

enum class Kind {
  kNone, kBool, kInt, kFloat, kString, kBytes, kTuple, kList, kDict, kGlobal, kStorage,
  kTensor
};

enum class GlobalId { kOrderedDict, kRebuildTensorV2, kRebuildParameter, kStorageClass };

struct Value {
  Kind kind = Kind::kNone;
  int64_t i = 0;                // kBool, kInt; kGlobal: GlobalId
  double f = 0;                 // kFloat
  std::string s;                // kString, kBytes; kGlobal: "module.name"
  std::vector<Value*> items;    // kTuple, kList; kDict: key0, value0, key1, value1, ...
  std::unique_ptr<PickledTensor> tensor;  // kStorage (storage_* fields), kTensor
  std::optional<DType> dtype;   // kGlobal storage classes
};

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kTuple: return "tuple";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kGlobal: return "global";
    case Kind::kStorage: return "storage";
    case Kind::kTensor: return "tensor";
  }
  return "?";
}

// torch typed storage classes. Only the first three are readable; the rest are accepted as
// inert tags so that the checkpoint reader can name the tensor that uses them.
struct StorageClass {
  const char* name;
  std::optional<DType> dtype;
};
constexpr StorageClass kStorageClasses[] = {
    {"FloatStorage", DType::kF32},  {"HalfStorage", DType::kF16},
    {"BFloat16Storage", DType::kBF16}, {"DoubleStorage", std::nullopt},
    {"LongStorage", std::nullopt},  {"IntStorage", std::nullopt},
    {"ShortStorage", std::nullopt}, {"CharStorage", std::nullopt},
    {"ByteStorage", std::nullopt},  {"BoolStorage", std::nullopt},
};

class Unpickler {
 public:
  explicit Unpickler(absl::Span<const uint8_t> data) : data_(data) {}

  absl::StatusOr<Value*> Run();

 private:
  absl::Status Error(absl::string_view msg) const {
    return absl::InvalidArgumentError(
        absl::StrCat("pickle: ", msg, " (opcode at offset ", op_offset_, ")"));
  }
  absl::StatusOr<Value*> New(Kind kind);
  absl::StatusOr<absl::string_view> Bytes(uint64_t n);
  absl::StatusOr<uint64_t> UIntLE(int n);
  absl::StatusOr<absl::string_view> Line();
  absl::Status Push(Value* v);
  absl::StatusOr<Value*> Pop();
  absl::StatusOr<Value*> Top();
  absl::StatusOr<std::vector<Value*>> PopToMark();
  absl::Status PushString(Kind kind, uint64_t len);
  absl::Status PushInt(int64_t v);
  absl::Status PushTuple(std::vector<Value*> items);
  absl::StatusOr<Value*> MakeGlobal(absl::string_view module, absl::string_view name);
  absl::StatusOr<Value*> Reduce(Value* callable, Value* args);
  absl::StatusOr<Value*> RebuildTensor(const std::vector<Value*>& args);
  absl::StatusOr<Value*> PersistentLoad(Value* pid);
  absl::Status Memoize(uint64_t index);
  absl::Status AddItems(Value* dict, const std::vector<Value*>& kv);
  absl::Status Step(uint8_t op, bool* stop);

  absl::Span<const uint8_t> data_;
  size_t pos_ = 0;
  size_t op_offset_ = 0;
  std::vector<std::unique_ptr<Value>> arena_;  // owns every value; the rest are views
  std::vector<Value*> stack_;
  std::vector<size_t> marks_;
  absl::flat_hash_map<uint64_t, Value*> memo_;
};

absl::StatusOr<Value*> Unpickler::New(Kind kind) {
  if (arena_.size() >= kMaxValues) return Error("too many objects");
  arena_.push_back(std::make_unique<Value>());
  arena_.back()->kind = kind;
  return arena_.back().get();
}

absl::StatusOr<absl::string_view> Unpickler::Bytes(uint64_t n) {
  if (n > data_.size() - pos_) {
    return Error(absl::StrCat("truncated: needs ", n, " bytes at offset ", pos_, ", only ",
                              data_.size() - pos_, " left"));
  }
  absl::string_view out(reinterpret_cast<const char*>(data_.data()) + pos_, n);
  pos_ += n;
  return out;
}

absl::StatusOr<uint64_t> Unpickler::UIntLE(int n) {
  ASSIGN_OR_RETURN(absl::string_view b, Bytes(n));
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | static_cast<uint8_t>(b[k]);
  return v;
}

absl::StatusOr<absl::string_view> Unpickler::Line() {
  const auto* begin = reinterpret_cast<const char*>(data_.data()) + pos_;
  const void* nl = std::memchr(begin, '\n', data_.size() - pos_);
  if (nl == nullptr) return Error("truncated: unterminated text line");
  const size_t len = static_cast<const char*>(nl) - begin;
  pos_ += len + 1;
  return absl::string_view(begin, len);
}

absl::Status Unpickler::Push(Value* v) {
  if (stack_.size() >= kMaxStack) return Error("value stack too deep");
  stack_.push_back(v);
  return absl::OkStatus();
}

absl::StatusOr<Value*> Unpickler::Pop() {
  const size_t floor = marks_.empty() ? 0 : marks_.back();
  if (stack_.size() <= floor) return Error("stack underflow");
  Value* v = stack_.back();
  stack_.pop_back();
  return v;
}

absl::StatusOr<Value*> Unpickler::Top() {
  const size_t floor = marks_.empty() ? 0 : marks_.back();
  if (stack_.size() <= floor) return Error("stack underflow");
  return stack_.back();
}

absl::StatusOr<std::vector<Value*>> Unpickler::PopToMark() {
  if (marks_.empty()) return Error("no MARK on the stack");
  const size_t mark = marks_.back();
  marks_.pop_back();
  std::vector<Value*> items(stack_.begin() + mark, stack_.end());
  stack_.resize(mark);
  return items;
}

absl::Status Unpickler::PushString(Kind kind, uint64_t len) {
  ASSIGN_OR_RETURN(absl::string_view bytes, Bytes(len));
  ASSIGN_OR_RETURN(Value * v, New(kind));
  v->s.assign(bytes.data(), bytes.size());
  return Push(v);
}

absl::Status Unpickler::PushInt(int64_t x) {
  ASSIGN_OR_RETURN(Value * v, New(Kind::kInt));
  v->i = x;
  return Push(v);
}

absl::Status Unpickler::PushTuple(std::vector<Value*> items) {
  ASSIGN_OR_RETURN(Value * v, New(Kind::kTuple));
  v->items = std::move(items);
  return Push(v);
}

absl::Status Unpickler::Memoize(uint64_t index) {
  ASSIGN_OR_RETURN(Value * top, Top());
  if (memo_.size() >= kMaxMemo && !memo_.contains(index)) return Error("memo too large");
  memo_[index] = top;
  return absl::OkStatus();
}

absl::StatusOr<Value*> Unpickler::MakeGlobal(absl::string_view module, absl::string_view name) {
  GlobalId id;
  std::optional<DType> dtype;
  if (module == "collections" && name == "OrderedDict") {
    id = GlobalId::kOrderedDict;
  } else if (module == "torch._utils" && name == "_rebuild_tensor_v2") {
    id = GlobalId::kRebuildTensorV2;
  } else if (module == "torch._utils" && name == "_rebuild_parameter") {
    id = GlobalId::kRebuildParameter;
  } else {
    const StorageClass* found = nullptr;
    if (module == "torch") {
      for (const StorageClass& c : kStorageClasses) {
        if (name == c.name) found = &c;
      }
    }
    if (found == nullptr) {
      return Error(absl::StrCat("forbidden global '", module, ".", name,
                                "' (only state_dict tensors can be loaded)"));
    }
    id = GlobalId::kStorageClass;
    dtype = found->dtype;
  }
  ASSIGN_OR_RETURN(Value * v, New(Kind::kGlobal));
  v->i = static_cast<int64_t>(id);
  v->s = absl::StrCat(module, ".", name);
  v->dtype = dtype;
  return v;
}

// _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
//                    backward_hooks[, metadata])
absl::StatusOr<Value*> Unpickler::RebuildTensor(const std::vector<Value*>& args) {
  if (args.size() != 6 && args.size() != 7) {
    return Error(absl::StrCat("_rebuild_tensor_v2 takes 6 or 7 arguments, got ", args.size()));
  }
  if (args[0]->kind != Kind::kStorage) {
    return Error(absl::StrCat("_rebuild_tensor_v2: argument 0 is a ", KindName(args[0]->kind),
                              ", not a storage"));
  }
  if (args[1]->kind != Kind::kInt) return Error("_rebuild_tensor_v2: offset is not an int");
  if (args[2]->kind != Kind::kTuple || args[3]->kind != Kind::kTuple) {
    return Error("_rebuild_tensor_v2: size and stride must be tuples");
  }
  if (args[2]->items.size() != args[3]->items.size()) {
    return Error(absl::StrCat("_rebuild_tensor_v2: size has rank ", args[2]->items.size(),
                              " but stride has rank ", args[3]->items.size()));
  }
  if (args[2]->items.size() > kMaxRank) return Error("_rebuild_tensor_v2: rank too large");
  ASSIGN_OR_RETURN(Value * v, New(Kind::kTensor));
  v->tensor = std::make_unique<PickledTensor>(*args[0]->tensor);
  v->tensor->storage_offset = args[1]->i;
  for (size_t d = 0; d < args[2]->items.size(); ++d) {
    const Value* size = args[2]->items[d];
    const Value* stride = args[3]->items[d];
    if (size->kind != Kind::kInt || stride->kind != Kind::kInt) {
      return Error("_rebuild_tensor_v2: size/stride entries must be ints");
    }
    v->tensor->shape.push_back(size->i);
    v->tensor->strides.push_back(stride->i);
  }
  return v;
}

absl::StatusOr<Value*> Unpickler::Reduce(Value* callable, Value* args) {
  if (callable->kind != Kind::kGlobal) {
    return Error(absl::StrCat("REDUCE on a ", KindName(callable->kind), ", not a global"));
  }
  if (args->kind != Kind::kTuple) return Error("REDUCE arguments are not a tuple");
  switch (static_cast<GlobalId>(callable->i)) {
    case GlobalId::kOrderedDict: {
      ASSIGN_OR_RETURN(Value * dict, New(Kind::kDict));
      if (args->items.empty()) return dict;
      // OrderedDict([(k, v), ...])
      if (args->items.size() != 1 || args->items[0]->kind != Kind::kList) {
        return Error("unsupported OrderedDict arguments");
      }
      for (const Value* pair : args->items[0]->items) {
        if (pair->kind != Kind::kTuple || pair->items.size() != 2) {
          return Error("OrderedDict item is not a (key, value) pair");
        }
        RETURN_IF_ERROR(AddItems(dict, pair->items));
      }
      return dict;
    }
    case GlobalId::kRebuildTensorV2:
      return RebuildTensor(args->items);
    case GlobalId::kRebuildParameter:
      // _rebuild_parameter(data, requires_grad, backward_hooks): the parameter is its data.
      if (args->items.size() != 3 || args->items[0]->kind != Kind::kTensor) {
        return Error("_rebuild_parameter expects (tensor, requires_grad, hooks)");
      }
      return args->items[0];
    case GlobalId::kStorageClass:
      break;
  }
  return Error(absl::StrCat("calling '", callable->s, "' is not allowed"));
}

// pid = ('storage', storage_class, key, location, numel)
absl::StatusOr<Value*> Unpickler::PersistentLoad(Value* pid) {
  if (pid->kind != Kind::kTuple || pid->items.size() != 5 ||
      pid->items[0]->kind != Kind::kString || pid->items[0]->s != "storage") {
    return Error("persistent id is not a ('storage', type, key, location, numel) tuple");
  }
  const Value* cls = pid->items[1];
  const Value* key = pid->items[2];
  const Value* numel = pid->items[4];
  if (cls->kind != Kind::kGlobal || static_cast<GlobalId>(cls->i) != GlobalId::kStorageClass) {
    return Error("persistent id: element 1 is not a torch storage class");
  }
  if (key->kind != Kind::kString || numel->kind != Kind::kInt) {
    return Error("persistent id: key must be a str and numel an int");
  }
  if (key->s.empty() || key->s.find('/') != std::string::npos || key->s == "." ||
      key->s == "..") {
    return Error(absl::StrCat("persistent id: invalid storage key '", key->s, "'"));
  }
  ASSIGN_OR_RETURN(Value * v, New(Kind::kStorage));
  v->tensor = std::make_unique<PickledTensor>();
  v->tensor->storage_key = key->s;
  v->tensor->storage_type = cls->s.substr(cls->s.find('.') + 1);
  v->tensor->dtype = cls->dtype;
  v->tensor->storage_numel = numel->i;
  return v;
}

absl::Status Unpickler::AddItems(Value* dict, const std::vector<Value*>& kv) {
  if (dict->kind != Kind::kDict) {
    return Error(absl::StrCat("SETITEM(S) on a ", KindName(dict->kind), ", not a dict"));
  }
  if (kv.size() % 2 != 0) return Error("SETITEMS with an odd number of items");
  dict->items.insert(dict->items.end(), kv.begin(), kv.end());
  return absl::OkStatus();
}

absl::Status Unpickler::Step(uint8_t op, bool* stop) {
  switch (op) {
    case 0x80: {  // PROTO
      ASSIGN_OR_RETURN(uint64_t proto, UIntLE(1));
      if (proto > 5) return Error(absl::StrCat("unsupported pickle protocol ", proto));
      return absl::OkStatus();
    }
    case 0x95:  // FRAME: a length hint only
      return UIntLE(8).status();
    case '.':  // STOP
      *stop = true;
      return absl::OkStatus();
    case '(':  // MARK
      if (marks_.size() >= kMaxMarks) return Error("too many nested MARKs");
      marks_.push_back(stack_.size());
      return absl::OkStatus();
    case '0':  // POP
      return Pop().status();
    case '1':  // POP_MARK
      return PopToMark().status();
    case '2': {  // DUP
      ASSIGN_OR_RETURN(Value * top, Top());
      return Push(top);
    }
    case 'N': {  // NONE
      ASSIGN_OR_RETURN(Value * v, New(Kind::kNone));
      return Push(v);
    }
    case 0x88:  // NEWTRUE
    case 0x89: {  // NEWFALSE
      ASSIGN_OR_RETURN(Value * v, New(Kind::kBool));
      v->i = op == 0x88 ? 1 : 0;
      return Push(v);
    }
    case 'J': {  // BININT (signed 32-bit)
      ASSIGN_OR_RETURN(uint64_t u, UIntLE(4));
      return PushInt(static_cast<int32_t>(static_cast<uint32_t>(u)));
    }
    case 'K': {  // BININT1
      ASSIGN_OR_RETURN(uint64_t u, UIntLE(1));
      return PushInt(static_cast<int64_t>(u));
    }
    case 'M': {  // BININT2
      ASSIGN_OR_RETURN(uint64_t u, UIntLE(2));
      return PushInt(static_cast<int64_t>(u));
    }
    case 0x8a:    // LONG1
    case 0x8b: {  // LONG4
      ASSIGN_OR_RETURN(uint64_t n, UIntLE(op == 0x8a ? 1 : 4));
      if (n > 8) return Error(absl::StrCat("integer of ", n, " bytes does not fit in int64"));
      ASSIGN_OR_RETURN(uint64_t u, UIntLE(static_cast<int>(n)));
      if (n > 0 && n < 8 && (u >> (8 * n - 1)) != 0) u |= ~uint64_t{0} << (8 * n);  // sign
      return PushInt(static_cast<int64_t>(u));
    }
    case 'G': {  // BINFLOAT (big-endian double)
      ASSIGN_OR_RETURN(absl::string_view b, Bytes(8));
      uint64_t bits = 0;
      for (char c : b) bits = (bits << 8) | static_cast<uint8_t>(c);
      ASSIGN_OR_RETURN(Value * v, New(Kind::kFloat));
      std::memcpy(&v->f, &bits, sizeof(double));
      return Push(v);
    }
    case 0x8c: {  // SHORT_BINUNICODE
      ASSIGN_OR_RETURN(uint64_t n, UIntLE(1));
      return PushString(Kind::kString, n);
    }
    case 'X': {  // BINUNICODE
      ASSIGN_OR_RETURN(uint64_t n, UIntLE(4));
      return PushString(Kind::kString, n);
    }
    case 0x8d: {  // BINUNICODE8
      ASSIGN_OR_RETURN(uint64_t n, UIntLE(8));
      return PushString(Kind::kString, n);
    }
    case 'C': {  // SHORT_BINBYTES
      ASSIGN_OR_RETURN(uint64_t n, UIntLE(1));
      return PushString(Kind::kBytes, n);
    }
    case 'B': {  // BINBYTES
      ASSIGN_OR_RETURN(uint64_t n, UIntLE(4));
      return PushString(Kind::kBytes, n);
    }
    case 0x8e: {  // BINBYTES8
      ASSIGN_OR_RETURN(uint64_t n, UIntLE(8));
      return PushString(Kind::kBytes, n);
    }
    case '}': {  // EMPTY_DICT
      ASSIGN_OR_RETURN(Value * v, New(Kind::kDict));
      return Push(v);
    }
    case ']': {  // EMPTY_LIST
      ASSIGN_OR_RETURN(Value * v, New(Kind::kList));
      return Push(v);
    }
    case ')':  // EMPTY_TUPLE
      return PushTuple({});
    case 't': {  // TUPLE
      ASSIGN_OR_RETURN(std::vector<Value*> items, PopToMark());
      return PushTuple(std::move(items));
    }
    case 0x85:    // TUPLE1
    case 0x86:    // TUPLE2
    case 0x87: {  // TUPLE3
      std::vector<Value*> items(op - 0x84);
      for (size_t k = items.size(); k > 0; --k) {
        ASSIGN_OR_RETURN(items[k - 1], Pop());
      }
      return PushTuple(std::move(items));
    }
    case 'l': {  // LIST
      ASSIGN_OR_RETURN(std::vector<Value*> items, PopToMark());
      ASSIGN_OR_RETURN(Value * v, New(Kind::kList));
      v->items = std::move(items);
      return Push(v);
    }
    case 'd': {  // DICT
      ASSIGN_OR_RETURN(std::vector<Value*> items, PopToMark());
      ASSIGN_OR_RETURN(Value * v, New(Kind::kDict));
      RETURN_IF_ERROR(AddItems(v, items));
      return Push(v);
    }
    case 'q': {  // BINPUT
      ASSIGN_OR_RETURN(uint64_t idx, UIntLE(1));
      return Memoize(idx);
    }
    case 'r': {  // LONG_BINPUT
      ASSIGN_OR_RETURN(uint64_t idx, UIntLE(4));
      return Memoize(idx);
    }
    case 0x94:  // MEMOIZE
      return Memoize(memo_.size());
    case 'h':    // BINGET
    case 'j': {  // LONG_BINGET
      ASSIGN_OR_RETURN(uint64_t idx, UIntLE(op == 'h' ? 1 : 4));
      auto it = memo_.find(idx);
      if (it == memo_.end()) return Error(absl::StrCat("memo key ", idx, " not defined"));
      return Push(it->second);
    }
    case 'c': {  // GLOBAL "module\nname\n"
      ASSIGN_OR_RETURN(absl::string_view module, Line());
      ASSIGN_OR_RETURN(absl::string_view name, Line());
      ASSIGN_OR_RETURN(Value * v, MakeGlobal(module, name));
      return Push(v);
    }
    case 0x93: {  // STACK_GLOBAL
      ASSIGN_OR_RETURN(Value * name, Pop());
      ASSIGN_OR_RETURN(Value * module, Pop());
      if (module->kind != Kind::kString || name->kind != Kind::kString) {
        return Error("STACK_GLOBAL needs two str operands");
      }
      ASSIGN_OR_RETURN(Value * v, MakeGlobal(module->s, name->s));
      return Push(v);
    }
    case 'R': {  // REDUCE
      ASSIGN_OR_RETURN(Value * args, Pop());
      ASSIGN_OR_RETURN(Value * callable, Pop());
      ASSIGN_OR_RETURN(Value * v, Reduce(callable, args));
      return Push(v);
    }
    case 'b': {  // BUILD: state of a dict (OrderedDict._metadata) or tensor is dropped
      ASSIGN_OR_RETURN(Value * state, Pop());
      (void)state;
      ASSIGN_OR_RETURN(Value * target, Top());
      if (target->kind != Kind::kDict && target->kind != Kind::kTensor) {
        return Error(absl::StrCat("BUILD on a ", KindName(target->kind)));
      }
      return absl::OkStatus();
    }
    case 'Q': {  // BINPERSID
      ASSIGN_OR_RETURN(Value * pid, Pop());
      ASSIGN_OR_RETURN(Value * v, PersistentLoad(pid));
      return Push(v);
    }
    case 's': {  // SETITEM
      ASSIGN_OR_RETURN(Value * value, Pop());
      ASSIGN_OR_RETURN(Value * key, Pop());
      ASSIGN_OR_RETURN(Value * dict, Top());
      return AddItems(dict, {key, value});
    }
    case 'u': {  // SETITEMS
      ASSIGN_OR_RETURN(std::vector<Value*> items, PopToMark());
      ASSIGN_OR_RETURN(Value * dict, Top());
      return AddItems(dict, items);
    }
    case 'a': {  // APPEND
      ASSIGN_OR_RETURN(Value * item, Pop());
      ASSIGN_OR_RETURN(Value * list, Top());
      if (list->kind != Kind::kList) return Error("APPEND to a non-list");
      list->items.push_back(item);
      return absl::OkStatus();
    }
    case 'e': {  // APPENDS
      ASSIGN_OR_RETURN(std::vector<Value*> items, PopToMark());
      ASSIGN_OR_RETURN(Value * list, Top());
      if (list->kind != Kind::kList) return Error("APPENDS to a non-list");
      list->items.insert(list->items.end(), items.begin(), items.end());
      return absl::OkStatus();
    }
    default:
      return Error(absl::StrFormat("unsupported opcode 0x%02x", op));
  }
}

absl::StatusOr<Value*> Unpickler::Run() {
  bool stop = false;
  while (!stop) {
    op_offset_ = pos_;
    if (pos_ >= data_.size()) return Error("truncated: no STOP opcode");
    const uint8_t op = data_[pos_++];
    RETURN_IF_ERROR(Step(op, &stop));
  }
  if (!marks_.empty() || stack_.size() != 1) {
    return Error(absl::StrCat("STOP with ", stack_.size(), " values and ", marks_.size(),
                              " marks on the stack"));
  }
  return stack_.back();
}

absl::Status CheckTensor(const PickledTensor& t) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("pickle: tensor '", t.name, "': ", what));
  };
  if (t.storage_offset < 0) return bad("negative storage offset");
  if (t.storage_numel < 0) return bad("negative storage size");
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (t.shape[d] < 0) return bad(absl::StrCat("negative size in dimension ", d));
    if (t.strides[d] < 0) return bad(absl::StrCat("negative stride in dimension ", d));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<PickledTensor>> ParseTorchStateDict(
    absl::Span<const uint8_t> pickle) {
  Unpickler unpickler(pickle);
  ASSIGN_OR_RETURN(const Value* root, unpickler.Run());
  if (root->kind != Kind::kDict) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pickle: top-level object is a ", KindName(root->kind), ", not a state_dict"));
  }
  std::vector<PickledTensor> out;
  absl::flat_hash_set<std::string> seen;
  for (size_t k = 0; k + 1 < root->items.size(); k += 2) {
    const Value* key = root->items[k];
    const Value* value = root->items[k + 1];
    if (key->kind != Kind::kString) {
      return absl::InvalidArgumentError(
          absl::StrCat("pickle: state_dict key is a ", KindName(key->kind), ", not a str"));
    }
    if (value->kind != Kind::kTensor) {
      return absl::InvalidArgumentError(absl::StrCat("pickle: value of '", key->s, "' is a ",
                                                     KindName(value->kind), ", not a tensor"));
    }
    if (!seen.insert(key->s).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("pickle: duplicate state_dict key '", key->s, "'"));
    }
    PickledTensor t = *value->tensor;
    t.name = key->s;
    RETURN_IF_ERROR(CheckTensor(t));
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace dcf
