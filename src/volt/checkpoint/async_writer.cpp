#include "volt/checkpoint/async_writer.h"

#include <ATen/ATen.h>

#include <chrono>
#include <utility>

namespace volt {

c10::IValue host_copy(const c10::IValue& value) {
  if (value.isTensor()) {
    const at::Tensor& tensor = value.toTensor();
    if (!tensor.defined()) return value;
    // to(kCPU) alone returns the same tensor on the CPU; clone gives it memory of its own. A
    // tensor on a GPU is copied once, into new host memory.
    at::Tensor copy = tensor.detach();
    copy = copy.device().is_cpu() ? copy.clone() : copy.to(at::kCPU);
    return copy;
  }
  if (value.isGenericDict()) {
    const c10::impl::GenericDict dict = value.toGenericDict();
    c10::impl::GenericDict copy(dict.keyType(), dict.valueType());
    copy.reserve(dict.size());
    for (const auto& entry : dict) copy.insert(entry.key(), host_copy(entry.value()));
    return copy;
  }
  if (value.isList()) {
    const c10::List<c10::IValue> list = value.toList();
    c10::impl::GenericList copy(list.elementType());
    copy.reserve(list.size());
    for (const c10::IValue& element : list) copy.push_back(host_copy(element));
    return copy;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const c10::IValue& element : value.toTupleRef().elements()) elements.push_back(host_copy(element));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return value;  // strings, numbers, None: immutable, shared
}

AsyncWriter::AsyncWriter() : thread_([this] { run(); }) {}

AsyncWriter::~AsyncWriter() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return !pending_ && !writing_; });
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

bool AsyncWriter::busy() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return pending_.has_value() || writing_;
}

void AsyncWriter::wait_locked(std::unique_lock<std::mutex>& lock) {
  if (pending_ || writing_) {
    const auto start = std::chrono::steady_clock::now();
    changed_.wait(lock, [this] { return !pending_ && !writing_; });
    stats_.waited_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void AsyncWriter::submit(std::function<void()> write) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_locked(lock);
    pending_ = std::move(write);
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
    changed_.wait(lock, [this] { return pending_.has_value() || stopping_; });
    if (!pending_) return;  // stopping, nothing left
    std::function<void()> write = std::move(*pending_);
    pending_.reset();
    writing_ = true;
    lock.unlock();
    const auto start = std::chrono::steady_clock::now();
    std::exception_ptr error;
    try {
      write();
    } catch (...) {
      error = std::current_exception();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    lock.lock();
    writing_ = false;
    ++stats_.writes;
    stats_.write_seconds += seconds;
    if (error && !error_) error_ = error;
    changed_.notify_all();
  }
}

}  // namespace volt
