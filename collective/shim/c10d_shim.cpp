// The C ABI between flotilla-collective (Rust) and libtorch's c10d: a TCPStore rendezvous, a ProcessGroupGloo
// (or ProcessGroupNCCL when built with FLOTILLA_NCCL), and the handful of collectives a data-parallel learner
// uses. Every entry point catches every C++ exception and returns it as a message: nothing here aborts.
//
// Tensors cross as `at::Tensor*` (what tch's `Tensor::as_mut_ptr` gives). Strings returned through `err` and
// byte buffers returned by flc_store_get are malloc'd; Rust frees them with flc_free_bytes.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef FLOTILLA_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace {

char* copy_message(const std::string& message) {
  char* out = static_cast<char*>(std::malloc(message.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, message.c_str(), message.size() + 1);
  }
  return out;
}

// Runs `body`; on a C++ exception stores its message in *err and returns `failed`.
template <typename T, typename F>
T guarded(char** err, T failed, F body) {
  try {
    return body();
  } catch (const c10::Error& e) {
    // what() of a c10::Error carries a C++ backtrace; the message alone is what the user needs.
    *err = copy_message(e.msg());
  } catch (const std::exception& e) {
    *err = copy_message(e.what());
  } catch (...) {
    *err = copy_message("unknown C++ exception");
  }
  return failed;
}

}  // namespace

struct flc_store {
  c10::intrusive_ptr<c10d::Store> store;
};

struct flc_group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  std::chrono::milliseconds timeout;
};

extern "C" {

void flc_free_bytes(void* p) { std::free(p); }

// Connects to (or, with host != 0, serves) the TCPStore at addr:port and returns a client whose keys live under
// `prefix`. `timeout_ms` bounds the connection and every later blocking get/wait.
flc_store* flc_store_connect(const char* addr, int port, int host, int world, int64_t timeout_ms,
                             const char* prefix, char** err) {
  return guarded<flc_store*>(err, nullptr, [&] {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(port);
    options.isServer = host != 0;
    options.numWorkers = static_cast<std::size_t>(world);
    // The process group's own rendezvous (below) waits for every rank; the server need not.
    options.waitWorkers = false;
    options.timeout = std::chrono::milliseconds(timeout_ms);
    auto tcp = c10::make_intrusive<c10d::TCPStore>(std::string(addr), options);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), tcp);
    return new flc_store{prefixed};
  });
}

// A second connection to the same store (for a thread of its own: one client is not shared between threads).
flc_store* flc_store_clone(flc_store* s, char** err) {
  return guarded<flc_store*>(err, nullptr, [&] { return new flc_store{s->store->clone()}; });
}

void flc_store_free(flc_store* s) { delete s; }

int flc_store_set(flc_store* s, const char* key, const uint8_t* data, size_t len, char** err) {
  return guarded<int>(err, -1, [&] {
    s->store->set(std::string(key), std::vector<uint8_t>(data, data + len));
    return 0;
  });
}

// Waits up to timeout_ms for `key`, then returns its value (malloc'd) in *data / *len.
int flc_store_get(flc_store* s, const char* key, int64_t timeout_ms, uint8_t** data, size_t* len, char** err) {
  return guarded<int>(err, -1, [&] {
    std::string k(key);
    s->store->wait({k}, std::chrono::milliseconds(timeout_ms));
    std::vector<uint8_t> value = s->store->get(k);
    *len = value.size();
    *data = static_cast<uint8_t*>(std::malloc(value.size() == 0 ? 1 : value.size()));
    if (*data == nullptr) {
      throw std::runtime_error("out of memory copying a store value");
    }
    if (!value.empty()) {
      std::memcpy(*data, value.data(), value.size());
    }
    return 0;
  });
}

// Adds `delta` to the integer at `key` (0 when absent) and returns the sum through *out.
int flc_store_add(flc_store* s, const char* key, int64_t delta, int64_t* out, char** err) {
  return guarded<int>(err, -1, [&] {
    *out = s->store->add(std::string(key), delta);
    return 0;
  });
}

// Creates the process group over `store` (which it shares; the store handle stays the caller's). backend 0:
// Gloo, binding its transport to the interface `ifname` if non-empty, else to the address `hostname` if
// non-empty, else to the address this machine's hostname resolves to. backend 1: NCCL on CUDA device
// `cuda_device`. `timeout_ms` bounds every collective.
flc_group* flc_group_new(flc_store* s, int rank, int world, int backend, const char* ifname, const char* hostname,
                         int cuda_device, int64_t timeout_ms, char** err) {
  return guarded<flc_group*>(err, nullptr, [&]() -> flc_group* {
    auto timeout = std::chrono::milliseconds(timeout_ms);
    if (backend == 0) {
      auto options = c10d::ProcessGroupGloo::Options::create(timeout);
      std::string iface(ifname), host(hostname);
      if (!iface.empty()) {
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(iface));
      } else if (!host.empty()) {
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
      } else {
        options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(s->store, rank, world, options);
      return new flc_group{s->store, group, timeout};
    }
#ifdef FLOTILLA_NCCL
    if (backend == 1) {
      (void)cuda_device;
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout;
      auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(s->store, rank, world, options);
      return new flc_group{s->store, group, timeout};
    }
    throw std::runtime_error("unknown backend " + std::to_string(backend));
#else
    (void)cuda_device;
    if (backend == 1) {
      throw std::runtime_error(
          "this build has no NCCL: build with the CUDA libtorch (FLOTILLA_CUDA=1 bash scripts/setup.sh) on a "
          "machine with CUDA");
    }
    throw std::runtime_error("unknown backend " + std::to_string(backend));
#endif
  });
}

void flc_group_free(flc_group* g) { delete g; }

// Whether this build can create NCCL groups.
int flc_has_nccl() {
#ifdef FLOTILLA_NCCL
  return 1;
#else
  return 0;
#endif
}

// In-place sum of `tensor` over all ranks.
int flc_all_reduce_sum(flc_group* g, at::Tensor* tensor, char** err) {
  return guarded<int>(err, -1, [&] {
    std::vector<at::Tensor> tensors{*tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    options.timeout = g->timeout;
    g->backend->allreduce(tensors, options)->wait();
    return 0;
  });
}

// In place: every rank's `tensor` becomes rank `root`'s.
int flc_broadcast(flc_group* g, at::Tensor* tensor, int root, char** err) {
  return guarded<int>(err, -1, [&] {
    std::vector<at::Tensor> tensors{*tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    options.timeout = g->timeout;
    g->backend->broadcast(tensors, options)->wait();
    return 0;
  });
}

// `output` ([world, *input.shape], contiguous) receives every rank's `input`, in rank order.
int flc_all_gather(flc_group* g, at::Tensor* output, at::Tensor* input, char** err) {
  return guarded<int>(err, -1, [&] {
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int64_t i = 0; i < output->size(0); ++i) {
      outputs[0].push_back(output->select(0, i));
    }
    std::vector<at::Tensor> inputs{*input};
    c10d::AllgatherOptions options;
    options.timeout = g->timeout;
    g->backend->allgather(outputs, inputs, options)->wait();
    return 0;
  });
}

int flc_barrier(flc_group* g, char** err) {
  return guarded<int>(err, -1, [&] {
    c10d::BarrierOptions options;
    options.timeout = g->timeout;
    g->backend->barrier(options)->wait();
    return 0;
  });
}

}  // extern "C"
