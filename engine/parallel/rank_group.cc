#include "engine/parallel/rank_group.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // its Gloo names: engine/parallel/gloo_names
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if SLIDE_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <exception>
#include <utility>
#include <vector>

namespace slide {

struct RankGroup::Backend {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> group;
  std::chrono::milliseconds timeout;
};

namespace {

// Starts a collective (`start` returns its c10d work) and waits for it: what it throws, a peer that died or timed
// out, is the environment's failure, not a bug.
template <typename Start>
Status RunCollective(const char* what, std::chrono::milliseconds timeout, Start&& start) {
  try {
    start()->wait(timeout);
  } catch (const std::exception& e) {
    return Status(StatusCode::kUnavailable, std::string("rank group: ") + what + " failed: " + e.what());
  }
  return Status::Ok();
}

Status SizeMismatch(const char* what, int64_t input, int64_t output, int world) {
  return Internal(std::string("rank group: ") + what + " of " + std::to_string(input) + " elements into " +
                  std::to_string(output) + " with " + std::to_string(world) + " ranks");
}

StatusOr<c10::intrusive_ptr<c10d::Store>> OpenStore(const RankGroupOptions& o) {
  const std::string file = "file:", tcp = "tcp://";
  if (o.rendezvous.rfind(file, 0) == 0 && o.rendezvous.size() > file.size()) {
    return c10::intrusive_ptr<c10d::Store>(
        c10::make_intrusive<c10d::FileStore>(o.rendezvous.substr(file.size()), o.world));
  }
  if (o.rendezvous.rfind(tcp, 0) == 0) {
    const std::string where = o.rendezvous.substr(tcp.size());
    const size_t colon = where.rfind(':');
    int port = -1;
    if (colon != std::string::npos && colon > 0) {
      try {
        size_t used = 0;
        port = std::stoi(where.substr(colon + 1), &used);
        if (used != where.size() - colon - 1) port = -1;
      } catch (const std::exception&) {
        port = -1;
      }
    }
    if (port < 1 || port > 65535)
      return InvalidArgument("rank group: rendezvous " + o.rendezvous + " is not tcp://HOST:PORT");
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(port);
    store_options.isServer = o.rank == 0 && o.rank_zero_serves_store;
    store_options.numWorkers = o.world;
    store_options.timeout = o.timeout;
    return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::TCPStore>(where.substr(0, colon), store_options));
  }
  return InvalidArgument("rank group: rendezvous '" + o.rendezvous + "' is neither file:PATH nor tcp://HOST:PORT");
}

}  // namespace

RankGroup::RankGroup(int rank, int world, std::unique_ptr<Backend> backend)
    : rank_(rank), world_(world), backend_(std::move(backend)) {}

RankGroup::~RankGroup() = default;

StatusOr<std::unique_ptr<RankGroup>> RankGroup::Connect(const RankGroupOptions& options) {
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    return InvalidArgument("rank group: rank " + std::to_string(options.rank) + " of world " +
                           std::to_string(options.world));
  }
#if !SLIDE_HAVE_NCCL
  if (options.transport == RankGroupOptions::Transport::kNccl) {
    return Status(StatusCode::kUnavailable, "rank group: this build has no NCCL (a CUDA build finds the wheel's)");
  }
#endif
  auto backend = std::make_unique<Backend>();
  backend->timeout = options.timeout;
  try {
    auto store = OpenStore(options);
    if (!store.ok()) return store.status();
    backend->store = *store;
#if SLIDE_HAVE_NCCL
    if (options.transport == RankGroupOptions::Transport::kNccl) {
      // The device is the tensors' (each rank's thread or process works on its own GPU).
      auto nccl = c10d::ProcessGroupNCCL::Options::create();
      nccl->timeout = options.timeout;
      backend->group = c10::make_intrusive<c10d::ProcessGroupNCCL>(backend->store, options.rank, options.world, nccl);
      return std::unique_ptr<RankGroup>(new RankGroup(options.rank, options.world, std::move(backend)));
    }
#endif
    auto gloo = c10d::ProcessGroupGloo::Options::create(options.timeout);
    gloo->devices.push_back(options.gloo_address.empty()
                                ? c10d::ProcessGroupGloo::createDefaultDevice()
                                : c10d::ProcessGroupGloo::createDeviceForHostname(options.gloo_address));
    backend->group = c10::make_intrusive<c10d::ProcessGroupGloo>(backend->store, options.rank, options.world, gloo);
  } catch (const std::exception& e) {
    return Status(StatusCode::kUnavailable, "rank group: rank " + std::to_string(options.rank) + " of " +
                                                std::to_string(options.world) + " could not join at " +
                                                options.rendezvous + ": " + e.what());
  }
  return std::unique_ptr<RankGroup>(new RankGroup(options.rank, options.world, std::move(backend)));
}

Status RankGroup::AllReduceSum(at::Tensor& tensor) {
  std::vector<at::Tensor> tensors{tensor};
  return RunCollective("all-reduce", backend_->timeout, [&] { return backend_->group->allreduce(tensors); });
}

// c10d takes the inputs below by non-const reference and does not write them: hence the copies of the handle.
Status RankGroup::ReduceScatterSum(const at::Tensor& input, at::Tensor& output) {
  if (input.numel() != output.numel() * world_) {
    return SizeMismatch("reduce-scatter", input.numel(), output.numel(), world_);
  }
  at::Tensor in = input;
  return RunCollective("reduce-scatter", backend_->timeout,
                       [&] { return backend_->group->_reduce_scatter_base(output, in); });
}

Status RankGroup::AllGather(const at::Tensor& input, at::Tensor& output) {
  if (output.numel() != input.numel() * world_) {
    return SizeMismatch("all-gather", input.numel(), output.numel(), world_);
  }
  at::Tensor in = input;
  return RunCollective("all-gather", backend_->timeout, [&] { return backend_->group->_allgather_base(output, in); });
}

Status RankGroup::Barrier() {
  return RunCollective("barrier", backend_->timeout, [&] { return backend_->group->barrier(); });
}

}  // namespace slide
