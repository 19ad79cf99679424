// The GIL released around the engine's work, and taken back -- safely at interpreter exit.
//
// When Python finalizes while a daemon thread is inside the engine (a thread-based loader, a
// user's prefetch thread), CPython 3.8-3.13 ends that thread as it takes the GIL back, with
// pthread_exit; the forced unwind then meets this noexcept destructor and the process aborts
// ("terminate called without an active exception", exit code 134) after the user's program has
// finished -- pybind11's gil_scoped_release has the same fate. Checking "is Python finalizing?"
// before taking the GIL back is not enough: the thread may already wait for the GIL when
// finalization begins (measured: 11 of 20 exits still aborted). So an atexit hook (close_for_exit, run before finalization begins) closes
// the engine to other threads and waits for those inside it: each one, done with its work,
// parks instead of taking the GIL back (as CPython 3.14 parks such threads), and the process
// exits around it. The thread that runs the exit is never parked.
#pragma once

#include <Python.h>

#include <atomic>

namespace fastcollate {

namespace exit_gate {
extern std::atomic<bool> closed;     // set by close_for_exit
extern std::atomic<int> inside;      // threads in a NoGil region now
extern std::atomic<unsigned long> exiting_thread;  // PyThread_get_thread_ident() of the exit's thread
[[noreturn]] void park();
// Only once closed: "is Python finalizing?" alone would also park the thread that finalizes
// (a __del__ that releases a ring slot), and the process would hang at exit.
inline bool must_park() {
  return closed.load(std::memory_order_acquire) && PyThread_get_thread_ident() != exiting_thread.load();
}
}  // namespace exit_gate

class NoGil {
 public:
  NoGil() : state_(PyEval_SaveThread()) {
    exit_gate::inside.fetch_add(1, std::memory_order_acq_rel);
    if (exit_gate::must_park()) leave_and_park();
  }
  ~NoGil() {
    if (exit_gate::must_park()) leave_and_park();
    // counted inside until the GIL is back: a thread that had passed the check and waited for the
    // GIL when close_for_exit ran was no longer counted, so the exit did not wait for it and
    // finalization ended it in here (1 exit in 12 aborted beside a CPU load); close_for_exit
    // waits with the GIL released, so this thread gets it, leaves, and parks at its next call
    PyEval_RestoreThread(state_);
    exit_gate::inside.fetch_sub(1, std::memory_order_acq_rel);
  }
  NoGil(const NoGil&) = delete;
  NoGil& operator=(const NoGil&) = delete;

 private:
  [[noreturn]] static void leave_and_park() {
    exit_gate::inside.fetch_sub(1, std::memory_order_acq_rel);
    exit_gate::park();
  }
  PyThreadState* state_;
};

}  // namespace fastcollate
