#include "engine/image_batch.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/_upsample_bilinear2d_aa.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/ParallelGuard.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>

#include "engine/jpeg.h"
#include "engine/pool.h"
#include "engine/transpose.h"

namespace fastcollate {
namespace {

// a pool thread keeps its decode buffer between images up to this size (a 12 MP photo's box
// rows: ~36 MB); a larger one is freed after its image
constexpr size_t kKeepScratch = size_t{64} << 20;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string check_job(const ImageJob& j, int out_h, int out_w) {
  // sums in 64 bits: nothing here may wrap, whatever a binding's caller passed
  if (j.h <= 0 || j.w <= 0 || j.top < 0 || j.left < 0) return "the box is empty or starts outside the image";
  if (j.resize_h <= 0 || j.resize_w <= 0) return "the resize target is empty";
  if (j.crop_top < 0 || j.crop_left < 0 || int64_t{j.crop_top} + out_h > j.resize_h ||
      int64_t{j.crop_left} + out_w > j.resize_w)
    return "the output window is outside the resized box";
  if (j.pixels != nullptr && (int64_t{j.top} + j.h > j.pixels_h || int64_t{j.left} + j.w > j.pixels_w))
    return "the box is outside the decoded image";
  if (j.pixels == nullptr && (j.width <= 0 || int64_t{j.left} + j.w > j.width))
    return "the image's width is smaller than the box";
  if (j.pixels == nullptr && j.data == nullptr) return "no source";
  return "";
}

// One image: the box decoded into scratch (or read from the decoded pixels), resized, windowed,
// flipped, written as CHW at dst.
std::string run_one(const ImageJob& j, uint8_t* dst, int out_h, int out_w, std::vector<uint8_t>* scratch,
                    ImageTimes* times) {
  std::string err = check_job(j, out_h, out_w);
  if (!err.empty()) return err;
  const int64_t t0 = now_ns();
  at::Tensor box;
  if (j.pixels != nullptr) {
    box = at::from_blob(const_cast<uint8_t*>(j.pixels), {1, j.pixels_h, j.pixels_w, 3}, at::kByte)
              .slice(1, j.top, j.top + j.h)
              .slice(2, j.left, j.left + j.w);
  } else {
    // the rows decoded in place at the image's width: the box is a strided view of them, read
    // by the resize directly (a packed copy of the box cost ~9% of the stage)
    const int stride = j.width * 3;
    scratch->resize(static_cast<size_t>(j.h) * stride);
    int col = 0;
    err = jpeg_decode_rows(j.data, j.size, j.denom, j.top, j.left, j.h, j.w, j.partial, scratch->data(), stride, &col);
    if (!err.empty()) return err;
    box = at::from_blob(scratch->data() + static_cast<size_t>(col) * 3, {1, j.h, j.w, 3},
                        {static_cast<int64_t>(j.h) * stride, stride, 3, 1}, at::kByte);
  }
  const int64_t t1 = now_ns();
  // NCHW over HWC memory: the layout the reference's permute(2, 0, 1) gives the same kernel
  at::Tensor resized = at::_upsample_bilinear2d_aa(box.permute({0, 3, 1, 2}), {j.resize_h, j.resize_w}, false,
                                                   std::nullopt, std::nullopt);
  if (resized.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    // HWC memory to the batch's CHW by the engine's deinterleave: ATen's strided copy_ of the
    // permuted window took ~20% of a 500 x 375 sample
    const int64_t row = static_cast<int64_t>(j.resize_w) * 3;
    hwc3_to_chw(resized.const_data_ptr<uint8_t>() + j.crop_top * row + static_cast<int64_t>(j.crop_left) * 3, row,
                out_h, out_w, dst, j.flip);
  } else {
    at::Tensor window = resized.select(0, 0).slice(1, j.crop_top, j.crop_top + out_h).slice(2, j.crop_left,
                                                                                              j.crop_left + out_w);
    at::Tensor out = at::from_blob(dst, {3, out_h, out_w}, at::kByte);
    out.copy_(j.flip ? window.flip({2}) : window);
  }
  times->decode_ns.fetch_add(t1 - t0, std::memory_order_relaxed);
  times->resize_ns.fetch_add(now_ns() - t1, std::memory_order_relaxed);
  return "";
}

}  // namespace

void run_image_jobs(const std::vector<ImageJob>& jobs, uint8_t* out, int out_h, int out_w, int threads,
                    std::vector<std::string>* errors, ImageTimes* times) {
  errors->assign(jobs.size(), std::string());
  const size_t per = static_cast<size_t>(3) * out_h * out_w;
  parallel_run(static_cast<int>(jobs.size()), [&](int i) {
    // ATen inline on this thread: the pool is the parallelism (an OpenMP team per task would
    // oversubscribe the cores)
    c10::ParallelGuard inline_ops(true);
    thread_local std::vector<uint8_t> scratch;
    try {
      (*errors)[i] = run_one(jobs[i], out + per * i, out_h, out_w, &scratch, times);
    } catch (const std::exception& exc) {
      (*errors)[i] = exc.what();
    }
    if (scratch.capacity() > kKeepScratch) std::vector<uint8_t>().swap(scratch);  // one huge photo: not kept
  }, threads);
}

namespace {

std::string read_file(const std::string& path, at::Tensor* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::strerror(errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return std::strerror(e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return "not a regular file";
  }
  at::Tensor bytes = at::empty({static_cast<int64_t>(st.st_size)}, at::kByte);
  uint8_t* p = bytes.data_ptr<uint8_t>();
  const size_t n = static_cast<size_t>(st.st_size);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int e = r < 0 ? errno : 0;
      ::close(fd);
      return e ? std::strerror(e) : "the file shrank while it was read";
    }
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  *out = std::move(bytes);
  return "";
}

}  // namespace

void read_files(const std::vector<std::string>& paths, int threads, std::vector<at::Tensor>* out,
                std::vector<std::string>* errors) {
  out->assign(paths.size(), at::Tensor());
  errors->assign(paths.size(), std::string());
  parallel_run(static_cast<int>(paths.size()), [&](int i) {
    try {
      (*errors)[i] = read_file(paths[i], &(*out)[i]);
    } catch (const std::exception& exc) {
      (*errors)[i] = exc.what();
    }
  }, threads);
}

}  // namespace fastcollate
