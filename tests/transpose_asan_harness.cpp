// hwc3_to_chw (the image stage's last copy, SSSE3 where the CPU has it) under address and
// undefined-behaviour sanitizers: random shapes, row strides and flips, each source allocated to
// exactly the bytes its last row needs so that any read past it is caught, each result compared
// with the scalar definition. Built and run by tests/test_images.py.
#include <cstdio>
#include <cstdlib>

#include "engine/transpose.h"

int main() {
  unsigned seed = 12345;
  auto rnd = [&]() {
    seed = seed * 1103515245u + 12345u;
    return seed >> 8;
  };
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t rows = 1 + rnd() % 40, cols = 1 + rnd() % 90;
    const int64_t pad = rnd() % 3 == 0 ? 0 : rnd() % 20;  // a window of a wider resized image
    const int64_t stride = 3 * (cols + pad);
    const bool flip = rnd() & 1;
    const size_t n = static_cast<size_t>((rows - 1) * stride + 3 * cols);
    auto* src = static_cast<uint8_t*>(std::malloc(n));
    auto* dst = static_cast<uint8_t*>(std::malloc(static_cast<size_t>(3 * rows * cols)));
    for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(rnd());
    fastcollate::hwc3_to_chw(src, stride, rows, cols, dst, flip);
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t x = 0; x < cols; ++x) {
          const int64_t from = flip ? cols - 1 - x : x;
          if (dst[(c * rows + r) * cols + x] != src[r * stride + from * 3 + c]) {
            std::printf("wrong: rows %lld cols %lld stride %lld flip %d\n", static_cast<long long>(rows),
                        static_cast<long long>(cols), static_cast<long long>(stride), flip);
            return 1;
          }
        }
    std::free(src);
    std::free(dst);
  }
  std::printf("3000 shapes ok\n");
  return 0;
}
