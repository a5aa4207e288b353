#include "volt/distributed/process_group.h"

#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/distributed/c10d_compat.h"

namespace volt {

namespace {

constexpr const char* kJoinedPrefix = "volt/joined/";
constexpr const char* kJoinedCount = "volt/joined_count";
constexpr const char* kFailureKey = "volt/failure";

bool is_loopback(const std::string& address) {
  return address == "localhost" || address.rfind("127.", 0) == 0 || address == "::1";
}

/// Gloo's options for a group of this run: the collective timeout, and the loopback device when
/// the run is on this host only (the default device may name an address other hosts use).
c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> gloo_options_for(const Topology& topology,
                                                                     std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(is_loopback(topology.main_address)
                                 ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                 : c10d::ProcessGroupGloo::createDefaultDevice());
  return options;
}

/// What a failed c10d call says, in one line: c10::Error's message without LibTorch's backtrace.
std::string peer_failure_text(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string text = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  return text.substr(0, text.find('\n'));
}

/// A PeerChannel over a two-process Gloo group of its own: a header message (tag, length), then
/// the bytes, each sent and received in turn with the group's timeout.
class GlooPeerChannel : public PeerChannel {
 public:
  GlooPeerChannel(c10::intrusive_ptr<c10d::ProcessGroup> group, int other, std::string peer_name)
      : group_(std::move(group)), other_(other), peer_name_(std::move(peer_name)) {}

  void send(int64_t tag, const std::vector<char>& bytes) override {
    std::vector<torch::Tensor> header{torch::tensor({tag, static_cast<int64_t>(bytes.size())}, torch::kLong)};
    run("send to", [&] { group_->send(header, other_, kHeaderTag)->wait(); });
    if (bytes.empty()) return;
    // Gloo reads the bytes where they are: no copy of a snapshot's size.
    std::vector<torch::Tensor> body{
        torch::from_blob(const_cast<char*>(bytes.data()), {static_cast<int64_t>(bytes.size())}, torch::kUInt8)};
    run("send to", [&] { group_->send(body, other_, kBodyTag)->wait(); });
  }

  std::pair<int64_t, std::vector<char>> receive() override {
    std::vector<torch::Tensor> header{torch::empty({2}, torch::kLong)};
    run("receive from", [&] { group_->recv(header, other_, kHeaderTag)->wait(); });
    const int64_t tag = header[0][0].item<int64_t>();
    std::vector<char> bytes(static_cast<size_t>(header[0][1].item<int64_t>()));
    if (!bytes.empty()) {
      std::vector<torch::Tensor> body{
          torch::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, torch::kUInt8)};
      run("receive from", [&] { group_->recv(body, other_, kBodyTag)->wait(); });
    }
    return {tag, std::move(bytes)};
  }

 private:
  static constexpr int kHeaderTag = 1;
  static constexpr int kBodyTag = 2;

  template <typename Call>
  void run(const char* what, Call call) {
    try {
      call();
    } catch (const std::exception& e) {
      throw Error(fmt::format("could not {} {}: {}. HINT: that process exited or hangs; its own error says why.", what,
                              peer_name_, peer_failure_text(e)));
    }
  }

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  int other_;
  std::string peer_name_;
};

/// Tries `attempt(fd, address)` on a fresh socket (`flags` added to its type) for each address of
/// host:port, closing each, until one returns true; false when none did or the name did not resolve.
template <typename Attempt>
bool any_address(const std::string& host, int port, int flags, Attempt attempt) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool done = false;
  for (addrinfo* a = found; a != nullptr && !done; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | flags | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    done = attempt(fd, *a);
    close(fd);
  }
  freeaddrinfo(found);
  return done;
}

/// Whether a TCP connection to `host`:`port` is accepted within 200 ms (closed at once). One that
/// was accepted and reset before this read it counts: something listens there.
bool port_accepts(const std::string& host, int port) {
  return any_address(host, port, SOCK_NONBLOCK, [](int fd, const addrinfo& a) {
    if (connect(fd, a.ai_addr, a.ai_addrlen) == 0) return true;
    if (errno != EINPROGRESS) return false;
    pollfd p{fd, POLLOUT, 0};
    int error = 0;
    socklen_t length = sizeof(error);
    return poll(&p, 1, 200) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 &&
           (error == 0 || error == ECONNRESET);
  });
}

