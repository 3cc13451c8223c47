// The automatic weights-first choice: it measures the whole update, tries weights first only where the CPU could
// fit both passes, keeps the faster schedule per second of device compute, discards the step after a switch, and
// measures the other schedule again after reprobe_steps.
#include "engine/runtime/weights_first_policy.h"

#include <gtest/gtest.h>

namespace slide {
namespace {

// A job whose steps take `whole_s` with the whole update and `first_s` with weights first (1 s of compute each);
// the step after a switch takes `switch_s`. Runs `steps` steps; returns the schedule of each step that ran updates.
struct Job {
  double whole_s = 1.3, first_s = 1.1, switch_s = 2.0, cpu_update_s = 0.6;
};

std::vector<bool> RunJob(WeightsFirstPolicy& policy, const Job& job, int steps) {
  std::vector<bool> ran;
  bool ran_updates = false, posted_first = false, previous = false;
  for (int i = 0; i < steps; ++i) {
    const bool this_first = posted_first;
    const bool switched = ran_updates && !ran.empty() && this_first != previous;
    WeightsFirstPolicy::Sample s;
    s.step_s = switched ? job.switch_s : this_first ? job.first_s : job.whole_s;
    s.compute_s = 1.0;
    s.cpu_update_s = job.cpu_update_s;
    s.ran_updates = ran_updates;
    s.ran_weights_first = this_first;
    if (ran_updates) ran.push_back(this_first);
    previous = this_first;
    policy.Record(s);
    posted_first = policy.Choose();
    ran_updates = true;
  }
  return ran;
}

TEST(WeightsFirstPolicy, MeasuresTheWholeUpdateFirstThenKeepsTheFasterSchedule) {
  WeightsFirstPolicy policy;
  const std::vector<bool> ran = RunJob(policy, Job{}, 20);
  ASSERT_EQ(ran.size(), 19u);
  EXPECT_FALSE(ran[0]);  // the first updates go whole: nothing measured yet
  ASSERT_TRUE(policy.cost(false).has_value());
  ASSERT_TRUE(policy.cost(true).has_value());
  EXPECT_DOUBLE_EQ(*policy.cost(false), 1.3);
  EXPECT_DOUBLE_EQ(*policy.cost(true), 1.1);  // the switch step (2.0 s) was not counted
  for (size_t i = 8; i < ran.size(); ++i) EXPECT_TRUE(ran[i]) << "step " << i;
}

// Settled once both schedules were measured (or weights first was ruled out), not before: the step after the switch
// to weights first is discarded, so it takes a clean weights-first step.
TEST(WeightsFirstPolicy, SettlesOnceBothSchedulesAreMeasured) {
  int settled_at = -1;
  for (int n = 1; n <= 20 && settled_at < 0; ++n) {
    WeightsFirstPolicy policy;
    RunJob(policy, Job{}, n);
    if (policy.Settled()) settled_at = n;
  }
  // The first step runs no updates, the second's are not clean, the third measures the whole update, the fourth runs
  // the switch, the fifth measures weights first.
  EXPECT_EQ(settled_at, 5);
  WeightsFirstPolicy policy;
  RunJob(policy, Job{}, settled_at);
  EXPECT_TRUE(policy.cost(false).has_value());
  EXPECT_TRUE(policy.cost(true).has_value());
  WeightsFirstPolicy whole_only;  // the CPU update could not fit both passes in the step
  Job slow_cpu;
  slow_cpu.cpu_update_s = 1.0;
  RunJob(whole_only, slow_cpu, 3);
  EXPECT_TRUE(whole_only.Settled());
  EXPECT_FALSE(whole_only.cost(true).has_value());
}

TEST(WeightsFirstPolicy, GoesBackToTheWholeUpdateWhenWeightsFirstIsSlower) {
  WeightsFirstPolicy policy;
  Job job;
  job.first_s = 1.4;
  const std::vector<bool> ran = RunJob(policy, job, 20);
  ASSERT_TRUE(policy.cost(true).has_value());
  EXPECT_DOUBLE_EQ(*policy.cost(true), 1.4);
  int on = 0;
  for (bool r : ran) on += r;
  EXPECT_LE(on, 3);  // the probe only
  for (size_t i = 8; i < ran.size(); ++i) EXPECT_FALSE(ran[i]) << "step " << i;
}

// Both passes would take 1.55 x 0.9 s of CPU in a 1.3 s step: the weights-first step would wait on the CPU.
TEST(WeightsFirstPolicy, NeverTriesWeightsFirstWhereTheCpuCannotFitBothPasses) {
  WeightsFirstPolicy policy;
  Job job;
  job.cpu_update_s = 0.9;
  const std::vector<bool> ran = RunJob(policy, job, 30);
  for (bool r : ran) EXPECT_FALSE(r);
  EXPECT_FALSE(policy.cost(true).has_value());
}

TEST(WeightsFirstPolicy, MeasuresTheOtherScheduleAgainAfterReprobeSteps) {
  WeightsFirstPolicy::Options options;
  options.reprobe_steps = 10;
  WeightsFirstPolicy policy(options);
  const std::vector<bool> ran = RunJob(policy, Job{}, 40);
  // Settled on weights first, then back to the whole update for a measurement every ~10 steps.
  int whole_after_settling = 0;
  for (size_t i = 8; i < ran.size(); ++i) whole_after_settling += !ran[i];
  EXPECT_GE(whole_after_settling, 2);
  EXPECT_LE(whole_after_settling, 12);
  EXPECT_TRUE(ran.back() || ran[ran.size() - 2]);
}

// The host gets slower (other load): weights first's steps stretch past the whole update's, and the reprobe
// brings the job back to the whole update.
TEST(WeightsFirstPolicy, FollowsAChangeInTheHostsPace) {
  WeightsFirstPolicy::Options options;
  options.reprobe_steps = 10;
  WeightsFirstPolicy policy(options);
  RunJob(policy, Job{}, 20);
  Job slower;
  slower.first_s = 1.6;
  const std::vector<bool> ran = RunJob(policy, slower, 40);
  ASSERT_TRUE(policy.cost(true).has_value());
  EXPECT_GT(*policy.cost(true), *policy.cost(false));
  int whole = 0;  // of the last 20: all but the reprobes of weights first
  for (size_t i = ran.size() - 20; i < ran.size(); ++i) whole += !ran[i];
  EXPECT_GE(whole, 14);
}

TEST(WeightsFirstPolicy, IgnoresStepsWithoutUpdatesOrCompute) {
  WeightsFirstPolicy policy;
  WeightsFirstPolicy::Sample s;
  s.step_s = 1.0;
  s.compute_s = 0;  // the CPU device: nothing to normalise by
  s.ran_updates = true;
  for (int i = 0; i < 5; ++i) policy.Record(s);
  EXPECT_FALSE(policy.cost(false).has_value());
  EXPECT_FALSE(policy.Choose());
  s.compute_s = 1.0;
  s.ran_updates = false;  // a checkpoint waited for them
  policy.Record(s);
  policy.Record(s);
  EXPECT_FALSE(policy.cost(false).has_value());
}

}  // namespace
}  // namespace slide
