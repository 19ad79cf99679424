// Segments received as descriptors (see shared_fd.h).
#include "engine/shared_fd.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace fastcollate {
namespace {

struct Mapping {
  void* addr;
  size_t len;
};

void unmap(void* ctx) {
  auto* m = static_cast<Mapping*>(ctx);
  munmap(m->addr, m->len);
  delete m;
}

}  // namespace

at::Tensor map_fd(int fd, int64_t nbytes) {
  TORCH_CHECK(fd >= 0 && nbytes >= 0, "fastcollate map_fd: bad descriptor ", fd, " or size ", nbytes);
  const size_t len = static_cast<size_t>(std::max<int64_t>(nbytes, 1));
  void* addr = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  TORCH_CHECK(addr != MAP_FAILED, "fastcollate: mapping a batch of ", nbytes, " bytes failed: ", std::strerror(errno));
  c10::DataPtr ptr(addr, new Mapping{addr, len}, &unmap, c10::Device(c10::DeviceType::CPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(ptr), nullptr, false);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                    caffe2::TypeMeta::Make<uint8_t>());
  t.unsafeGetTensorImpl()->set_sizes_contiguous({nbytes});
  return t;
}

void read_fd(int fd, int64_t nbytes, const at::Tensor& out) {
  TORCH_CHECK(out.device().is_cpu() && out.scalar_type() == at::kByte && out.is_contiguous() && out.numel() >= nbytes,
              "fastcollate read_fd: out must be a contiguous uint8 CPU tensor of >= ", nbytes, " bytes");
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  int64_t done = 0;
  while (done < nbytes) {
    const ssize_t n = pread(fd, dst + done, static_cast<size_t>(nbytes - done), done);
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK(n > 0, "fastcollate: reading a batch of ", nbytes, " bytes failed at byte ", done, ": ",
                n == 0 ? "the segment is shorter" : std::strerror(errno));
    done += n;
  }
}

}  // namespace fastcollate
