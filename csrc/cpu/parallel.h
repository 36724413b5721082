// Work sharing where tasks are uniform but the cores may not be: at::parallel_for splits a
// range into one fixed slice per thread, so a core slowed by a neighbour (shared cloud hosts)
// or a frequency drop makes the other threads wait at the end. Here each thread claims its next
// few tasks from a shared counter instead (docs/perf-notes/fractional_pool.md measures both).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace torch_tfgrads {

// worker(claim) runs once on each thread taking part (inline when already inside a parallel
// region, or with one thread); claim(begin, end) sets the next `chunk` tasks of [0, total) and
// returns false when none are left. The worker's own set-up (scratch, a store fence at its end)
// stays once per thread, not once per task.
template <typename Worker>
void parallel_claim(int64_t total, int64_t chunk, const Worker& worker) {
  if (total <= 0) return;
  chunk = std::max<int64_t>(1, chunk);
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), (total + chunk - 1) / chunk);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    worker([&](int64_t& begin, int64_t& end) {
      begin = next.fetch_add(chunk, std::memory_order_relaxed);
      if (begin >= total) return false;
      end = std::min(total, begin + chunk);
      return true;
    });
  });
}

}  // namespace torch_tfgrads
