#include "engine/arena_pool.h"

#include <pthread.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace fastcollate {
namespace {

constexpr size_t kAlign = 4096;
constexpr size_t kDefaultLimit = size_t(2) << 30;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

struct Block {
  size_t size;
  pid_t pid;    // a block released in a forked child never goes back to the parent's pool
  bool pooled;  // counted in pool_bytes; false: made past the cap, freed on release
  std::unique_ptr<void, FreeDeleter> mem;
};

size_t read_limit_from_env() {
  const char* env = std::getenv("FASTCOLLATE_POOL_BYTES");
  if (env == nullptr || *env == '\0') return kDefaultLimit;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(env, &end, 10);
  return (end != nullptr && *end == '\0') ? static_cast<size_t>(v) : kDefaultLimit;
}

// This process's id, kept by the atfork handler: getpid() is a syscall, and release() runs
// once per batch, a visible share of a small gathered batch's cost.
pid_t g_pid = 0;

class Pool {
 public:
  Pool() : limit_(read_limit_from_env()) {}

  std::unique_ptr<Block> take(size_t nbytes) {
    const size_t size = pool_size_class(nbytes);
    std::unique_lock<std::mutex> lock(mu_);
    auto it = idle_.find(size);
    if (it != idle_.end() && !it->second.empty()) {
      std::unique_ptr<Block> b = std::move(it->second.back());
      it->second.pop_back();
      idle_bytes_ -= size;
      ++reused_;
      ++in_use_;
      return b;
    }
    // Make room under the cap by freeing idle arenas of other sizes (e.g. the last partial
    // batch of an epoch) before giving up and allocating outside the pool.
    std::vector<std::unique_ptr<Block>> to_free;
    for (auto idle = idle_.begin(); pool_bytes_ + size > limit_ && idle != idle_.end(); ++idle) {
      while (!idle->second.empty() && pool_bytes_ + size > limit_) {
        to_free.push_back(std::move(idle->second.back()));
        idle->second.pop_back();
        pool_bytes_ -= idle->first;
        idle_bytes_ -= idle->first;
        ++evicted_;
      }
    }
    const bool pooled = pool_bytes_ + size <= limit_;
    if (pooled) {
      pool_bytes_ += size;
      ++allocated_;
    } else {
      ++unpooled_;
    }
    ++in_use_;
    lock.unlock();
    to_free.clear();  // free outside the lock

    void* mem = std::aligned_alloc(kAlign, size == 0 ? kAlign : size);
    if (mem == nullptr) {
      give_back_accounting(size, pooled);
      throw std::bad_alloc();
    }
    auto b = std::make_unique<Block>();
    b->size = size;
    b->pid = g_pid;
    b->pooled = pooled;
    b->mem.reset(mem);
    return b;
  }

  void release(std::unique_ptr<Block> b) {
    if (b->pid != g_pid) return;  // a forked child's copy: just free it
    std::unique_lock<std::mutex> lock(mu_);
    --in_use_;
    if (b->pooled && pool_bytes_ <= limit_) {
      idle_bytes_ += b->size;
      idle_[b->size].push_back(std::move(b));
      return;
    }
    if (b->pooled) pool_bytes_ -= b->size;
    lock.unlock();  // b is freed here, outside the lock
  }

  void set_limit(size_t bytes) {
    std::vector<std::unique_ptr<Block>> to_free;
    std::lock_guard<std::mutex> lock(mu_);
    limit_ = bytes;
    evict_idle_over_limit(to_free);
  }

  void trim() {
    std::vector<std::unique_ptr<Block>> to_free;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& kv : idle_) {
      for (auto& b : kv.second) {
        pool_bytes_ -= b->size;
        idle_bytes_ -= b->size;
        to_free.push_back(std::move(b));
      }
      kv.second.clear();
    }
  }

  PoolStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    PoolStats s;
    s.allocated = allocated_;
    s.reused = reused_;
    s.unpooled = unpooled_;
    s.evicted = evicted_;
    s.pool_bytes = pool_bytes_;
    s.idle_bytes = idle_bytes_;
    s.in_use = in_use_;
    s.limit_bytes = limit_;
    return s;
  }

 private:
  void give_back_accounting(size_t size, bool pooled) {
    std::lock_guard<std::mutex> lock(mu_);
    --in_use_;
    if (pooled) {
      pool_bytes_ -= size;
      --allocated_;
    } else {
      --unpooled_;
    }
  }

  void evict_idle_over_limit(std::vector<std::unique_ptr<Block>>& to_free) {
    for (auto& kv : idle_) {
      while (!kv.second.empty() && pool_bytes_ > limit_) {
        to_free.push_back(std::move(kv.second.back()));
        kv.second.pop_back();
        pool_bytes_ -= kv.first;
        idle_bytes_ -= kv.first;
        ++evicted_;
      }
    }
  }

  std::mutex mu_;
  std::unordered_map<size_t, std::vector<std::unique_ptr<Block>>> idle_;
  size_t limit_;
  uint64_t pool_bytes_ = 0, idle_bytes_ = 0, in_use_ = 0;
  uint64_t allocated_ = 0, reused_ = 0, unpooled_ = 0, evicted_ = 0;
};

// Deliberately immortal: arenas can be released by storages that die during interpreter
// shutdown, after static destructors would have run. After fork() the child gets a fresh pool
// (the copied one's mutex may have been held by a parent thread at the fork); the copy is
// abandoned, and blocks it handed out are freed, not pooled, when they come back (Block::pid).
Pool* g_pool = nullptr;

void reset_pool_in_child() {
  g_pid = getpid();
  g_pool = std::make_unique<Pool>().release();
}

Pool& the_pool() {
  static const bool registered = [] {
    g_pid = getpid();
    g_pool = std::make_unique<Pool>().release();
    pthread_atfork(nullptr, nullptr, &reset_pool_in_child);
    return true;
  }();
  (void)registered;
  return *g_pool;
}

void release_block(void* ctx) {
  the_pool().release(std::unique_ptr<Block>(static_cast<Block*>(ctx)));
}

}  // namespace

size_t pool_size_class(size_t nbytes) {
  // Eight classes per power of two above 64 KiB (at most 12.5% slack), whole pages below.
  if (nbytes <= (size_t(64) << 10)) return (nbytes + kAlign - 1) / kAlign * kAlign;
  size_t top = 1;
  while ((top << 1) <= nbytes) top <<= 1;
  const size_t step = top / 8;
  return (nbytes + step - 1) / step * step;
}

at::Tensor pool_allocate(size_t nbytes) {
  std::unique_ptr<Block> b = the_pool().take(nbytes);
  void* data = b->mem.get();
  c10::DataPtr ptr(data, b.release(), &release_block, c10::Device(c10::DeviceType::CPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(ptr),
                       /*allocator=*/nullptr, /*resizable=*/false);
  // built directly rather than through set_(): this runs once per batch, tiny batches included
  auto arena = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                        caffe2::TypeMeta::Make<uint8_t>());
  arena.unsafeGetTensorImpl()->set_sizes_contiguous({static_cast<int64_t>(nbytes)});
  return arena;
}

void pool_set_limit(size_t bytes) { the_pool().set_limit(bytes); }
PoolStats pool_stats() { return the_pool().stats(); }
void pool_trim() { the_pool().trim(); }

}  // namespace fastcollate
