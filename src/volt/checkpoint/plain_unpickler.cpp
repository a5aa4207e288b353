#include "volt/checkpoint/plain_unpickler.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "volt/checkpoint/dcp_checkpoint.h"
#include "volt/core/error.h"

namespace volt::internal {
namespace {

// The pickle opcodes torch.save emits (protocol 2, its default) plus the protocol 4 ones a
// caller's `pickle_protocol=4` adds. Names as in Python's pickle.py.
enum Op : uint8_t {
  kMark = '(',
  kStop = '.',
  kPop = '0',
  kPopMark = '1',
  kBinFloat = 'G',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kBinInt2 = 'M',
  kNone = 'N',
  kBinPersId = 'Q',
  kReduce = 'R',
  kShortBinString = 'U',
  kBinUnicode = 'X',
  kAppend = 'a',
  kBuild = 'b',
  kGlobal = 'c',
  kAppends = 'e',
  kBinGet = 'h',
  kLongBinGet = 'j',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kSetItems = 'u',
  kEmptyDict = '}',
  kEmptyList = ']',
  kEmptyTuple = ')',
  kProto = 0x80,
  kNewObj = 0x81,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d,
  kStackGlobal = 0x93,
  kMemoize = 0x94,
  kFrame = 0x95,
};

constexpr const char* kOrderedDict = "collections.OrderedDict";
constexpr const char* kRebuildTensorV2 = "torch._utils._rebuild_tensor_v2";
constexpr const char* kRebuildParameter = "torch._utils._rebuild_parameter";
constexpr const char* kRebuildParameterWithState = "torch._utils._rebuild_parameter_with_state";

// Storage classes as torch.save names them in a tensor's persistent id.
const std::unordered_map<std::string, at::ScalarType>& storage_types() {
  static const auto* types = new std::unordered_map<std::string, at::ScalarType>{
      {"FloatStorage", at::kFloat},
      {"DoubleStorage", at::kDouble},
      {"HalfStorage", at::kHalf},
      {"BFloat16Storage", at::kBFloat16},
      {"LongStorage", at::kLong},
      {"IntStorage", at::kInt},
      {"ShortStorage", at::kShort},
      {"CharStorage", at::kChar},
      {"ByteStorage", at::kByte},
      {"BoolStorage", at::kBool},
      {"ComplexFloatStorage", at::kComplexFloat},
      {"ComplexDoubleStorage", at::kComplexDouble},
      {"UntypedStorage", at::kByte},
  };
  return *types;
}

// What the pickle machine holds: a plain value, or one of the intermediate things that only
// exist while a tensor is being rebuilt. Tuples hold items, not values, because a tensor's
// arguments (a storage among them) arrive as a tuple.
struct Item {
  enum class Kind { kValue, kTuple, kGlobal, kStorageType, kStorage };

  Kind kind = Kind::kValue;
  c10::IValue value;
  std::shared_ptr<std::vector<Item>> tuple;
  std::string global;
  at::ScalarType dtype = at::kByte;
  at::Storage storage;

  static Item of(c10::IValue v) {
    Item item;
    item.value = std::move(v);
    return item;
  }
};

// torch.distributed.checkpoint's .metadata: the classes that load as records, and the callables
// its pickle REDUCEs (each turned into a plain value; see unpickle_dcp_metadata).
const std::unordered_set<std::string>& dcp_record_classes() {
  static const auto* classes = new std::unordered_set<std::string>{
      "torch.distributed.checkpoint.metadata.Metadata",
      "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
      "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
      "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
      "torch.distributed.checkpoint.metadata.TensorProperties",
      "torch.distributed.checkpoint.metadata.MetadataIndex",
      "torch.distributed.checkpoint.metadata.StorageMeta",
      "torch.distributed.checkpoint.filesystem._StorageInfo",
  };
  return *classes;
}
// The dtypes a .metadata names as globals (`torch.float32`), which load as their names.
const std::unordered_set<std::string>& dtype_names() {
  static const auto* names = [] {
    auto* set = new std::unordered_set<std::string>;
    for (const auto& [name, dtype] : dcp_dtype_names()) set->insert(name);
    return set;
  }();
  return *names;
}

const std::unordered_set<std::string>& dcp_callables() {
  static const auto* callables = new std::unordered_set<std::string>{
      "torch.Size",        "torch.serialization._get_layout",
      "builtins.getattr",  "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
      "pathlib.PosixPath", "pathlib.WindowsPath",
  };
  return *callables;
}

class Machine {
 public:
  Machine(const char* data, size_t size, const ReadRecord& read_record, const std::string& what,
          bool dcp_metadata = false)
      : data_(data), size_(size), read_record_(read_record), what_(what), dcp_metadata_(dcp_metadata) {}

