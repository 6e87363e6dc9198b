// Optional per-phase wall-clock counters of the kernels (benchmarks/embedding.py reports
// where a training step's time goes). Off by default: then a phase costs one relaxed load.
#pragma once
#include <time.h>

#include <atomic>
#include <cstdint>

namespace sslrec {

enum Phase { kDedupe = 0, kAssign, kReplace, kGather, kGroup, kUpdate, kNumPhases };
constexpr const char* kPhaseNames[kNumPhases] = {"dedupe", "assign_slots", "evict_and_load",
                                                  "gather", "group",        "update"};

struct Profile {
  std::atomic<bool> on{false};
  std::atomic<int64_t> ns[kNumPhases] = {};
};

inline Profile& profile() {
  static Profile p;
  return p;
}

inline int64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Adds the scope's CPU time on the calling thread to a phase's counter when profiling is on
// (CPU time, not wall time: other processes on the machine do not count; with several
// threads the phases of different tasks add up).
class PhaseTimer {
 public:
  explicit PhaseTimer(Phase phase)
      : phase_(phase), on_(profile().on.load(std::memory_order_relaxed)) {
    if (on_) start_ = thread_cpu_ns();
  }
  ~PhaseTimer() {
    if (on_) profile().ns[phase_].fetch_add(thread_cpu_ns() - start_, std::memory_order_relaxed);
  }

 private:
  Phase phase_;
  bool on_;
  int64_t start_ = 0;
};

}  // namespace sslrec
