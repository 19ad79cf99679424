// The shared thread pool of the engine: work split into tasks that the calling thread and the
// pool's helpers claim as they come free. Knows nothing about Python; callers release the GIL
// around it.
#pragma once

#include <functional>

namespace fastcollate {

// Runs fn(0) .. fn(ntasks - 1) on the shared pool with up to max_threads threads (<= 0: one per
// task), the calling thread taking part; each thread claims the next unclaimed task, so split
// work into more tasks than threads and a slow-to-wake helper costs nothing. Returns when all
// have finished; the first exception thrown by a task is rethrown here.
void parallel_run(int ntasks, const std::function<void(int)>& fn, int max_threads = 0);

// Tasks per thread that the copies split their bytes into.
constexpr int kTasksPerThread = 8;

int hardware_threads();
// The cores this process may run on (its affinity mask, read once).
int usable_cores();

}  // namespace fastcollate