  c10::IValue run() {
    while (true) {
      const size_t at = pos_;
      const auto op = read<uint8_t>();
      if (op == kStop) break;
      step(op, at);
    }
    if (stack_.size() != 1 || !marks_.empty()) {
      corrupt(
          fmt::format("the pickle ends with {} values and {} marks on its stack, expected 1 "
                      "value",
                      stack_.size(), marks_.size()));
    }
    return to_value(stack_.back());
  }

 private:
  void step(uint8_t op, size_t at) {
    switch (op) {
      case kProto:
        read<uint8_t>();
        return;
      case kFrame:
        read<uint64_t>();
        return;
      case kMark:
        marks_.push_back(stack_.size());
        return;
      case kPop:
        pop();
        return;
      case kPopMark:
        pop_to_mark();
        return;
      case kNone:
        push(c10::IValue());
        return;
      case kNewTrue:
        push(true);
        return;
      case kNewFalse:
        push(false);
        return;
      case kBinInt:
        push(static_cast<int64_t>(read<int32_t>()));
        return;
      case kBinInt1:
        push(static_cast<int64_t>(read<uint8_t>()));
        return;
      case kBinInt2:
        push(static_cast<int64_t>(read<uint16_t>()));
        return;
      case kLong1:
        push(read_long(read<uint8_t>()));
        return;
      case kBinFloat:
        push(read_big_endian_double());
        return;
      case kShortBinString:
      case kShortBinUnicode:
        push(read_string(read<uint8_t>()));
        return;
      case kBinUnicode:
        push(read_string(read<uint32_t>()));
        return;
      case kBinUnicode8:
        push(read_string(read<uint64_t>()));
        return;
      case kEmptyList:
        push(c10::impl::GenericList(c10::AnyType::get()));
        return;
      case kEmptyDict:
        push(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
        return;
      case kEmptyTuple:
        push_tuple({});
        return;
      case kTuple:
        push_tuple(pop_to_mark());
        return;
      case kTuple1:
        push_tuple(pop_n(1));
        return;
      case kTuple2:
        push_tuple(pop_n(2));
        return;
      case kTuple3:
        push_tuple(pop_n(3));
        return;
      case kAppend:
        append(pop_n(1));
        return;
      case kAppends:
        append(pop_to_mark());
        return;
      case kSetItem:
        set_items(pop_n(2));
        return;
      case kSetItems:
        set_items(pop_to_mark());
        return;
      case kBinPut:
        memo_put(read<uint8_t>());
        return;
      case kLongBinPut:
        memo_put(read<uint32_t>());
        return;
      case kMemoize:
        memo_put(static_cast<uint32_t>(memo_.size()));
        return;
      case kBinGet:
        memo_get(read<uint8_t>());
        return;
      case kLongBinGet:
        memo_get(read<uint32_t>());
        return;
      case kGlobal: {
        std::string module = read_line();
        std::string name = read_line();
        push_global(module, name);
        return;
      }
      case kStackGlobal: {
        const std::string name = pop_string();
        const std::string module = pop_string();
        push_global(module, name);
        return;
      }
      case kReduce:
        reduce();
        return;
      case kBuild:
        build();
        return;
      case kBinPersId:
        persistent_load();
        return;
      case kNewObj:
        if (dcp_metadata_) {
          new_record();
          return;
        }
        not_plain("creates an object with NEWOBJ (a pickled class instance)");
      default:
        corrupt(fmt::format("unsupported pickle opcode 0x{:02x} at byte {}", op, at));
    }
  }

  // ---- reading the byte stream ----

  void need(size_t n) {
    if (n > size_ - pos_) {
      corrupt(fmt::format("its pickle is cut short: {} more bytes needed at byte {} of {}", n, pos_, size_));
    }
  }

  // Pickle numbers are little-endian, as is every machine Volt runs on.
  template <typename T>
  T read() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  double read_big_endian_double() {
    need(8);
    uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<unsigned char>(data_[pos_ + i]);
    pos_ += 8;
    double value = 0;
    std::memcpy(&value, &bits, sizeof(value));
    return value;
  }

  int64_t read_long(size_t n) {
    if (n > 8) {
      not_plain(fmt::format("holds an integer of {} bytes, which does not fit int64", n));
    }
    need(n);
    uint64_t bits = 0;
    for (size_t i = 0; i < n; ++i) {
      bits |= static_cast<uint64_t>(static_cast<unsigned char>(data_[pos_ + i])) << (8 * i);
    }
    // Two's complement: sign-extend from the top byte that was read.
    if (n > 0 && n < 8 && (static_cast<unsigned char>(data_[pos_ + n - 1]) & 0x80)) {
      bits |= ~uint64_t{0} << (8 * n);
    }
    pos_ += n;
    return static_cast<int64_t>(bits);
  }

  std::string read_string(uint64_t n) {
    need(n);
    std::string text(data_ + pos_, n);
    pos_ += n;
    return text;
  }

  std::string read_line() {
    const void* newline = std::memchr(data_ + pos_, '\n', size_ - pos_);
    if (newline == nullptr) corrupt("its pickle is cut short inside a GLOBAL");
    const size_t end = static_cast<const char*>(newline) - data_;
    std::string line(data_ + pos_, end - pos_);
    pos_ = end + 1;
    return line;
  }

  // ---- the stack ----

  void push(c10::IValue value) { stack_.push_back(Item::of(std::move(value))); }

  void push_tuple(std::vector<Item> items) {
    Item item;
    item.kind = Item::Kind::kTuple;
    item.tuple = std::make_shared<std::vector<Item>>(std::move(items));
    stack_.push_back(std::move(item));
  }

  Item pop() {
    if (stack_.empty() || (!marks_.empty() && marks_.back() == stack_.size())) {
      corrupt("its pickle pops from an empty stack");
    }
    Item item = std::move(stack_.back());
    stack_.pop_back();
    return item;
  }

  std::vector<Item> pop_n(size_t n) {
    const size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() < floor + n) corrupt("its pickle pops from an empty stack");
    std::vector<Item> items(std::make_move_iterator(stack_.end() - n), std::make_move_iterator(stack_.end()));
    stack_.resize(stack_.size() - n);
    return items;
  }

