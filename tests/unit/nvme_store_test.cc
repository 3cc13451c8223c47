// The NVMe tier's store: round trips at odd sizes through io_uring and pread/pwrite, over one or two
// directories; the automatic fallback when a seccomp filter refuses io_uring (as Docker's default profile
// does); a disk that cannot hold the tier (RLIMIT_FSIZE) fails Open naming the directory; a file cut short
// behind the store's back is a DATA_LOSS naming it; misaligned buffers and bad options are refused.
#include "engine/io/nvme_store.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tests/support/scratch_dir.h"

namespace slide {
namespace {

// Writes random bytes to every unit, reads them back into cleared buffers and compares each unit's bytes.
void RoundTrip(NvmeStore& store, const std::vector<size_t>& sizes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<AlignedBuffer> bufs;
  std::vector<std::vector<unsigned char>> want;
  for (size_t u = 0; u < sizes.size(); ++u) {
    bufs.emplace_back(store.PaddedBytes(u), 4096);
    want.emplace_back(sizes[u]);
    for (auto& b : want.back()) b = static_cast<unsigned char>(rng());
    if (sizes[u] > 0) std::memcpy(bufs.back().data(), want.back().data(), sizes[u]);  // empty: null pointers
  }
  std::vector<std::future<Status>> writes;
  for (size_t u = 0; u < sizes.size(); ++u) writes.push_back(store.Write(u, bufs[u].data()));
  for (auto& f : writes) ASSERT_TRUE(f.get().ok());
  for (auto& b : bufs)  // poison: every byte must come back from disk
    if (b.size() > 0) std::memset(b.data(), 0xA5, b.size());
  std::vector<std::future<Status>> reads;
  for (size_t u = 0; u < sizes.size(); ++u) reads.push_back(store.Read(u, bufs[u].data()));
  for (size_t u = 0; u < sizes.size(); ++u) {
    Status st = reads[u].get();
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(sizes[u] == 0 ? 0 : std::memcmp(bufs[u].data(), want[u].data(), sizes[u]), 0)
        << "unit " << u << " of " << sizes[u] << " bytes";
  }
}

TEST(NvmeStore, RoundTripsAtOddSizesOnEveryBackendAndTwoDisks) {
  const std::vector<size_t> sizes = {1, 4095, 4097, (1u << 20) + 13, 3 * (1u << 20) + 1, 0, 8192};
  for (const std::string& backend : Backends()) {
    ScratchDir a, b;
    NvmeOptions o;
    o.dirs = {a.path(), b.path()};
    o.backend = backend;
    o.request_bytes = 256 << 10;  // several requests per unit, some units smaller than one
    o.queue_depth = 4;
    auto store = NvmeStore::Open(o, sizes);
    ASSERT_TRUE(store.ok()) << backend << ": " << store.status().ToString();
    EXPECT_NE((*store)->description().find(backend == "pread" ? "pread/pwrite" : "io_uring"), std::string::npos)
        << (*store)->description();
    EXPECT_EQ(a.Files().size(), 4u);  // units 0, 2, 4, 6 on the first directory
    EXPECT_EQ(b.Files().size(), 3u);
    RoundTrip(**store, sizes, 7);
    size_t padded = 0;
    for (size_t u = 0; u < sizes.size(); ++u) padded += (*store)->PaddedBytes(u);
    EXPECT_EQ((*store)->bytes_written(), static_cast<int64_t>(padded));
    EXPECT_EQ((*store)->bytes_read(), static_cast<int64_t>(padded));
    RoundTrip(**store, sizes, 8);  // overwrite in place
    store.value().reset();
    EXPECT_TRUE(a.Files().empty()) << "the store removes its files";
  }
}

TEST(NvmeStore, RegisteredBuffersRoundTrip) {
  if (!IoUringCompiledIn()) GTEST_SKIP() << "built without liburing";
  ScratchDir dir;
  NvmeOptions o;
  o.dirs = {dir.path()};
  o.backend = "io_uring";
  AlignedBuffer arena(3 << 20, 4096);  // registered: fixed-buffer reads and writes
  auto store = NvmeStore::Open(o, {1 << 20, 1 << 20}, {{arena.data(), arena.size()}});
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::memset(arena.data(), 0x3c, 1 << 20);
  ASSERT_TRUE((*store)->Write(0, arena.data()).get().ok());
  char* second = static_cast<char*>(arena.data()) + (1 << 20);
  ASSERT_TRUE((*store)->Read(0, second).get().ok());
  EXPECT_EQ(std::memcmp(arena.data(), second, 1 << 20), 0);
  EXPECT_NE((*store)->description().find("io_uring"), std::string::npos) << (*store)->description();
}

// Runs `body` in a child process; its exit code and what it wrote to the pipe.
std::pair<int, std::string> InChild(const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return {-1, "pipe failed"};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const std::string out = body();
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(NvmeStore, FallsBackToPreadWhenSeccompRefusesIoUring) {
  if (!IoUringCompiledIn()) GTEST_SKIP() << "built without liburing";
  ScratchDir dir;
  auto [code, out] = InChild([&] {
    // What Docker >= 25's default profile does: io_uring_setup fails with EPERM.
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog = {static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
      return std::string("cannot install the seccomp filter");
    NvmeOptions o;
    o.dirs = {dir.path()};
    NvmeOptions strict = o;
    strict.backend = "io_uring";
    auto refused = NvmeStore::Open(strict, {4096});
    o.backend = "auto";
    auto store = NvmeStore::Open(o, {4097, 12345});
    if (!store.ok()) return "auto failed: " + store.status().ToString();
    AlignedBuffer a((*store)->PaddedBytes(0), 4096), b((*store)->PaddedBytes(0), 4096);
    std::memset(a.data(), 0x5a, a.size());
    const Status written = (*store)->Write(0, a.data()).get();
    const Status read = (*store)->Read(0, b.data()).get();
    if (!written.ok() || !read.ok() || std::memcmp(a.data(), b.data(), a.size()) != 0)
      return "round trip failed: " + written.ToString() + " / " + read.ToString();
    return (*store)->description() + "|" + (refused.ok() ? "io_uring forced: opened" : refused.status().ToString());
  });
  EXPECT_EQ(code, 0);
  EXPECT_NE(out.find("pread/pwrite"), std::string::npos) << out;
  EXPECT_NE(out.find("io_uring unavailable (io_uring_setup: Operation not permitted)"), std::string::npos) << out;
  EXPECT_NE(out.find("NVMe backend io_uring: io_uring_setup: Operation not permitted"), std::string::npos) << out;
}

TEST(NvmeStore, ADiskThatCannotHoldTheTierFailsOpenNamingTheDirectory) {
  for (const std::string& backend : Backends()) {
    ScratchDir dir;
    auto [code, out] = InChild([&] {
      std::signal(SIGXFSZ, SIG_IGN);  // past RLIMIT_FSIZE writes fail with EFBIG instead of killing the process
      rlimit limit{256 << 10, 256 << 10};
      ::setrlimit(RLIMIT_FSIZE, &limit);
      NvmeOptions o;
      o.dirs = {dir.path()};
      o.backend = backend;
      auto store = NvmeStore::Open(o, {100 << 10, 1 << 20});
      return store.ok() ? std::string("opened") : store.status().ToString();
    });
    EXPECT_EQ(code, 0);
    EXPECT_NE(out.find("RESOURCE_EXHAUSTED"), std::string::npos) << out;
    EXPECT_NE(out.find(dir.path() + ": cannot reserve 1048576 bytes for unit 1"), std::string::npos) << out;
  }
}

TEST(NvmeStore, AFileCutShortIsDataLossNamingIt) {
  for (const std::string& backend : Backends())
    for (const off_t cut : {off_t{20480}, off_t{20000}}) {  // at a block boundary, and inside a block (O_DIRECT)
      ScratchDir dir;
      NvmeOptions o;
      o.dirs = {dir.path()};
      o.backend = backend;
      auto store = NvmeStore::Open(o, {64 << 10});
      ASSERT_TRUE(store.ok()) << store.status().ToString();
      const std::vector<std::string> files = dir.Files();
      ASSERT_EQ(files.size(), 1u);
      ASSERT_EQ(::truncate(files[0].c_str(), cut), 0);
      AlignedBuffer buf((*store)->PaddedBytes(0), 4096);
      Status st = (*store)->Read(0, buf.data()).get();
      EXPECT_EQ(st.code(), StatusCode::kDataLoss) << backend << ": " << st.ToString();
      EXPECT_NE(st.message().find(files[0] + " at offset " + std::to_string(cut) +
                                  ": read reached the end of the file with " + std::to_string((64 << 10) - cut) +
                                  " bytes left"),
                std::string::npos)
          << st.ToString();
    }
}

// tmpfs refused O_DIRECT before Linux 6.6 (the store then runs buffered and says so in its description); either
// way the tier works there.
TEST(NvmeStore, ATmpfsDirectoryWorks) {
  if (::access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no writable /dev/shm";
  char tmpl[] = "/dev/shm/slide-nvme-XXXXXX";
  const std::string shm = ::mkdtemp(tmpl);
  {
    NvmeOptions o;
    o.dirs = {shm};
    auto store = NvmeStore::Open(o, {5000, 70000});
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    RoundTrip(**store, {5000, 70000}, 11);
  }
  ::rmdir(shm.c_str());
}

TEST(NvmeStore, MisalignedBuffersAndBadOptionsAreRefused) {
  ScratchDir dir;
  NvmeOptions o;
  o.dirs = {dir.path()};
  auto store = NvmeStore::Open(o, {8192});
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  AlignedBuffer buf(3 * 4096, 4096);
  Status st = (*store)->Write(0, static_cast<char*>(buf.data()) + 512).get();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("not 4096-byte aligned"), std::string::npos) << st.ToString();
  EXPECT_EQ((*store)->Read(9, buf.data()).get().code(), StatusCode::kInvalidArgument);

  NvmeOptions bad = o;
  bad.block_bytes = 3000;
  EXPECT_EQ(NvmeStore::Open(bad, {1}).status().code(), StatusCode::kInvalidArgument);
  bad = o;
  bad.backend = "aio";
  EXPECT_NE(NvmeStore::Open(bad, {1}).status().message().find("must be auto, io_uring or pread"), std::string::npos);
  bad = o;
  bad.dirs = {"/nonexistent/nvme"};
  auto missing = NvmeStore::Open(bad, {1});
  EXPECT_EQ(missing.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find("/nonexistent/nvme/slide-unit-00000"), std::string::npos);
}

}  // namespace
}  // namespace slide
