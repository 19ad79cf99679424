// JPEG decoding with libjpeg-turbo's libjpeg API: headers, and decodes of a region at a DCT scale
// (columns by jpeg_crop_scanline, rows by jpeg_skip_scanlines, stopping after the region's last
// row). Plain buffers in and out: no ATen, no Python; safe to call from many threads at once.
//
// libjpeg reports errors by calling error_exit, which must not return: it longjmps back into the
// frame that called setjmp. That frame (in jpeg.cpp) holds nothing with a destructor, so the jump
// never crosses a C++ frame; every error comes back as a message.
//
// Built only where libjpeg was found (FASTCOLLATE_WITH_JPEG); elsewhere jpeg_available() is false
// and every call returns "not built with libjpeg".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fastcollate {

bool jpeg_available();
// "libjpeg-turbo 2.1.5" (the version the engine was built against), or why there is none.
std::string jpeg_version();

struct JpegHeader {
  int width = 0, height = 0, components = 0;
  int color_space = 0;      // the file's J_COLOR_SPACE
  bool progressive = false;
  bool arithmetic = false;
  int precision = 8;
  int imcu_width = 8, imcu_height = 8;  // an iMCU in pixels at scale 1
  // Whether this engine decodes it exactly as Pillow's open(...).convert("RGB") does: 8 bits,
  // Huffman-coded, grayscale, YCbCr or RGB. Else `why` says what it is (CMYK, 12-bit, ...).
  bool exact = false;
  std::string why;
};

// Reads the header of a JPEG held in data[0, n). Returns "" or the error.
std::string jpeg_read_header(const uint8_t* data, size_t n, JpegHeader* out);

// The size of the image decoded at DCT scale 1/denom (denom 1, 2, 4 or 8), as libjpeg computes it.
void jpeg_scaled_size(int width, int height, int denom, int* scaled_width, int* scaled_height);

// Decodes rows [top, top + h) and columns [left, left + w) of the image at scale 1/denom (region
// in scaled pixels) as packed RGB into out (h * w * 3 bytes). `partial`: decode only the region
// (with a margin of one iMCU on every side, so that the chroma upsampling near the region's edge
// sees what a full decode sees); else every row up to the region's end and every column. A file
// that ends early (libjpeg would fill the rest with gray) is an error, as in Pillow. Returns ""
// or the error.
std::string jpeg_decode_region(const uint8_t* data, size_t n, int denom, int top, int left, int h, int w,
                               bool partial, uint8_t* out);

// The same region, its rows decoded in place: row y - top at out + (y - top) * stride, its column
// `left` at byte 3 * *col_offset (the decoded rows start at an iMCU boundary, and stride must
// hold the scaled image's whole width: 3 * ceil(width / denom) bytes). No copy of the pixels.
std::string jpeg_decode_rows(const uint8_t* data, size_t n, int denom, int top, int left, int h, int w,
                             bool partial, uint8_t* out, int stride, int* col_offset);

}  // namespace fastcollate
