#include "volt/checkpoint/async_writer.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>
#include <tuple>
#include <utility>

namespace volt {

namespace {

using CopyTensor = std::function<at::Tensor(const at::Tensor&)>;

/// What makes two tensors the same values: the same view of the same memory.
using ViewKey = std::tuple<const void*, int, int, int64_t, std::vector<int64_t>, std::vector<int64_t>, int>;

/// The tensors copied so far by one rebuild, by view: a tensor met twice (the same parameter in
/// two checkpoints of one save, tied weights) is copied once, and its copies stay one tensor, as
/// serializing the originals would keep them.
using CopiedViews = std::map<ViewKey, at::Tensor>;

/// `value` rebuilt as below, `copied` the views copied so far.
c10::IValue rebuild(const c10::IValue& value, const CopyTensor& copy_tensor, CopiedViews& copied) {
  if (value.isTensor()) {
    const at::Tensor& tensor = value.toTensor();
    if (!tensor.defined()) return value;
    const void* memory = tensor.storage().data();
    if (memory == nullptr) return copy_tensor(tensor.detach());  // no memory to share
    ViewKey key{memory,
                static_cast<int>(tensor.device().type()),
                static_cast<int>(tensor.device().index()),
                tensor.storage_offset(),
                tensor.sizes().vec(),
                tensor.strides().vec(),
                static_cast<int>(tensor.scalar_type())};
    const auto found = copied.find(key);
    if (found != copied.end()) return found->second;
    at::Tensor copy = copy_tensor(tensor.detach());
    copied.emplace(std::move(key), copy);
    return copy;
  }
  if (value.isGenericDict()) {
    const c10::impl::GenericDict dict = value.toGenericDict();
    c10::impl::GenericDict copy(dict.keyType(), dict.valueType());
    copy.reserve(dict.size());
    for (const auto& entry : dict) copy.insert(entry.key(), rebuild(entry.value(), copy_tensor, copied));
    return copy;
  }
  if (value.isList()) {
    const c10::List<c10::IValue> list = value.toList();
    c10::impl::GenericList copy(list.elementType());
    copy.reserve(list.size());
    for (const c10::IValue& element : list) copy.push_back(rebuild(element, copy_tensor, copied));
    return copy;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const c10::IValue& element : value.toTupleRef().elements())
      elements.push_back(rebuild(element, copy_tensor, copied));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return value;  // strings, numbers, None: immutable, shared
}

/// `value` with its containers rebuilt and each defined tensor replaced by `copy_tensor`'s copy
/// (once per view: CopiedViews).
c10::IValue rebuild(const c10::IValue& value, const CopyTensor& copy_tensor) {
  CopiedViews copied;
  return rebuild(value, copy_tensor, copied);
}

}  // namespace

c10::IValue host_copy(const c10::IValue& value) {
  // to(kCPU) alone returns the same tensor on the CPU; clone gives it memory of its own. A tensor
  // on a GPU is copied once, into new host memory.
  return rebuild(value, [](const at::Tensor& t) { return t.device().is_cpu() ? t.clone() : t.to(at::kCPU); });
}

struct HostBuffers::Pending {
  std::vector<c10::Event> events;
};

HostBuffers::HostBuffers() : pending_(std::make_unique<Pending>()) {}

HostBuffers::~HostBuffers() {
  // Pinned memory a copy still writes into must outlive it.
  wait_copied();
}

c10::IValue HostBuffers::copy(const c10::IValue& value) {
  wait_copied();  // the previous copy's buffers are reused below
  size_t next = 0;
  std::vector<at::Tensor> used;
  std::vector<bool> pinned;
  std::vector<c10::Device> devices;
  c10::IValue copy = rebuild(value, [&](const at::Tensor& t) {
    const size_t i = next++;
    at::Tensor buffer;
    const bool on_device = !t.device().is_cpu();
    // (Whether a buffer is pinned is remembered: Tensor::is_pinned asks the CUDA hooks, which a
    // CPU build of LibTorch 1.13 lacks.)
    if (i < buffers_.size() && buffers_[i].sizes() == t.sizes() && buffers_[i].scalar_type() == t.scalar_type() &&
        pinned_[i] == on_device) {
      buffer = buffers_[i];
    } else {
      // Pinned host memory takes a GPU's copy at full speed, and without blocking.
      buffer = at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()).pinned_memory(on_device));
    }
    buffer.copy_(t, /*non_blocking=*/on_device);
    if (on_device && std::find(devices.begin(), devices.end(), t.device()) == devices.end())
      devices.push_back(t.device());
    used.push_back(buffer);
    pinned.push_back(on_device);
    return buffer;
  });
  buffers_ = std::move(used);
  pinned_ = std::move(pinned);
  for (const c10::Device& device : devices) {
    // After the copies on the stream they were queued on.
    const c10::impl::VirtualGuardImpl guard(device.type());
    c10::Event event(device.type());
    event.record(guard.getStream(device));
    pending_->events.push_back(std::move(event));
  }
  return copy;
}

void HostBuffers::wait_copied() {
  // c10::Event has no blocking wait in every LibTorch this builds against (1.13 has only query);
  // the writer thread polls, which costs the training thread nothing.
  for (const c10::Event& event : pending_->events) {
    while (!event.query()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  pending_->events.clear();
}

int64_t HostBuffers::bytes() const {
  int64_t total = 0;
  for (const at::Tensor& buffer : buffers_) total += static_cast<int64_t>(buffer.nbytes());
  return total;
}

AsyncWriter::AsyncWriter() : thread_([this] { run(); }) {}

AsyncWriter::~AsyncWriter() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return queue_.empty() && !running_; });
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

bool AsyncWriter::busy() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return !queue_.empty() || running_;
}

void AsyncWriter::wait_locked(std::unique_lock<std::mutex>& lock) {
  if (!queue_.empty() || running_) {
    const auto start = std::chrono::steady_clock::now();
    changed_.wait(lock, [this] { return queue_.empty() && !running_; });
    stats_.waited_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void AsyncWriter::submit(std::function<void()> write) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_locked(lock);
    queue_.push_back(std::move(write));
  }
  changed_.notify_all();
}

void AsyncWriter::then(std::function<void()> task) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  changed_.notify_all();
}

void AsyncWriter::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_locked(lock);
}

AsyncWriterStats AsyncWriter::stats() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void AsyncWriter::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) return;  // stopping, nothing left
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    lock.unlock();
    const auto start = std::chrono::steady_clock::now();
    std::exception_ptr error;
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    task = nullptr;  // what it held (a copy of the state) goes now, outside the lock
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    lock.lock();
    running_ = false;
    ++stats_.writes;
    stats_.write_seconds += seconds;
    if (error && !error_) error_ = error;
    changed_.notify_all();
  }
}

}  // namespace volt
