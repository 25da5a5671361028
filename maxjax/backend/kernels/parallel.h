// maxjax's CPU kernels: work split over XLA's intra-op thread pool (shared by matvec.cc and
// amx.cc; part of the kernels' library, see maxjax/backend/kernels/__init__.py).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

#include "xla/ffi/api/ffi.h"

namespace maxjax_kernels {

// Runs work(begin, end) over [0, n) in contiguous chunks that the caller and XLA's pool threads
// take from a shared counter: the caller works too, and waits only for chunks another thread has
// started, so when the pool is busy (XLA runs independent thunks, e.g. gate_proj and up_proj,
// at the same time) the caller does the work itself instead of waiting for a queued task. A task
// that starts after all chunks are taken returns without touching `work` (the counters outlive
// the call in a shared_ptr).
// Products of fewer than kSerialValues weight values x rows run on the caller alone: waking a
// pool thread costs more than it saves there.
constexpr int64_t kSerialValues = int64_t(1) << 18;

// Chunks per thread: 8 by default (compute-bound work of uneven tasks: attention, AMX tiles);
// kStreamChunks for the products that stream a weight from memory once (matvec.cc), where each
// thread reading one contiguous part is faster than more, smaller parts: 2-core Zen 5 EPYC, batch-1
// decode, SmolLM2 Q4_1 nibbles 178-181 -> 191-242 tokens/s and Llama-3.2-1B-shaped Q4_0 mapped
// 37-44 -> 43-48 (alternating runs; 10% of the rows in 16 smaller chunks after two large ones:
// 206-236 and 43-44); batch 16 and Q8_0 activations within 2%.
constexpr int64_t kDefaultChunks = 8;
constexpr int64_t kStreamChunks = 1;

template <typename F>
void parallel_for(xla::ffi::ThreadPool& pool, int64_t n, int64_t values, F work, int64_t chunks_per_thread = kDefaultChunks) {
  struct Counters {
    std::atomic<int64_t> next{0}, done{0};
  };
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t chunks = std::min<int64_t>(n, chunks_per_thread * threads);
  if (threads == 1 || chunks <= 1 || values < kSerialValues) {
    work(0, n);
    return;
  }
  const int64_t size = (n + chunks - 1) / chunks;
  auto c = std::make_shared<Counters>();
  auto run = [c, chunks, size, n, &work] {
    for (int64_t i; (i = c->next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      work(i * size, std::min(n, (i + 1) * size));
      c->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t t = 1; t < threads; ++t) pool.Schedule([c, chunks, run]() mutable {
    if (c->next.load(std::memory_order_relaxed) < chunks) run();
  });
  run();
  while (c->done.load(std::memory_order_acquire) < chunks) _mm_pause();
}

}  // namespace maxjax_kernels