  std::vector<Item> pop_to_mark() {
    if (marks_.empty()) corrupt("its pickle has no MARK where one is needed");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<Item> items(std::make_move_iterator(stack_.begin() + mark), std::make_move_iterator(stack_.end()));
    stack_.resize(mark);
    return items;
  }

  Item& top() {
    if (stack_.empty()) corrupt("its pickle reads from an empty stack");
    return stack_.back();
  }

  std::string pop_string() {
    Item item = pop();
    if (item.kind != Item::Kind::kValue || !item.value.isString()) {
      corrupt("its pickle's STACK_GLOBAL names are not strings");
    }
    return item.value.toStringRef();
  }

  void memo_put(uint32_t index) { memo_[index] = top(); }

  void memo_get(uint32_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) corrupt(fmt::format("its pickle reads memo entry {} that was never written", index));
    stack_.push_back(it->second);
  }

  // ---- building values ----

  c10::IValue to_value(const Item& item) {
    switch (item.kind) {
      case Item::Kind::kValue:
        return item.value;
      case Item::Kind::kTuple: {
        std::vector<c10::IValue> values;
        values.reserve(item.tuple->size());
        for (const Item& element : *item.tuple) values.push_back(to_value(element));
        return c10::ivalue::Tuple::create(std::move(values));
      }
      case Item::Kind::kGlobal:
        not_plain(fmt::format("holds the global `{}` itself as a value", item.global));
      case Item::Kind::kStorageType:
        not_plain("holds a storage class itself as a value");
      case Item::Kind::kStorage:
        not_plain("holds a bare storage (not a tensor) as a value");
    }
    corrupt("its pickle holds an unknown kind of value");
  }

