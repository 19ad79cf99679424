#include "engine/pool.h"

#include <pthread.h>
#include <sched.h>

#include <new>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#endif

namespace fastcollate {
namespace {

// How long an idle helper keeps polling for work before it sleeps on the condvar. On a busy
// machine a condvar wake-up can cost more than a whole batch's copy, so, as OpenMP's workers
// do, a helper that just finished stays awake briefly for the next batch.
// FASTCOLLATE_SPIN_US overrides it (0: always sleep).
int64_t spin_ns() {
  static const int64_t ns = [] {
    const char* v = std::getenv("FASTCOLLATE_SPIN_US");
    const long us = v != nullptr ? std::strtol(v, nullptr, 10) : 500;
    return static_cast<int64_t>(std::max(0L, us)) * 1000;
  }();
  return ns;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#endif
}

// A small persistent pool: spawning threads per batch would cost more than a small copy.
class ThreadPool {
 public:
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      stopping_.store(true);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  void ensure_workers(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    while (static_cast<int>(workers_.size()) < n) workers_.emplace_back([this] { loop(); });
  }

  // Called once per parallel run: helpers poll after it only while runs come closer together
  // than the poll itself lasts (back-to-back batches); when they come further apart, polling
  // would only burn a core that a DataLoader worker or the training step could use.
  void begin_run() {
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch()).count();
    const int64_t last = last_run_ns_.exchange(now, std::memory_order_relaxed);
    poll_.store(last != 0 && now - last < spin_ns(), std::memory_order_relaxed);
    caller_cpu_.store(sched_getcpu(), std::memory_order_relaxed);
  }

  // Whether the calling helper shares a CPU with the thread that runs the copies. A helper
  // polling there takes the caller's CPU away from it (a small gather loop runs far slower with
  // both on one CPU), and the scheduler may leave two busy threads together for many
  // milliseconds. Such a helper neither polls nor takes tasks: it
  // sleeps, and the next wake-up places it on an idle CPU.
  bool on_caller_cpu() const {
    const int cpu = caller_cpu_.load(std::memory_order_relaxed);
    return cpu >= 0 && sched_getcpu() == cpu;
  }

  void submit(std::function<void()> task) {
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(task));
      pending_.fetch_add(1, std::memory_order_release);
      wake = sleepers_ > 0;
    }
    if (wake) cv_.notify_one();
  }

 private:
  // Polls for up to spin_ns() for a task to appear; true when one may have.
  bool spin_for_work() {
    const int64_t limit = spin_ns();
    if (limit == 0 || !poll_.load(std::memory_order_relaxed) || on_caller_cpu()) return false;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 1;; ++i) {
      if (pending_.load(std::memory_order_acquire) > 0 || stopping_.load(std::memory_order_relaxed)) return true;
      cpu_relax();
      if ((i & 255) == 0 &&
          (std::chrono::steady_clock::now() - start > std::chrono::nanoseconds(limit) || on_caller_cpu()))
        return false;
    }
  }

  void loop() {
    for (;;) {
      spin_for_work();
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (queue_.empty() && !stop_) {
          ++sleepers_;
          cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
          --sleepers_;
        }
        if (stop_ && queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
        pending_.fetch_sub(1, std::memory_order_relaxed);
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> workers_;
  std::atomic<int> pending_{0};  // queued tasks, read without the lock by spinning helpers
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> last_run_ns_{0};
  std::atomic<bool> poll_{false};  // whether idle helpers poll before sleeping (see begin_run)
  std::atomic<int> caller_cpu_{-1};  // the CPU the last run's caller started on
  int sleepers_ = 0;             // helpers blocked on cv_ (under mu_)
  bool stop_ = false;
};

std::mutex g_pool_mu;
std::unique_ptr<ThreadPool> g_pool;

// After fork() the child has the parent's pool object but none of its threads, and the mutexes
// may have been held at the fork: the child abandons that object (never touched, never
// destroyed) and makes its own pool on first use.
void abandon_pool_in_child() {
  (void)g_pool.release();
  new (&g_pool_mu) std::mutex();
}

ThreadPool& pool_for_this_process(int workers) {
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, &abandon_pool_in_child);
    return true;
  }();
  (void)registered;
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (!g_pool) g_pool = std::make_unique<ThreadPool>();
  g_pool->ensure_workers(workers);
  return *g_pool;
}

}  // namespace