#if !VOLT_TORCH_2
/// Whether the listener at host:port answers a c10d TCPStore CHECK request as LibTorch 1.13's
/// store does (one byte: READY 0 or NOT_READY 1). LibTorch 1.13's TCPStore client starts a thread
/// that calls std::terminate when its peer drops the connection, so a client must not be made
/// against something that is not a store; 2.x validates in its constructor and throws instead.
bool answers_like_a_store(const std::string& host, int port) {
  return any_address(host, port, 0, [](int fd, const addrinfo& a) {
    timeval limit{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
    if (connect(fd, a.ai_addr, a.ai_addrlen) != 0) return false;
    // QueryType::CHECK (4), one key: the key's length and bytes, lengths as 64-bit host order.
    const std::string key = "volt/probe";
    std::string request(1, '\x04');
    const uint64_t count = 1;
    const uint64_t length = key.size();
    request.append(reinterpret_cast<const char*>(&count), sizeof(count));
    request.append(reinterpret_cast<const char*>(&length), sizeof(length));
    request += key;
    uint8_t reply = 0xff;
    return send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size()) &&
           recv(fd, &reply, 1, 0) == 1 && reply <= 1;
  });
}
#endif

std::string seconds(std::chrono::milliseconds d) { return fmt::format("{:.1f} s", d.count() / 1000.0); }

std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