  void append(std::vector<Item> items) {
    Item& target = top();
    if (target.kind != Item::Kind::kValue || !target.value.isList()) {
      not_plain("appends to something that is not a list");
    }
    auto list = target.value.toList();
    for (const Item& item : items) list.push_back(to_value(item));
  }

  void set_items(std::vector<Item> items) {
    if (items.size() % 2 != 0) corrupt("its pickle sets a dict item without a value");
    Item& target = top();
    if (target.kind != Item::Kind::kValue || !target.value.isGenericDict()) {
      not_plain("sets items on something that is not a dict");
    }
    auto dict = target.value.toGenericDict();
    for (size_t i = 0; i < items.size(); i += 2) {
      dict.insert_or_assign(key_value(items[i]), to_value(items[i + 1]));
    }
  }

  // A dict key: a DCP MetadataIndex (a record, which c10 cannot hash) as "<fqn>@<offsets>".
  c10::IValue key_value(const Item& item) {
    c10::IValue key = to_value(item);
    if (!dcp_metadata_ || !key.isGenericDict()) return key;
    const c10::impl::GenericDict record = key.toGenericDict();
    if (!record.contains("__class__") || record.at("__class__").toStringRef() != "MetadataIndex" ||
        !record.contains("fqn") || !record.at("fqn").isString()) {
      corrupt("its pickle keys a dict by an object that is not a MetadataIndex");
    }
    std::string text = record.at("fqn").toStringRef() + "@";
    if (record.contains("offset") && !record.at("offset").isNone()) {
      const c10::IValue offset = record.at("offset");
      if (!offset.isTuple()) corrupt("a MetadataIndex's offset is not a torch.Size");
      const auto& elements = offset.toTupleRef().elements();
      for (size_t i = 0; i < elements.size(); ++i) {
        if (!elements[i].isInt()) corrupt("a MetadataIndex's offset is not a torch.Size");
        text += (i == 0 ? "" : ",") + std::to_string(elements[i].toInt());
      }
    }
    return text;
  }

  // NEWOBJ (DCP metadata): cls.__new__(cls, *args), as a record of the class's fields to come.
  void new_record() {
    Item args = pop();
    Item cls = pop();
    if (cls.kind != Item::Kind::kGlobal || !dcp_record_classes().count(cls.global) || args.kind != Item::Kind::kTuple ||
        !args.tuple->empty()) {
      refuse_dcp(
          fmt::format("creates an object of `{}` with NEWOBJ", cls.kind == Item::Kind::kGlobal ? cls.global : "?"));
    }
    c10::impl::GenericDict record(c10::StringType::get(), c10::AnyType::get());
    record.insert("__class__", cls.global.substr(cls.global.rfind('.') + 1));
    push(record);
  }

  // REDUCE of one of dcp_callables(): the plain value it stands for.
  void reduce_dcp(const std::string& callable, const std::vector<Item>& a) {
    const auto string_arg = [&](size_t i) {
      if (a.size() <= i || a[i].kind != Item::Kind::kValue || !a[i].value.isString())
        corrupt(fmt::format("its pickle calls {} without a string", callable));
      return a[i].value.toStringRef();
    };
    if (callable == "torch.Size") {
      if (a.size() != 1 || a[0].kind != Item::Kind::kTuple) corrupt("its pickle builds a torch.Size without a tuple");
      push(to_value(a[0]));
    } else if (callable == "torch.serialization._get_layout") {
      push(string_arg(0));
    } else if (callable == "builtins.getattr") {
      push(string_arg(1));  // an enum member, by name
    } else if (callable == "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING") {
      if (a.size() != 1) corrupt("its pickle builds a memory format without its value");
      push(to_value(a[0]));
    } else {  // a path
      std::string path;
      for (size_t i = 0; i < a.size(); ++i) path += (i == 0 ? "" : "/") + string_arg(i);
      push(path);
    }
  }