int usable_cores() {
  static const int n = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
    return hardware_threads();
  }();
  return n;
}

int hardware_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

namespace {

// One parallel_run: tasks are claimed by the caller and by helpers alike, so a helper that
// wakes late (a condvar wake-up is slow on a busy machine) finds fewer tasks left instead of
// the caller waiting idle for its fixed share. The caller claims from the front
// and helpers from the back: when both are on time each keeps the same half of a batch's rows
// from one batch to the next, so a recycled arena's lines stay in that core's cache instead of
// moving between cores. The state outlives the call (shared): a helper that wakes after every
// task has been claimed only reads the range and leaves, never touching fn, which lives on the
// caller's stack.
struct Run {
  std::atomic<uint64_t> range{0};  // unclaimed tasks [front, back): front << 32 | back
  std::atomic<int> done{0};        // tasks completed
  int ntasks = 0;
  const std::function<void(int)>* fn = nullptr;
  std::mutex mu;  // guards error; taken to notify, so the caller's wait cannot miss the last task
  std::condition_variable cv;
  std::exception_ptr error;

  // The next unclaimed task from the front (or the back), -1 when none is left.
  int claim(bool front) {
    uint64_t r = range.load(std::memory_order_relaxed);
    for (;;) {
      const uint32_t f = static_cast<uint32_t>(r >> 32), b = static_cast<uint32_t>(r);
      if (f >= b) return -1;
      const uint64_t next = front ? (uint64_t(f + 1) << 32) | b : (uint64_t(f) << 32) | (b - 1);
      if (range.compare_exchange_weak(r, next, std::memory_order_acq_rel, std::memory_order_relaxed))
        return static_cast<int>(front ? f : b - 1);
    }
  }

  // Claims and runs tasks until none is left.
  void work(bool front) {
    for (int i; (i = claim(front)) >= 0;) {
      try {
        (*fn)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == ntasks) {
        std::lock_guard<std::mutex> lock(mu);
        cv.notify_all();
      }
    }
  }
};

}  // namespace

void parallel_run(int ntasks, const std::function<void(int)>& fn, int max_threads) {
  if (ntasks <= 0) return;
  // more threads than cores never speeds a copy up, and a polling helper would take a core
  // from the caller
  const int threads = std::min({ntasks, max_threads > 0 ? max_threads : ntasks, usable_cores()});
  if (threads == 1) {
    for (int i = 0; i < ntasks; ++i) fn(i);
    return;
  }
  ThreadPool& pool = pool_for_this_process(std::min(threads - 1, 63));
  pool.begin_run();
  auto run = std::make_shared<Run>();
  run->ntasks = ntasks;
  run->fn = &fn;
  run->range.store(static_cast<uint64_t>(ntasks), std::memory_order_relaxed);
  for (int h = 1; h < threads; ++h) {
    pool.submit([run, &pool] {
      if (!pool.on_caller_cpu()) run->work(/*front=*/false);  // else the caller takes every task
    });
  }
  run->work(/*front=*/true);
  // the helpers' last tasks are short (a share of one batch): poll before sleeping on the condvar
  for (int i = 0; run->done.load(std::memory_order_acquire) < ntasks && i < (1 << 16); ++i) cpu_relax();
  std::unique_lock<std::mutex> lock(run->mu);
  run->cv.wait(lock, [&run] { return run->done.load(std::memory_order_acquire) == run->ntasks; });
  if (run->error) std::rethrow_exception(run->error);
}

}  // namespace fastcollate
