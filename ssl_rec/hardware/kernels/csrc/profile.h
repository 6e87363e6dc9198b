// Optional per-phase wall-clock counters of the kernels (benchmarks/embedding.py reports
// where a training step's time goes). Off by default: then a phase costs one relaxed load.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>

namespace sslrec {

enum Phase { kDedupe = 0, kAssign, kEvict, kLoad, kGather, kGroup, kUpdate, kNumPhases };
constexpr const char* kPhaseNames[kNumPhases] = {"dedupe", "assign_slots", "evict",  "load",
                                                  "gather", "group",        "update"};

struct Profile {
  std::atomic<bool> on{false};
  std::atomic<int64_t> ns[kNumPhases] = {};
};

inline Profile& profile() {
  static Profile p;
  return p;
}

// Adds the scope's duration to a phase's counter when profiling is on (time of the calling
// thread: with several threads the phases of different tasks add up).
class PhaseTimer {
 public:
  explicit PhaseTimer(Phase phase) : phase_(phase), on_(profile().on.load(std::memory_order_relaxed)) {
    if (on_) start_ = std::chrono::steady_clock::now();
  }
  ~PhaseTimer() {
    if (!on_) return;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now() - start_);
    profile().ns[phase_].fetch_add(ns.count(), std::memory_order_relaxed);
  }

 private:
  Phase phase_;
  bool on_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace sslrec
