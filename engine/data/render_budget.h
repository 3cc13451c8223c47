// A bound on what running untrusted template code may take of the thread that runs it. A model directory's chat
// template is a program; a template that recurses without end, builds a string of terabytes ('x' * 10**12, a string
// doubled forty times) or loops for hours must fail its job with an error, never crash or stall the daemon.
//
// While a RenderBudget lives on a thread, every operator new on that thread (the Jinja engine allocates for each
// value, scope and node it makes) is charged against its bytes, and checks the thread's stack depth and, every few
// thousand allocations, the clock; past a limit it records why and throws std::bad_alloc, which the engine's own
// error handling carries out to the caller as an error. Other threads, and the thread outside the budget's scope,
// only pay a thread-local load per allocation.
#pragma once

#include <cstddef>
#include <string>

namespace slide {

class RenderBudget {
 public:
  struct Limits {
    size_t bytes = size_t{512} << 20;      // live bytes allocated within the scope
    size_t stack_bytes = size_t{2} << 20;  // stack grown below the scope's own frame
    double seconds = 30;
  };
  explicit RenderBudget(const Limits& limits);
  ~RenderBudget();
  RenderBudget(const RenderBudget&) = delete;
  RenderBudget& operator=(const RenderBudget&) = delete;

  // Ends the scope early (the destructor ends it otherwise): once past a limit every allocation in the scope fails,
  // so a caller ends it before building its error.
  void End();

  // Which limit an allocation went past ("" while none): "memory", "stack depth" or "time", with the limit. Call
  // after End().
  std::string exceeded() const;

  struct State;

 private:
  State* state_;
  State* outer_;
  bool ended_ = false;  // a budget already active on this thread (nested scopes keep the innermost)
};

}  // namespace slide