  void push_global(const std::string& module, const std::string& name) {
    const std::string full = module + "." + name;
    if (dcp_metadata_) {
      if (module == "torch" && dtype_names().count(name)) {
        push(name);  // a dtype, by name
        return;
      }
      if (!dcp_record_classes().count(full) && !dcp_callables().count(full)) {
        refuse_dcp(fmt::format("references the global `{}`", full));
      }
      Item item;
      item.kind = Item::Kind::kGlobal;
      item.global = full;
      stack_.push_back(std::move(item));
      return;
    }
    if (module == "torch") {
      const auto it = storage_types().find(name);
      if (it != storage_types().end()) {
        Item item;
        item.kind = Item::Kind::kStorageType;
        item.dtype = it->second;
        stack_.push_back(std::move(item));
        return;
      }
    }
    if (full != kOrderedDict && full != kRebuildTensorV2 && full != kRebuildParameter &&
        full != kRebuildParameterWithState) {
      not_plain(fmt::format("references the global `{}`", full));
    }
    Item item;
    item.kind = Item::Kind::kGlobal;
    item.global = full;
    stack_.push_back(std::move(item));
  }

  void reduce() {
    Item args = pop();
    Item callable = pop();
    if (callable.kind != Item::Kind::kGlobal || args.kind != Item::Kind::kTuple) {
      not_plain("calls something that is not an allowed global (REDUCE)");
    }
    const std::vector<Item>& a = *args.tuple;
    if (dcp_metadata_) {
      if (!dcp_callables().count(callable.global)) refuse_dcp(fmt::format("calls `{}`", callable.global));
      reduce_dcp(callable.global, a);
      return;
    }
    if (callable.global == kOrderedDict) {
      // OrderedDict() with its items set afterwards, as pickle writes it. A plain dict keeps
      // insertion order too, so nothing is lost.
      if (!a.empty()) not_plain("builds an OrderedDict from arguments");
      push(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
      return;
    }
    if (callable.global == kRebuildTensorV2) {
      push(rebuild_tensor(a));
      return;
    }
    // _rebuild_parameter(data, requires_grad, backward_hooks[, state]): the data is the value.
    if (a.empty() || a[0].kind != Item::Kind::kValue || !a[0].value.isTensor()) {
      corrupt(fmt::format("its pickle calls {} without a tensor", callable.global));
    }
    push(a[0].value);
  }

  void build() {
    Item state = pop();
    const Item& target = top();
    if (dcp_metadata_ && target.kind == Item::Kind::kValue && target.value.isGenericDict() &&
        target.value.toGenericDict().contains("__class__")) {
      // A record's fields: a dataclass's __dict__, or TensorProperties' __getstate__ tuple.
      c10::impl::GenericDict record = target.value.toGenericDict();
      const c10::IValue value = to_value(state);
      if (value.isGenericDict()) {
        for (const auto& entry : value.toGenericDict()) record.insert_or_assign(entry.key(), entry.value());
      } else {
        record.insert_or_assign("__state__", value);
      }
      return;
    }
    // Python pickles a module's state_dict (an OrderedDict) with its `_metadata` attribute
    // (per-module version numbers) as BUILD state. Checkpoints need the items only.
    if (target.kind == Item::Kind::kValue && target.value.isGenericDict()) return;
    not_plain("sets the state of an object (BUILD) that is not a dict");
  }

  int64_t int_arg(const Item& item, const char* name) {
    if (item.kind != Item::Kind::kValue || !item.value.isInt()) {
      corrupt(fmt::format("its pickle gives a tensor a {} that is not an int", name));
    }
    return item.value.toInt();
  }

  std::vector<int64_t> ints_arg(const Item& item, const char* name) {
    if (item.kind != Item::Kind::kTuple) {
      corrupt(fmt::format("its pickle gives a tensor a {} that is not a tuple", name));
    }
    std::vector<int64_t> values;
    for (const Item& element : *item.tuple) values.push_back(int_arg(element, name));
    return values;
  }

  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks
  // [, metadata]). requires_grad and hooks are dropped: a checkpoint holds values.
  at::Tensor rebuild_tensor(const std::vector<Item>& a) {
    if (a.size() < 4 || a[0].kind != Item::Kind::kStorage) {
      corrupt("its pickle calls _rebuild_tensor_v2 without a storage");
    }
    const int64_t offset = int_arg(a[1], "storage offset");
    const std::vector<int64_t> sizes = ints_arg(a[2], "size");
    const std::vector<int64_t> strides = ints_arg(a[3], "stride");
    try {
      return at::empty({0}, at::TensorOptions().dtype(a[0].dtype)).set_(a[0].storage, offset, sizes, strides);
    } catch (const c10::Error& error) {
      corrupt(fmt::format("a tensor does not fit its storage: {}", error.what_without_backtrace()));
    }
  }

  // The persistent id torch.save writes for a storage:
  // ('storage', <storage class>, key, location, numel). Its bytes are the record data/<key>.
  void persistent_load() {
    Item pid = pop();
    const std::vector<Item>* a = pid.kind == Item::Kind::kTuple ? pid.tuple.get() : nullptr;
    if (a == nullptr || a->size() < 5 || (*a)[0].kind != Item::Kind::kValue || !(*a)[0].value.isString() ||
        (*a)[0].value.toStringRef() != "storage" || (*a)[1].kind != Item::Kind::kStorageType ||
        (*a)[2].kind != Item::Kind::kValue || !(*a)[2].value.isString()) {
      not_plain("has a persistent id that is not a torch.save storage");
    }
    const at::ScalarType dtype = (*a)[1].dtype;
    const std::string& key = (*a)[2].value.toStringRef();
    const int64_t numel = int_arg((*a)[4], "storage size");

    Item item;
    item.kind = Item::Kind::kStorage;
    item.dtype = dtype;
    // Tensors that shared a storage when saved (views, tied weights) share it again.
    const auto cached = storages_.find(key);
    if (cached != storages_.end()) {
      item.storage = cached->second;
      stack_.push_back(std::move(item));
      return;
    }
    auto [data, record_size] = read_record_(key);
    const size_t bytes = static_cast<size_t>(numel) * at::elementSize(dtype);
    if (numel < 0 || record_size < bytes) {
      corrupt(fmt::format("a record is too short: data/{} has {} bytes, expected {} ({} x {})", key, record_size, bytes,
                          numel, c10::toString(dtype)));
    }
    item.storage = at::Storage(at::Storage::use_byte_size_t(), bytes, std::move(data),
                               /*allocator=*/nullptr, /*resizable=*/false);
    storages_.emplace(key, item.storage);
    stack_.push_back(std::move(item));
  }

  // ---- errors ----

  [[noreturn]] void corrupt(const std::string& detail) {
    throw CheckpointError(
        fmt::format("{} is truncated or corrupt ({}). HINT: delete it and resume from the previous "
                    "checkpoint, or point ckpt_path at another file.",
                    what_, detail));
  }

  [[noreturn]] void refuse_dcp(const std::string& detail) {
    throw CheckpointError(
        fmt::format("{} is not the .metadata of a distributed checkpoint Volt reads: its pickle {}, which "
                    "PyTorch's FileSystemWriter does not write. HINT: save it with torch.distributed.checkpoint's "
                    "default writer (dcp.save(state, checkpoint_id=folder)); a checkpoint with a custom planner or "
                    "storage extensions cannot be read here.",
                    what_, detail));
  }

  [[noreturn]] void not_plain(const std::string& detail) {
    throw CheckpointError(
        fmt::format("{} is not a plain checkpoint: its pickle {}; Volt reads only dicts, lists, tuples, "
                    "strings, numbers, bools, None and tensors (what torch.load(weights_only=True) reads). "
                    "HINT: in Python, save plain values, e.g. torch.save({{\"state_dict\": "
                    "model.state_dict()}}, path) rather than the model or custom objects.",
                    what_, detail));
  }

  const char* data_;
  size_t size_;
  size_t pos_ = 0;
  const ReadRecord& read_record_;
  const std::string& what_;
  const bool dcp_metadata_;
  std::vector<Item> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, Item> memo_;
  std::unordered_map<std::string, at::Storage> storages_;
};

}  // namespace

c10::IValue unpickle_plain(const char* data, size_t size, const ReadRecord& read_record, const std::string& what) {
  return Machine(data, size, read_record, what).run();
}

c10::IValue unpickle_dcp_metadata(const char* data, size_t size, const std::string& what) {
  const ReadRecord no_records = [&what](const std::string& key) -> std::pair<at::DataPtr, size_t> {
    throw CheckpointError(fmt::format("{} holds a tensor (record {}), which a .metadata never does", what, key));
  };
  return Machine(data, size, no_records, what, /*dcp_metadata=*/true).run();
}

}  // namespace volt::internal
