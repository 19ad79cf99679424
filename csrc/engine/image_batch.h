// A batch of images decoded, cropped, resized and flipped into one CHW uint8 block (the batch's
// arena), every image a task on the engine's pool. ATen's antialiased bilinear resize on uint8
// (_upsample_bilinear2d_aa: what torch.nn.functional.interpolate(..., mode="bilinear",
// antialias=True) and torchvision v2's tensor resize call) keeps every pixel equal to the
// Python reference's. No Python: the caller releases the GIL.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fastcollate {

struct ImageJob {
  // The source: an encoded JPEG (data, size), or decoded packed RGB of pixels_h x pixels_w (what
  // the caller decoded itself: Pillow's result for files the engine does not decode exactly).
  const uint8_t* data = nullptr;
  size_t size = 0;
  const uint8_t* pixels = nullptr;
  int pixels_h = 0, pixels_w = 0;
  int denom = 1;                       // JPEG only: decode at DCT scale 1/denom
  int width = 0;                       // JPEG only: the image's width at that scale (the rows' room)
  int top = 0, left = 0, h = 0, w = 0;  // the box, in (scaled) decoded pixels
  int resize_h = 0, resize_w = 0;      // the box resized to this ...
  int crop_top = 0, crop_left = 0;     // ... then the out_h x out_w window from here
  bool flip = false;                   // then mirrored left-right
  bool partial = true;                 // JPEG only: decode the box's region alone
};

struct ImageTimes {
  std::atomic<int64_t> decode_ns{0}, resize_ns{0};
};

// Runs jobs[i] into out + i * 3 * out_h * out_w; errors[i] is "" or what failed (the block of
// a failed image is left unspecified: the caller must not return the batch).
void run_image_jobs(const std::vector<ImageJob>& jobs, uint8_t* out, int out_h, int out_w, int threads,
                    std::vector<std::string>* errors, ImageTimes* times);

// Reads whole files into new uint8 tensors on the pool: out[i] is the file's bytes, or undefined
// with errors[i] the error (errno's words).
void read_files(const std::vector<std::string>& paths, int threads, std::vector<at::Tensor>* out,
                std::vector<std::string>* errors);

}  // namespace fastcollate
