// The image stage's bindings (GIL held while Python objects are read; released around the
// engine's work): file reads, JPEG headers, one decode, and a batch of image jobs into an arena
// (engine/jpeg.h, engine/image_batch.h). fastcollate.images is the Python side.
#include <torch/csrc/utils/pybind.h>
#include <ATen/ops/empty.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings/register.h"
#include "engine/image_batch.h"
#include "engine/jpeg.h"
#include "python/nogil.h"

namespace fastcollate {
namespace {

// One image of a batch as fastcollate.images builds it: _C.ImageJob(data=..., top=..., ...).
struct PyImageJob {
  std::optional<at::Tensor> data;    // the encoded file (uint8, 1-D)
  std::optional<at::Tensor> pixels;  // or its decoded RGB (uint8 [H, W, 3], contiguous)
  int denom = 1, width = 0, top = 0, left = 0, h = 0, w = 0, resize_h = 0, resize_w = 0, crop_top = 0, crop_left = 0;
  bool flip = false, partial = true;
};

void check_bytes(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kByte && t.dim() == 1 && t.is_contiguous(),
              what, " must be a contiguous 1-D uint8 CPU tensor, got ", t.scalar_type(), " of shape ", t.sizes());
}

py::dict header_dict(const JpegHeader& h) {
  py::dict d;
  d["width"] = h.width;
  d["height"] = h.height;
  d["components"] = h.components;
  d["color_space"] = h.color_space;
  d["progressive"] = h.progressive;
  d["arithmetic"] = h.arithmetic;
  d["precision"] = h.precision;
  d["imcu_width"] = h.imcu_width;
  d["imcu_height"] = h.imcu_height;
  d["exact"] = h.exact;
  d["why"] = h.why;
  return d;
}

// The header of each encoded file: a dict, or the error's words (a str).
py::list jpeg_headers(const std::vector<at::Tensor>& files) {
  py::list out;
  for (const at::Tensor& f : files) {
    check_bytes(f, "an encoded image");
    JpegHeader h;
    const std::string err = jpeg_read_header(f.data_ptr<uint8_t>(), static_cast<size_t>(f.numel()), &h);
    if (err.empty()) {
      out.append(header_dict(h));
    } else {
      out.append(py::str(err));
    }
  }
  return out;
}

at::Tensor jpeg_decode(const at::Tensor& data, int denom, int top, int left, int h, int w, bool partial) {
  check_bytes(data, "data");
  TORCH_CHECK(h > 0 && w > 0, "jpeg_decode: the region must not be empty, got ", h, "x", w);
  at::Tensor out = at::empty({h, w, 3}, at::kByte);
  std::string err;
  {
    NoGil no_gil;
    err = jpeg_decode_region(data.data_ptr<uint8_t>(), static_cast<size_t>(data.numel()), denom, top, left, h, w,
                             partial, out.data_ptr<uint8_t>());
  }
  if (!err.empty()) throw py::value_error(err);
  return out;
}

py::tuple image_batch(at::Tensor out, const std::vector<PyImageJob>& jobs, int threads) {
  TORCH_CHECK(out.device().is_cpu() && out.scalar_type() == at::kByte && out.dim() == 4 && out.size(1) == 3 &&
                  out.is_contiguous() && out.size(0) == static_cast<int64_t>(jobs.size()),
              "image_batch: out must be a contiguous uint8 [", jobs.size(), ", 3, H, W] tensor, got ",
              out.scalar_type(), " of shape ", out.sizes());
  std::vector<ImageJob> plain(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    const PyImageJob& p = jobs[i];
    ImageJob& j = plain[i];
    if (p.pixels.has_value()) {
      const at::Tensor& px = *p.pixels;
      TORCH_CHECK(px.device().is_cpu() && px.scalar_type() == at::kByte && px.dim() == 3 && px.size(2) == 3 &&
                      px.is_contiguous(),
                  "image_batch: job ", i, ": pixels must be a contiguous uint8 [H, W, 3] CPU tensor, got ",
                  px.scalar_type(), " of shape ", px.sizes(), " on ", px.device());
      j.pixels = px.data_ptr<uint8_t>();
      j.pixels_h = static_cast<int>(px.size(0));
      j.pixels_w = static_cast<int>(px.size(1));
    } else {
      TORCH_CHECK(p.data.has_value(), "image_batch: job ", i, " has neither data nor pixels");
      check_bytes(*p.data, "an encoded image");
      j.data = p.data->data_ptr<uint8_t>();
      j.size = static_cast<size_t>(p.data->numel());
    }
    j.denom = p.denom;
    j.width = p.width;
    j.top = p.top, j.left = p.left, j.h = p.h, j.w = p.w;
    j.resize_h = p.resize_h, j.resize_w = p.resize_w, j.crop_top = p.crop_top, j.crop_left = p.crop_left;
    j.flip = p.flip, j.partial = p.partial;
  }
  std::vector<std::string> errors;
  ImageTimes times;
  {
    NoGil no_gil;
    run_image_jobs(plain, out.data_ptr<uint8_t>(), static_cast<int>(out.size(2)), static_cast<int>(out.size(3)),
                   threads, &errors, &times);
  }
  return py::make_tuple(errors, times.decode_ns.load() * 1e-9, times.resize_ns.load() * 1e-9);
}

// Each file's bytes (a uint8 tensor), or the error's words (a str).
py::list image_read(const std::vector<std::string>& paths, int threads) {
  std::vector<at::Tensor> files;
  std::vector<std::string> errors;
  {
    NoGil no_gil;
    read_files(paths, threads, &files, &errors);
  }
  py::list out;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (errors[i].empty()) {
      out.append(files[i]);
    } else {
      out.append(py::str(errors[i]));
    }
  }
  return out;
}

}  // namespace

void register_image_ops(py::module_& m) {
  py::class_<PyImageJob>(m, "ImageJob", "One image of a batch for image_batch (fastcollate.images builds them).")
      .def(py::init([](std::optional<at::Tensor> data, std::optional<at::Tensor> pixels, int denom, int width, int top,
                       int left, int h, int w, int resize_h, int resize_w, int crop_top, int crop_left, bool flip,
                       bool partial) {
             return PyImageJob{std::move(data), std::move(pixels), denom, width, top, left, h, w, resize_h, resize_w,
                               crop_top, crop_left, flip, partial};
           }),
           py::kw_only(), py::arg("data") = py::none(), py::arg("pixels") = py::none(), py::arg("denom") = 1,
           py::arg("width") = 0,
           py::arg("top"), py::arg("left"), py::arg("h"), py::arg("w"), py::arg("resize_h"), py::arg("resize_w"),
           py::arg("crop_top") = 0, py::arg("crop_left") = 0, py::arg("flip") = false, py::arg("partial") = true);
  m.def("image_read", &image_read, py::arg("paths"), py::arg("threads"));
  m.def("jpeg_headers", &jpeg_headers, py::arg("files"));
  m.def("jpeg_decode", &jpeg_decode, py::arg("data"), py::arg("denom"), py::arg("top"), py::arg("left"), py::arg("h"),
        py::arg("w"), py::arg("partial"));
  m.def("image_batch", &image_batch, py::arg("out"), py::arg("jobs"), py::arg("threads"));
  m.attr("jpeg_available") = jpeg_available();
  m.attr("jpeg_version") = jpeg_version();
}

}  // namespace fastcollate
