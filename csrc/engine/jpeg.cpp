#include "engine/jpeg.h"

#if FASTCOLLATE_WITH_JPEG

#include <csetjmp>
#include <cstdio>
#include <cstring>

extern "C" {
#include <jerror.h>
#include <jpeglib.h>
}

namespace fastcollate {
namespace {

// libjpeg's error manager and the way back: POD only (see jpeg.h).
struct Trap {
  jpeg_error_mgr pub;
  jmp_buf back;
  char message[JMSG_LENGTH_MAX];
  int eof_fatal;  // an early end is an error while rows are read, not after the last one
};

void on_error(j_common_ptr cinfo) {
  Trap* trap = reinterpret_cast<Trap*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, trap->message);
  longjmp(trap->back, 1);
}

void on_message(j_common_ptr cinfo, int level) {
  // Warnings (-1) are ignored as Pillow ignores them (extraneous bytes, a bad marker) -- except
  // the file's early end, which Pillow refuses ("image file is truncated") and libjpeg would
  // quietly fill with gray.
  if (level == -1 && cinfo->err->msg_code == JWRN_JPEG_EOF && reinterpret_cast<Trap*>(cinfo->err)->eof_fatal) {
    Trap* trap = reinterpret_cast<Trap*>(cinfo->err);
    std::snprintf(trap->message, sizeof(trap->message), "the file is truncated (%s)", "premature end of JPEG data");
    longjmp(trap->back, 1);
  }
}

void init_trap(jpeg_decompress_struct* cinfo, Trap* trap) {
  std::memset(trap, 0, sizeof(*trap));
  cinfo->err = jpeg_std_error(&trap->pub);
  trap->pub.error_exit = on_error;
  trap->pub.emit_message = on_message;
  trap->eof_fatal = 1;
}

constexpr int kRowsPerRead = 16;

struct Region {
  int denom, top, left, h, w;
  bool partial;
  uint8_t* out;
  int stride;       // > 0: rows written in place, `stride` bytes apart (see jpeg_decode_rows); 0: packed
  int* col_offset;  // rows mode: where column `left` starts in each row
};

// Reads the header into `info` (when given), then decodes region `r` (when given); 0, or 1 with
// trap->message set. Only POD between setjmp and any longjmp: cinfo and trap live in the
// caller's frame, the row buffer in libjpeg's own pool.
int run_c(jpeg_decompress_struct* cinfo, Trap* trap, const uint8_t* data, size_t n, JpegHeader* info,
          const Region* r) {
  init_trap(cinfo, trap);
  if (setjmp(trap->back)) {
    jpeg_destroy_decompress(cinfo);
    return 1;
  }
  jpeg_create_decompress(cinfo);
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(n));
  jpeg_read_header(cinfo, TRUE);
  if (info != nullptr) {
    info->width = static_cast<int>(cinfo->image_width);
    info->height = static_cast<int>(cinfo->image_height);
    info->components = cinfo->num_components;
    info->color_space = static_cast<int>(cinfo->jpeg_color_space);
    info->progressive = cinfo->progressive_mode != 0;
    info->arithmetic = cinfo->arith_code != 0;
    info->precision = cinfo->data_precision;
    info->imcu_width = cinfo->max_h_samp_factor * DCTSIZE;
    info->imcu_height = cinfo->max_v_samp_factor * DCTSIZE;
  }
  if (r == nullptr) {
    jpeg_destroy_decompress(cinfo);
    return 0;
  }
  cinfo->out_color_space = JCS_RGB;  // gray replicated, YCbCr converted: Pillow's convert("RGB")
  cinfo->scale_num = 1;
  cinfo->scale_denom = static_cast<unsigned int>(r->denom);
  jpeg_start_decompress(cinfo);
  const int full_w = static_cast<int>(cinfo->output_width), full_h = static_cast<int>(cinfo->output_height);
  // in 64 bits: a binding's caller may pass anything, and top + h must not wrap
  if (r->top < 0 || r->left < 0 || r->h <= 0 || r->w <= 0 || int64_t{r->top} + r->h > full_h ||
      int64_t{r->left} + r->w > full_w) {
    std::snprintf(trap->message, sizeof(trap->message), "the region (top %d, left %d, %dx%d) is outside the %dx%d image",
                  r->top, r->left, r->h, r->w, full_h, full_w);
    jpeg_destroy_decompress(cinfo);
    return 1;
  }
  int first_col = 0;  // the decoded rows' first column, in the image
  int first_row = 0;
  if (r->partial) {
    const int mx = cinfo->max_h_samp_factor * cinfo->min_DCT_scaled_size;  // an iMCU, scaled
    const int my = cinfo->max_v_samp_factor * cinfo->min_DCT_scaled_size;
    const int x0 = r->left - mx > 0 ? r->left - mx : 0;
    const int x1 = r->left + r->w + mx < full_w ? r->left + r->w + mx : full_w;
    if (x0 > 0 || x1 < full_w) {
      JDIMENSION xoff = static_cast<JDIMENSION>(x0), xw = static_cast<JDIMENSION>(x1 - x0);
      jpeg_crop_scanline(cinfo, &xoff, &xw);  // widened to iMCU boundaries
      first_col = static_cast<int>(xoff);
    }
    first_row = r->top - my > 0 ? r->top - my : 0;
    if (first_row > 0) first_row = static_cast<int>(jpeg_skip_scanlines(cinfo, static_cast<JDIMENSION>(first_row)));
  }
  const int row_bytes = static_cast<int>(cinfo->output_width) * 3;
  // several rows a call: one row at a time makes the upsampler keep a spare row and copy it
  // (measured: ~20% of a 500x375 decode)
  const int chunk = kRowsPerRead;
  JSAMPARRAY rows = (*cinfo->mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(cinfo), JPOOL_IMAGE,
                                                static_cast<JDIMENSION>(row_bytes), chunk);
  const int skip_cols = (r->left - first_col) * 3;
  const int end = r->top + r->h;
  const bool in_place = r->stride > 0;
  if (in_place) {
    if (row_bytes > r->stride) {
      std::snprintf(trap->message, sizeof(trap->message), "decoded rows of %d bytes do not fit a stride of %d",
                    row_bytes, r->stride);
      jpeg_destroy_decompress(cinfo);
      return 1;
    }
    *r->col_offset = r->left - first_col;
  }
  JSAMPROW targets[kRowsPerRead];
  while (static_cast<int>(cinfo->output_scanline) < end) {
    const int y = static_cast<int>(cinfo->output_scanline);
    const int want = end - y < chunk ? end - y : chunk;
    for (int k = 0; k < want; ++k)  // in place: the region's rows straight into out, no copy
      targets[k] = in_place && y + k >= r->top ? r->out + static_cast<size_t>(y + k - r->top) * r->stride : rows[k];
    const int got = static_cast<int>(jpeg_read_scanlines(cinfo, targets, static_cast<JDIMENSION>(want)));
    if (got <= 0) {
      std::snprintf(trap->message, sizeof(trap->message), "libjpeg returned no row %d", y);
      jpeg_destroy_decompress(cinfo);
      return 1;
    }
    for (int k = 0; k < got && !in_place; ++k) {
      if (y + k >= r->top)
        std::memcpy(r->out + static_cast<size_t>(y + k - r->top) * r->w * 3, rows[k] + skip_cols, r->w * 3);
    }
  }
  if (r->top + r->h == full_h) {
    // the last row read: the rest of the file (to its EOI) is read as Pillow reads it, so a file
    // whose markers are corrupt past its last row is refused here too (an early end there is
    // not: Pillow has its pixels by then and keeps them)
    trap->eof_fatal = 0;
    jpeg_finish_decompress(cinfo);
  } else {
    jpeg_abort_decompress(cinfo);  // the rows below the region are never decoded
  }
  jpeg_destroy_decompress(cinfo);
  return 0;
}

}  // namespace