c10d::ReduceOp reduce_op(Reduce op) {
  switch (op) {
    case Reduce::kMean:
    case Reduce::kSum:
      return c10d::ReduceOp::SUM;
    case Reduce::kMax:
      return c10d::ReduceOp::MAX;
    case Reduce::kMin:
      return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

/// Ignores SIGPIPE until the last holder of the returned token lets go. Gloo writes to its peers
/// with writev, which raises SIGPIPE once a peer has closed its socket; the default action kills
/// this process before Gloo's error (which the caller turns into one naming the peer) is thrown.
/// torch.distributed never meets this because Python ignores SIGPIPE. A handler the program set
/// itself is left alone, and the default comes back only if nobody changed SIGPIPE meanwhile.
std::shared_ptr<const void> ignore_sigpipe() {
  // A count under a lock rather than a weak_ptr: a group made while the last one is being
  // destroyed must not see SIGPIPE ignored "by the program" and then have it restored under it.
  static std::mutex mutex;
  static int64_t holders = 0;
  static bool ignored_here = false;
  const std::lock_guard<std::mutex> lock(mutex);
  if (holders++ == 0) {
    struct sigaction previous {};
    sigaction(SIGPIPE, nullptr, &previous);
    ignored_here = (previous.sa_flags & SA_SIGINFO) == 0 && previous.sa_handler == SIG_DFL;
    if (ignored_here) ::signal(SIGPIPE, SIG_IGN);
  }
  return std::shared_ptr<const void>(new int(0), [](const int* token) {
    delete token;
    const std::lock_guard<std::mutex> lock(mutex);
    if (--holders > 0 || !ignored_here) return;
    struct sigaction now {};
    sigaction(SIGPIPE, nullptr, &now);
    if ((now.sa_flags & SA_SIGINFO) == 0 && now.sa_handler == SIG_IGN) ::signal(SIGPIPE, SIG_DFL);
  });
}

}  // namespace

ProcessGroup::ProcessGroup(const Topology& topology, const ProcessGroupOptions& options)
    : sigpipe_ignored_(ignore_sigpipe()), topology_(topology), options_(options) {
#ifdef USE_C10D_NCCL
  VOLT_CHECK(options_.backend == "gloo" || options_.backend == "nccl",
             "process group backend '{}' is not supported; supported: 'gloo', 'nccl'. HINT: use 'nccl' for CUDA "
             "tensors, 'gloo' for CPU tensors.",
             options_.backend);
#else
  VOLT_CHECK(options_.backend == "gloo",
             "process group backend '{}' is not available in this build; supported: 'gloo'. HINT: NCCL needs a "
             "CUDA build of LibTorch (scripts/build-cuda.sh).",
             options_.backend);
#endif
  const std::string where = fmt::format("{}:{}", topology_.main_address, topology_.main_port);
  const bool launcher_store = topology_.join_launcher_store;
  // Who should be listening there, for messages.
  const std::string server = launcher_store ? "the launcher's store (torchrun's agent)" : "rank 0's rendezvous";
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(topology_.main_port);
  store_options.isServer = topology_.global_rank == 0 && !launcher_store;
  store_options.numWorkers = static_cast<size_t>(topology_.world_size);
  store_options.waitWorkers = false;  // we wait ourselves, to name the ranks that never came
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + options_.join_timeout;
  const auto waited = [start] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  };
  // A reason to stop waiting (a launched sibling died, a stop signal): checked between short waits,
  // so that the wait ends at once instead of after join_timeout.
  const auto check_abort = [&] {
    if (!options_.abort_check) return;
    if (auto reason = options_.abort_check()) {
      throw Error(fmt::format("rank {} on {} stopped waiting for the rendezvous at {} after {}: {}.",
                              topology_.global_rank, topology_.host, where, seconds(waited()), *reason));
    }
  };
  store_options.timeout = options_.join_timeout;
  const auto connect = [&] {
    c10::intrusive_ptr<c10d::Store> tcp = c10::make_intrusive<c10d::TCPStore>(topology_.main_address, store_options);
    // A launcher's store outlives a group that it restarts: each attempt keeps its own keys.
    store_ = tcp;
    if (launcher_store) store_ = c10::make_intrusive<c10d::PrefixStore>(topology_.store_key_prefix, tcp);
    // Announcing is part of joining: under LibTorch 1.13 a client learns only at its first request
    // whether the process that accepted it is a store at all.
    store_->set(kJoinedPrefix + std::to_string(topology_.global_rank), bytes_of(topology_.host));
  };
  if (store_options.isServer) {
    try {
      connect();
    } catch (const std::exception& e) {
      throw Error(
          fmt::format("rank 0 on {} could not open the rendezvous at {}: {}. HINT: another job may use port "
                      "{}; set MASTER_PORT to a free port (under torchrun: --master-port).",
                      topology_.host, where, e.what(), topology_.main_port));
    }
  }
  // The clients first wait until the server's port accepts connections, checking for an abort
  // between short probes: c10d's client would block for its whole timeout, and a client made
  // with a short timeout keeps it for every later request on its socket. Something else may
  // accept there before the store does (another job's Gloo listener on that ephemeral port, or
  // the probe's own socket connected to itself): a failed connection is tried again until the
  // deadline, so that a rank 0 which never came is still named as such.
  const auto never_came = [&](const std::string& not_a_store) {
    // c10d's messages carry a backtrace after their first line.
    const std::string answered = not_a_store.empty()
                                     ? std::string()
                                     : fmt::format(" (something that is not a rendezvous answered there: {})",
                                                   not_a_store.substr(0, not_a_store.find('\n')));
    if (launcher_store) {
      return Error(
          fmt::format("rank {} on {} could not reach {} at {} in {} (join_timeout {}){}. HINT: the launcher set "
                      "TORCHELASTIC_USE_AGENT_STORE=True and MASTER_ADDR/MASTER_PORT; check that its agent is running "
                      "and that MASTER_ADDR is reachable from this host.",
                      topology_.global_rank, topology_.host, server, where, seconds(waited()),
                      seconds(options_.join_timeout), answered));
    }
    return Error(fmt::format(
        "rank {} on {} could not reach rank 0's rendezvous at {} in {} (join_timeout {}): rank 0 never joined "
        "(expected on {}){}. HINT: check rank 0's log for an earlier error, and that MASTER_ADDR is reachable "
        "from this host.",
        topology_.global_rank, topology_.host, where, seconds(waited()), seconds(options_.join_timeout),
        topology_.expected_host(0), answered));
  };
  // What last answered at the port without being a store: still named when the deadline comes
  // while the port does not accept (such a listener may be slow to accept, or gone by then).
  std::string last_answer;
  while (!store_options.isServer) {
    while (!port_accepts(topology_.main_address, topology_.main_port)) {
      check_abort();
      if (std::chrono::steady_clock::now() >= deadline) throw never_came(last_answer);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    try {
#if !VOLT_TORCH_2
      if (!answers_like_a_store(topology_.main_address, topology_.main_port)) {
        throw std::runtime_error("the connection was dropped or a store's CHECK request went unanswered");
      }
#endif
      connect();
      break;
    } catch (const std::exception& e) {
      store_.reset();
      last_answer = e.what();
      check_abort();
      if (std::chrono::steady_clock::now() >= deadline) throw never_came(last_answer);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }

  // Rendezvous with a deadline: every rank has announced itself, and now waits for all the others.
  store_->add(kJoinedCount, 1);
  while (store_->add(kJoinedCount, 0) < topology_.world_size) {
    check_abort();
    if (std::chrono::steady_clock::now() > deadline) {
      std::vector<std::string> missing;
      for (int64_t r = 0; r < topology_.world_size; ++r) {
        if (!store_->check({kJoinedPrefix + std::to_string(r)})) {
          missing.push_back(fmt::format("rank {} (expected on {})", r, topology_.expected_host(r)));
        }
      }
      throw Error(
          fmt::format("rank {} on {}: {} of {} ranks never joined the rendezvous at {} in {} (join_timeout {}): "
                      "{}. HINT: look at those ranks' logs; a rank that crashes before Trainer::fit never joins.",
                      topology_.global_rank, topology_.host, missing.size(), topology_.world_size, where,
                      seconds(waited()), seconds(options_.join_timeout), join(missing, ", ")));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("volt/pg", store_);
  auto gloo_options = gloo_options_for(topology_, options_.timeout);
  const int rank = static_cast<int>(topology_.global_rank);
  const int size = static_cast<int>(topology_.world_size);
#ifdef USE_C10D_NCCL
  if (options_.backend == "nccl") {
    // NCCL for the CUDA tensors (gradient buckets, the start-state broadcast); Gloo stays for
    // the CPU scalars of metrics and stop decisions. NCCL binds to the current CUDA device,
    // which the Trainer set to this rank's before joining.
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = options_.timeout;
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("cuda/", prefixed),
                                                            rank, size, nccl_options);
    group_ = compat::make_process_group(prefixed, rank, size, gloo_options, nccl);
    return;
  }
#endif
  group_ = compat::make_process_group(prefixed, rank, size, gloo_options);
}

ProcessGroup::~ProcessGroup() = default;

c10::intrusive_ptr<c10d::ProcessGroup> ProcessGroup::backend() const { return group_; }

void ProcessGroup::broadcast(std::vector<torch::Tensor> tensors, int64_t root) {
  if (tensors.empty()) return;
  c10d::broadcast_coalesced(group_, tensors, /*buffer_size=*/256 * 1024 * 1024, static_cast<int>(root));
}

void ProcessGroup::all_reduce(torch::Tensor& values, Reduce op) {
  std::vector<torch::Tensor> tensors{values};
  c10d::AllreduceOptions options;
  options.reduceOp = reduce_op(op);
  group_->allreduce(tensors, options)->wait();
  if (op == Reduce::kMean) values.div_(static_cast<double>(topology_.world_size));
}

ReduceWork ProcessGroup::all_reduce_async(double value, Reduce op) {
  torch::Tensor t = torch::tensor({value}, torch::kDouble);
  std::vector<torch::Tensor> tensors{t};
  c10d::AllreduceOptions options;
  options.reduceOp = reduce_op(op);
  auto work = group_->allreduce(tensors, options);
  const double divisor = op == Reduce::kMean ? static_cast<double>(topology_.world_size) : 1.0;
  return ReduceWork([work, t, divisor] {
    work->wait();
    return t.item<double>() / divisor;
  });
}

std::vector<torch::Tensor> ProcessGroup::all_gather(const torch::Tensor& tensor) {
  return all_gather_uneven(tensor, [this](const torch::Tensor& mine) {
    // Equal shapes by now: one flat all-gather, cut back into each rank's tensor.
    const torch::Tensor flat = all_gather_flat(mine);
    const int64_t n = mine.numel();
    std::vector<torch::Tensor> each;
    for (int64_t r = 0; r < topology_.world_size; ++r) each.push_back(flat.narrow(0, r * n, n).view(mine.sizes()));
    return each;
  });
}

torch::Tensor ProcessGroup::reduce_scatter(torch::Tensor values, Reduce op) {
  const int64_t size = topology_.world_size;
  VOLT_CHECK(values.dim() == 1 && values.numel() % size == 0,
             "reduce_scatter needs a flat tensor of world_size x chunk values; got shape {} with world_size {}. "
             "HINT: pad the flat buffer to a multiple of the process count.",
             c10::str(values.sizes()), size);
  const int64_t chunk = values.numel() / size;
  if (values.is_cuda()) {
    std::vector<torch::Tensor> outputs{torch::empty({chunk}, values.options())};
    std::vector<std::vector<torch::Tensor>> inputs(1);
    for (int64_t r = 0; r < size; ++r) inputs[0].push_back(values.narrow(0, r * chunk, chunk));
    c10d::ReduceScatterOptions options;
    options.reduceOp = reduce_op(op);
    group_->reduce_scatter(outputs, inputs, options)->wait();
    if (op == Reduce::kMean) outputs[0].div_(static_cast<double>(size));
    return outputs[0];
  }
  // Gloo (LibTorch 1.13) has no reduce-scatter: the all-reduce gives every rank every chunk.
  all_reduce(values, op);
  return values.narrow(0, topology_.global_rank * chunk, chunk);
}

torch::Tensor ProcessGroup::all_gather_flat(const torch::Tensor& chunk) {
  torch::Tensor flat = torch::empty({topology_.world_size * chunk.numel()}, chunk.options());
  all_gather_into(chunk, flat);
  return flat;
}

void ProcessGroup::all_gather_into(const torch::Tensor& chunk, torch::Tensor& flat) {
  const int64_t size = topology_.world_size;
  const int64_t n = chunk.numel();
  VOLT_CHECK(flat.dim() == 1 && flat.is_contiguous() && flat.numel() == size * n,
             "all_gather_into needs a contiguous flat tensor of world_size x chunk values; got shape {} for chunks of "
             "{} with world_size {}. HINT: allocate world_size * chunk.numel() values.",
             c10::str(flat.sizes()), n, size);
  std::vector<std::vector<torch::Tensor>> outputs(1);
  for (int64_t r = 0; r < size; ++r) outputs[0].push_back(flat.narrow(0, r * n, n));
  torch::Tensor input = chunk.reshape({-1}).contiguous();
  // Gloo copies each input into its output slot: this rank's own slot must not be the input.
  if (n > 0 && input.data_ptr() == outputs[0][topology_.global_rank].data_ptr()) input = input.clone();
  std::vector<torch::Tensor> inputs{input};
  group_->allgather(outputs, inputs)->wait();
}

std::unique_ptr<PeerChannel> ProcessGroup::connect_peer(int64_t peer) {
  const int64_t me = topology_.global_rank;
  VOLT_CHECK(peer >= 0 && peer < topology_.world_size && peer != me,
             "rank {} cannot connect to rank {} of {} processes: a peer is another rank of the run. HINT: pass a rank "
             "in [0, world_size) other than this process's own.",
             me, peer, topology_.world_size);
  const int64_t low = std::min(me, peer);
  const int64_t high = std::max(me, peer);
  // Its own key prefix per pair and connection (both ends count theirs alike): the two rendezvous
  // in the run's store apart from the group's and from an earlier connection's stale addresses.
  const int64_t n = peer_connections_[peer]++;
  auto store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("volt/peer/{}-{}/{}", low, high, n), store_);
  const std::string name = fmt::format("rank {} on {}", peer, topology_.expected_host(peer));
  try {
    auto group = compat::make_process_group(store, me == low ? 0 : 1, 2, gloo_options_for(topology_, options_.timeout));
    return std::make_unique<GlooPeerChannel>(std::move(group), me == low ? 1 : 0, name);
  } catch (const std::exception& e) {
    throw Error(
        fmt::format("rank {} could not connect to {} within {}: {}. HINT: that process exited or hangs; its "
                    "own error says why.",
                    me, name, seconds(options_.timeout), peer_failure_text(e)));
  }
}

std::string ProcessGroup::broadcast_string(const std::string& value) {
  torch::Tensor length = torch::tensor({static_cast<int64_t>(value.size())}, torch::kLong);
  broadcast({length}, 0);
  torch::Tensor bytes = torch::empty({length.item<int64_t>()}, torch::kUInt8);
  if (topology_.global_rank == 0) std::memcpy(bytes.data_ptr<uint8_t>(), value.data(), value.size());
  if (bytes.numel() > 0) broadcast({bytes}, 0);
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(bytes.numel()));
}

void ProcessGroup::report_failure(const std::string& message) noexcept {
  try {
    store_->compareSet(kFailureKey, {}, bytes_of(message));
  } catch (...) {
    // The store lives in rank 0; when it is gone there is nobody left to tell.
  }
}

std::optional<std::string> ProcessGroup::reported_failure() noexcept {
  try {
    if (!store_->check({kFailureKey})) return std::nullopt;
    const std::vector<uint8_t> value = store_->get(kFailureKey);
    return std::string(value.begin(), value.end());
  } catch (...) {
    return std::nullopt;
  }
}

std::optional<std::vector<int64_t>> ProcessGroup::absent_ranks(const std::string& tag,
                                                               std::chrono::milliseconds wait) noexcept {
  const std::string prefix = "volt/present/" + tag + "/";
  try {
    store_->set(prefix + std::to_string(topology_.global_rank), bytes_of("1"));
  } catch (...) {
    return std::nullopt;
  }
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::vector<int64_t> absent;
  for (int64_t r = 0; r < topology_.world_size; ++r) absent.push_back(r);
  try {
    while (!absent.empty()) {
      std::vector<int64_t> still;
      for (const int64_t r : absent) {
        if (!store_->check({prefix + std::to_string(r)})) still.push_back(r);
      }
      absent = still;
      if (absent.empty() || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (...) {
    // Rank 0 left after its own wait ended: what was seen until then is the answer.
  }
  return absent;
}

}  // namespace volt
