// Throughput of the NVMe tier's store against the disk: writes then reads GB gigabytes in units of UNIT_MIB
// (a layer's moments, say), all units in flight, through the chosen backend. Compare with dd (O_DIRECT):
//   bench/run_gpu.sh nvme   runs both on the GPU box's disk.
// Usage: nvme_bench DIR GB [BACKEND=auto] [UNIT_MIB=256] [IO_THREADS=2] [QUEUE_DEPTH=32] [REQUEST_KIB=1024]
// Prints one JSON line.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/io/nvme_store.h"

using namespace slide;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: nvme_bench DIR GB [BACKEND] [UNIT_MIB] [IO_THREADS] [QUEUE_DEPTH] [REQUEST_KIB]\n");
    return 2;
  }
  NvmeOptions o;
  o.dirs = {argv[1]};
  const double gb = std::atof(argv[2]);
  o.backend = argc > 3 ? argv[3] : "auto";
  const size_t unit = (argc > 4 ? std::atol(argv[4]) : 256) << 20;
  o.io_threads = argc > 5 ? std::atoi(argv[5]) : 2;
  o.queue_depth = argc > 6 ? static_cast<unsigned>(std::atoi(argv[6])) : 32;
  o.request_bytes = (argc > 7 ? std::atol(argv[7]) : 1024) << 10;
  const size_t units = std::max<size_t>(1, static_cast<size_t>(gb * 1e9 / unit));
  // Two buffers, reused by every unit, like the tier's read-ahead/write-behind pair.
  std::vector<AlignedBuffer> bufs;
  for (int i = 0; i < 2; ++i) {
    bufs.emplace_back(unit, 4096);
    std::memset(bufs.back().data(), 0x5a + i, unit);
  }
  std::vector<iovec> reg;
  for (auto& b : bufs) reg.push_back({b.data(), b.size()});
  auto store = NvmeStore::Open(o, std::vector<size_t>(units, unit), reg);
  if (!store.ok()) {
    std::fprintf(stderr, "nvme_bench: %s\n", store.status().ToString().c_str());
    return 1;
  }
  auto timed = [&](bool write) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::future<Status>> pending;
    for (size_t u = 0; u < units; ++u)
      pending.push_back(write ? (*store)->Write(u, bufs[u % 2].data()) : (*store)->Read(u, bufs[u % 2].data()));
    for (auto& f : pending) {
      Status st = f.get();
      if (!st.ok()) {
        std::fprintf(stderr, "nvme_bench: %s\n", st.ToString().c_str());
        std::exit(1);
      }
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double w = timed(true);
  for (int i = 0; i < 2; ++i) std::memset(bufs[i].data(), 0, unit);
  const double r = timed(false);
  // Units of the same parity were written from the same buffer: what came back must be that pattern.
  for (int i = 0; i < 2 && static_cast<size_t>(i) < units; ++i) {
    const auto* p = static_cast<const unsigned char*>(bufs[i].data());
    for (size_t k = 0; k < unit; ++k)
      if (p[k] != static_cast<unsigned char>(0x5a + i)) {
        std::fprintf(stderr, "nvme_bench: read back wrong data in buffer %d at byte %zu\n", i, k);
        return 1;
      }
  }
  const double bytes = static_cast<double>(units) * static_cast<double>(unit);
  std::printf(
      "{\"bench\": \"nvme_store\", \"dir\": \"%s\", \"backend\": \"%s\", \"gb\": %.2f, \"unit_mib\": %zu, "
      "\"io_threads\": %d, \"queue_depth\": %u, \"request_kib\": %zu, \"write_gb_s\": %.3f, \"read_gb_s\": %.3f, "
      "\"note\": \"all units posted at once; reads after writes; O_DIRECT unless the description says buffered\"}\n",
      argv[1], (*store)->description().c_str(), bytes / 1e9, unit >> 20, o.io_threads, o.queue_depth,
      o.request_bytes >> 10, bytes / w / 1e9, bytes / r / 1e9);
  return 0;
}
