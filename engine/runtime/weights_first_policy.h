#pragma once

#include <cstdint>
#include <optional>

namespace slide {

// The automatic weights-first choice (WeightsFirst::kAuto), made by measured step times rather than by a cost
// model: which schedule wins depends on the box's memory bandwidth, its cores and the device's pace, and the
// constant-ratio rule it replaces said off at 8B batch 32 on an H100 box, where weights first ran 16% faster.
//
// It measures the whole update first; it then tries weights first when the measured CPU update could fit both
// passes in the step, keeps whichever schedule gave the lower step time per second of device compute, and tries
// the other again every `reprobe_steps` steps (the job's pace can change: other load on the host, a new length).
// A step is counted for a schedule only when the step before it ran the same schedule: the updates of a switch
// step spill into the next one.
class WeightsFirstPolicy {
 public:
  struct Options {
    double both_passes_cost = 1.55;  // CPU time of both passes / the whole update's (bytes: 16 + 30 of 30)
    int64_t reprobe_steps = 200;     // steps on the better schedule before the other is measured again
    double smoothing = 0.5;          // weight of a new sample in a schedule's running cost
  };
  struct Sample {
    double step_s = 0;               // the step's wall time
    double compute_s = 0;            // its device compute time (> 0, else the sample is ignored)
    double cpu_update_s = 0;         // CPU time of the updates that ran during it
    bool ran_updates = false;        // it ran the updates the step before posted (false for the first step)
    bool ran_weights_first = false;  // and those went weights first
  };

  WeightsFirstPolicy() : WeightsFirstPolicy(Options{}) {}
  explicit WeightsFirstPolicy(Options options) : options_(options) {}

  void Record(const Sample& s);  // after each step
  bool Choose();                 // at a step's start: do the updates it posts go weights first?

  // Both schedules measured, or weights first ruled out by the whole update's CPU time: what follows is the chosen
  // schedule (until a reprobe). A benchmark warms up until then, as a job is past it after its first steps.
  bool Settled() const { return cost_[0].has_value() && (cost_[1].has_value() || !MayWin()); }

  // Step time per second of device compute by schedule (0: whole update, 1: weights first), once measured.
  std::optional<double> cost(bool weights_first) const { return cost_[weights_first]; }

 private:
  bool MayWin() const;  // the last whole-update step's CPU update, doubled up as both passes, fits its step

  Options options_;
  std::optional<double> cost_[2];
  int64_t measured_at_[2] = {0, 0};  // the step count at each schedule's last counted sample
  int64_t steps_ = 0;
  std::optional<bool> last_ran_;  // the schedule of the last step's updates (unset: none ran)
  double whole_step_s_ = 0, whole_cpu_update_s_ = 0;
};

}  // namespace slide
