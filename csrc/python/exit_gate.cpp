// The engine closed to other threads at interpreter exit (see nogil.h): close_for_exit, called
// from an atexit hook, before Python begins to finalize.
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <thread>

#include "bindings/register.h"
#include "python/nogil.h"

namespace fastcollate {
namespace exit_gate {

std::atomic<bool> closed{false};
std::atomic<int> inside{0};
std::atomic<unsigned long> exiting_thread{0};

void park() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

}  // namespace exit_gate

namespace {

// Closes the engine to every thread but this one and waits (GIL released, at most timeout_s)
// until no other thread is inside it; returns how many were still inside at the deadline.
int close_for_exit(double timeout_s) {
  exit_gate::exiting_thread.store(PyThread_get_thread_ident());
  exit_gate::closed.store(true, std::memory_order_release);
  PyThreadState* state = PyEval_SaveThread();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (exit_gate::inside.load(std::memory_order_acquire) > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const int left = exit_gate::inside.load(std::memory_order_acquire);
  PyEval_RestoreThread(state);
  return left;
}

}  // namespace

void register_exit_gate(pybind11::module_& m) {
  m.def("close_for_exit", &close_for_exit, py::arg("timeout_s"),
        "Close the engine to other threads at interpreter exit (an atexit hook): threads inside it park "
        "instead of taking the GIL back while Python finalizes. Returns the threads still inside at the deadline.");
}

}  // namespace fastcollate