bool jpeg_available() { return true; }

std::string jpeg_version() {
#ifdef LIBJPEG_TURBO_VERSION
#define FC_STR2(x) #x
#define FC_STR(x) FC_STR2(x)
  return "libjpeg-turbo " FC_STR(LIBJPEG_TURBO_VERSION);
#else
  return "libjpeg " + std::to_string(JPEG_LIB_VERSION);
#endif
}

std::string jpeg_read_header(const uint8_t* data, size_t n, JpegHeader* out) {
  if (n < 4 || data[0] != 0xFF || data[1] != 0xD8) return "not a JPEG file (no SOI marker)";
  jpeg_decompress_struct cinfo;
  Trap trap;
  if (run_c(&cinfo, &trap, data, n, out, nullptr) != 0) return trap.message;
  const int cs = out->color_space;
  if (out->precision != 8) {
    out->why = std::to_string(out->precision) + "-bit samples";
  } else if (out->arithmetic) {
    out->why = "arithmetic coding";
  } else if (cs != JCS_GRAYSCALE && cs != JCS_YCbCr && cs != JCS_RGB) {
    out->why = cs == JCS_CMYK ? "CMYK" : cs == JCS_YCCK ? "YCCK" : "color space " + std::to_string(cs);
  } else if ((cs == JCS_GRAYSCALE) != (out->components == 1)) {
    out->why = std::to_string(out->components) + " components";
  } else {
    out->exact = true;
  }
  return "";
}

