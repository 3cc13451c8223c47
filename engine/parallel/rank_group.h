// RankGroup: the collectives of a data-parallel job's ranks (docs/multi-gpu.md), over LibTorch's c10d: Gloo for
// host tensors (CPU ranks, the tests), NCCL for device tensors. Every call returns a status: a peer that dies or
// stops answering fails the call after the group's timeout instead of hanging or throwing through the engine.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <string>

#include "engine/common/status.h"

namespace slide {

struct RankGroupOptions {
  enum class Transport { kGloo, kNccl };
  Transport transport = Transport::kGloo;
  int rank = 0;
  int world = 1;
  // Where the ranks meet: "file:PATH" (a FileStore: ranks on one host sharing a directory) or "tcp://HOST:PORT" (a
  // TCPStore: ranks on several hosts, as torchrun's rendezvous).
  std::string rendezvous;
  // With tcp://, whether rank 0 serves the store (torchrun's default) or another process already does.
  bool rank_zero_serves_store = true;
  // Gloo: the address whose interface carries the traffic ("" = the one the host name resolves to).
  std::string gloo_address;
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

class RankGroup {
 public:
  // Joins the group: returns once all `world` ranks have met (or fails after the timeout).
  static StatusOr<std::unique_ptr<RankGroup>> Connect(const RankGroupOptions& options);
  ~RankGroup();
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }

  // In place: every rank's `tensor` becomes the elementwise sum over ranks.
  Status AllReduceSum(at::Tensor& tensor);
  // input [world * n] on every rank -> output [n] on rank r: the sum over ranks of input[r n, (r + 1) n).
  Status ReduceScatterSum(const at::Tensor& input, at::Tensor& output);
  // input [n] on every rank -> output [world * n]: rank r's input at [r n, (r + 1) n).
  Status AllGather(const at::Tensor& input, at::Tensor& output);
  Status Barrier();

 private:
  struct Backend;
  RankGroup(int rank, int world, std::unique_ptr<Backend> backend);
  int rank_, world_;
  std::unique_ptr<Backend> backend_;
};

}  // namespace slide
