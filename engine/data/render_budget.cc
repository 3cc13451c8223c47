#include "engine/data/render_budget.h"

#include <malloc.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <new>

namespace slide {

struct RenderBudget::State {
  Limits limits;
  size_t bytes = 0;         // charged so far
  uintptr_t stack_top = 0;  // the scope's frame
  std::chrono::steady_clock::time_point deadline;
  unsigned allocations = 0;
  const char* exceeded = nullptr;
};

namespace {

thread_local RenderBudget::State* active = nullptr;

uintptr_t StackPosition() { return reinterpret_cast<uintptr_t>(__builtin_frame_address(0)); }

// Charges `n` bytes to the thread's budget, or refuses them (noting why) by returning false.
bool Charge(RenderBudget::State* s, size_t n) {
  // While an exception unwinds, destructors may allocate (nlohmann's does) and must not throw: charged, not refused.
  if (std::uncaught_exceptions() > 0) {
    s->bytes += n;
    return true;
  }
  if (s->exceeded != nullptr) return false;  // once past, every allocation in the scope fails
  const uintptr_t here = StackPosition();
  if (s->stack_top > here && s->stack_top - here > s->limits.stack_bytes) {
    s->exceeded = "stack depth";
  } else if (s->bytes >= s->limits.bytes || n > s->limits.bytes - s->bytes) {
    s->exceeded = "memory";
  } else if ((++s->allocations & 4095) == 0 && std::chrono::steady_clock::now() > s->deadline) {
    s->exceeded = "time";
  }
  if (s->exceeded != nullptr) return false;
  s->bytes += n;
  return true;
}

void* Allocate(size_t n, size_t alignment, bool nothrow) {
  if (n == 0) n = 1;
  if (n > SIZE_MAX - alignment) {  // no size rounds up to that
    if (nothrow) return nullptr;
    throw std::bad_alloc();
  }
  RenderBudget::State* s = active;
  // Refused before malloc sees it: a template's 'x' * 10**10 must not reserve the bytes even for a moment.
  if (s != nullptr && !Charge(s, n)) {
    if (nothrow) return nullptr;
    throw std::bad_alloc();
  }
  void* p = alignment <= alignof(std::max_align_t)
                ? std::malloc(n)
                : std::aligned_alloc(alignment, (n + alignment - 1) / alignment * alignment);
  if (s != nullptr) {
    if (p == nullptr)
      s->bytes -= n;
    else
      s->bytes += malloc_usable_size(p) - n;  // charged as Release refunds: the block's usable size
  }
  if (p == nullptr && !nothrow) throw std::bad_alloc();
  return p;
}

void Release(void* p) {
  if (p == nullptr) return;
  if (RenderBudget::State* s = active) {
    const size_t n = malloc_usable_size(p);
    s->bytes = n > s->bytes ? 0 : s->bytes - n;  // memory from before the scope refunds nothing it was not charged
  }
  std::free(p);
}

}  // namespace

RenderBudget::RenderBudget(const Limits& limits) : state_(new State), outer_(active) {
  state_->limits = limits;
  state_->stack_top = StackPosition();
  state_->deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                            std::chrono::duration<double>(limits.seconds));
  active = state_;
}

void RenderBudget::End() {
  if (ended_) return;
  ended_ = true;
  active = outer_;
}

RenderBudget::~RenderBudget() {
  End();
  delete state_;
}

std::string RenderBudget::exceeded() const {
  if (state_->exceeded == nullptr) return "";
  const std::string what = state_->exceeded;
  if (what == "memory") return "memory (" + std::to_string(state_->limits.bytes >> 20) + " MiB)";
  if (what == "stack depth") return "stack depth (" + std::to_string(state_->limits.stack_bytes >> 10) + " KiB)";
  return "time (" + std::to_string(static_cast<int>(state_->limits.seconds)) + " s)";
}

}  // namespace slide

// The replaceable global allocation functions, all through Allocate/Release so that a budget sees every one.
void* operator new(size_t n) { return slide::Allocate(n, 0, false); }
void* operator new[](size_t n) { return slide::Allocate(n, 0, false); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return slide::Allocate(n, 0, true); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return slide::Allocate(n, 0, true); }
void* operator new(size_t n, std::align_val_t a) { return slide::Allocate(n, static_cast<size_t>(a), false); }
void* operator new[](size_t n, std::align_val_t a) { return slide::Allocate(n, static_cast<size_t>(a), false); }
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return slide::Allocate(n, static_cast<size_t>(a), true);
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return slide::Allocate(n, static_cast<size_t>(a), true);
}
void operator delete(void* p) noexcept { slide::Release(p); }
void operator delete[](void* p) noexcept { slide::Release(p); }
void operator delete(void* p, size_t) noexcept { slide::Release(p); }
void operator delete[](void* p, size_t) noexcept { slide::Release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { slide::Release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { slide::Release(p); }
void operator delete(void* p, std::align_val_t) noexcept { slide::Release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { slide::Release(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { slide::Release(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { slide::Release(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { slide::Release(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { slide::Release(p); }