void jpeg_scaled_size(int width, int height, int denom, int* scaled_width, int* scaled_height) {
  *scaled_width = (width + denom - 1) / denom;  // libjpeg's jdiv_round_up(width * 1, denom)
  *scaled_height = (height + denom - 1) / denom;
}

std::string jpeg_decode_region(const uint8_t* data, size_t n, int denom, int top, int left, int h, int w,
                               bool partial, uint8_t* out) {
  if (denom != 1 && denom != 2 && denom != 4 && denom != 8) return "the DCT scale must be 1/1, 1/2, 1/4 or 1/8";
  jpeg_decompress_struct cinfo;
  Trap trap;
  Region region{denom, top, left, h, w, partial, out, 0, nullptr};
  if (run_c(&cinfo, &trap, data, n, nullptr, &region) != 0) return trap.message;
  return "";
}

std::string jpeg_decode_rows(const uint8_t* data, size_t n, int denom, int top, int left, int h, int w, bool partial,
                             uint8_t* out, int stride, int* col_offset) {
  if (denom != 1 && denom != 2 && denom != 4 && denom != 8) return "the DCT scale must be 1/1, 1/2, 1/4 or 1/8";
  if (stride <= 0) return "the stride must be positive";
  jpeg_decompress_struct cinfo;
  Trap trap;
  Region region{denom, top, left, h, w, partial, out, stride, col_offset};
  if (run_c(&cinfo, &trap, data, n, nullptr, &region) != 0) return trap.message;
  return "";
}

}  // namespace fastcollate

#else  // no libjpeg at build time

namespace fastcollate {
bool jpeg_available() { return false; }
std::string jpeg_version() { return "none: fastcollate was built without libjpeg"; }
std::string jpeg_read_header(const uint8_t*, size_t, JpegHeader*) { return "fastcollate was built without libjpeg"; }
void jpeg_scaled_size(int width, int height, int denom, int* sw, int* sh) {
  *sw = (width + denom - 1) / denom;
  *sh = (height + denom - 1) / denom;
}
std::string jpeg_decode_region(const uint8_t*, size_t, int, int, int, int, int, bool, uint8_t*) {
  return "fastcollate was built without libjpeg";
}
std::string jpeg_decode_rows(const uint8_t*, size_t, int, int, int, int, int, bool, uint8_t*, int, int*) {
  return "fastcollate was built without libjpeg";
}
}  // namespace fastcollate

#endif
