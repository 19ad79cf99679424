// A shared-memory segment received as a file descriptor (a DataLoader worker's batch arena),
// taken without keeping the descriptor: mapped (a storage that unmaps itself) or read into
// memory the caller owns. ATen, no Python, GIL-free.
#pragma once

#include <ATen/core/Tensor.h>  // the Tensor class alone: ATen/ATen.h (every op) tripled the compile

#include <cstdint>

namespace fastcollate {

// nbytes of fd from offset 0, mapped shared and writable, as a uint8 tensor whose storage
// unmaps when its last view dies. The caller may close fd as soon as this returns.
at::Tensor map_fd(int fd, int64_t nbytes);

// Reads nbytes of fd from offset 0 into out (a contiguous uint8 CPU tensor of >= nbytes).
void read_fd(int fd, int64_t nbytes, const at::Tensor& out);

}  // namespace fastcollate
