// Built by tests/test_images.py with -fsanitize=address,undefined around csrc/engine/jpeg.cpp alone (no
// ATen, no Python): every file named on the command line gets its header read and many boxes
// decoded, at three scales, packed and in place; then hostile arguments that must be refused.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>
#include "engine/jpeg.h"
using namespace fastcollate;
int main(int argc, char** argv) {
  long ok = 0, err = 0;
  for (int a = 1; a < argc; ++a) {
    std::ifstream f(argv[a], std::ios::binary);
    std::vector<uint8_t> d((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    JpegHeader h;
    if (!jpeg_read_header(d.data(), d.size(), &h).empty() || h.width <= 0 || h.height <= 0 ||
        (long)h.width * h.height > 40000000L) { ++err; continue; }
    for (int denom : {1, 2, 8}) {
      int sw, sh; jpeg_scaled_size(h.width, h.height, denom, &sw, &sh);
      int boxes[5][4] = {{0, 0, sh, sw}, {sh / 3, sw / 4, sh - sh / 3, sw / 2 + 1}, {sh - 1, sw - 1, 1, 1},
                         {0, sw / 2, sh / 2 + 1, sw - sw / 2}, {sh / 2, 0, sh - sh / 2, sw}};
      for (auto& b : boxes) {
        if (b[2] <= 0 || b[3] <= 0 || b[0] + b[2] > sh || b[1] + b[3] > sw) continue;
        for (bool partial : {true, false}) {
          std::vector<uint8_t> out((size_t)b[2] * b[3] * 3);
          (jpeg_decode_region(d.data(), d.size(), denom, b[0], b[1], b[2], b[3], partial, out.data()).empty() ? ok : err)++;
          std::vector<uint8_t> rows((size_t)b[2] * sw * 3);
          int col = -1;
          (jpeg_decode_rows(d.data(), d.size(), denom, b[0], b[1], b[2], b[3], partial, rows.data(), sw * 3, &col).empty() ? ok : err)++;
        }
      }
    }
    // hostile arguments: must be refused, never read out of bounds
    std::vector<uint8_t> one(3);
    if (jpeg_decode_region(d.data(), d.size(), 1, 0, 2147483000, 1, 1, false, one.data()).empty()) { std::puts("BAD: huge left accepted"); return 2; }
    if (jpeg_decode_region(d.data(), d.size(), 3, 0, 0, 1, 1, false, one.data()).empty()) { std::puts("BAD: denom 3"); return 2; }
  }
  std::printf("decodes ok %ld, refused %ld\n", ok, err);
  return 0;
}
