// The walk: Python containers of samples -> a Plan. It mirrors default_collate's dispatch
// (which looks at sample 0 and trusts the rest) but checks every sample; anything it cannot
// place exactly -- mixed dtypes, odd types, a shape or key mismatch -- goes to the Python
// reference, which computes default_collate's value or raises its error with the key path.
#include <ATen/TensorUtils.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cstring>

#include "python/leaves.h"
#include "python/pad.h"
#include "python/plan.h"

namespace fastcollate {
namespace {

constexpr int kMaxDepth = 200;

enum class Parent { Top, Mapping, Sequence };

// One column of the batch: borrowed objects, owned by the containers being walked.
struct Samples {
  PyObject* const* p;
  size_t n;
  size_t size() const { return n; }
  PyObject* operator[](size_t i) const { return p[i]; }
  PyObject* const* begin() const { return p; }
  PyObject* const* end() const { return p + n; }
};

// Dict keys built by the same code are usually the same object; f-string or decoded keys are
// equal strings instead (hash cached, then compared).
bool same_key(PyObject* a, PyObject* b) {
  if (a == b) return true;
  if (!PyUnicode_CheckExact(a) || !PyUnicode_CheckExact(b)) return false;
  const Py_hash_t ha = reinterpret_cast<PyASCIIObject*>(a)->hash;
  const Py_hash_t hb = reinterpret_cast<PyASCIIObject*>(b)->hash;
  if (ha != -1 && hb != -1 && ha != hb) return false;
  // equal strings are stored alike (same length, same kind of code unit): compare the units
  const Py_ssize_t n = PyUnicode_GET_LENGTH(a);
  if (n != PyUnicode_GET_LENGTH(b) || PyUnicode_KIND(a) != PyUnicode_KIND(b)) return false;
  return std::memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), static_cast<size_t>(n) * PyUnicode_KIND(a)) == 0;
}

// A Python int or bool as default_collate reads it: false for anything else (IntEnum, a
// float...: the reference decides) and for an int past int64 (torch raises; the reference says
// where).
inline bool read_int(PyObject* v, int64_t* out, bool* is_bool) {
  *is_bool = PyBool_Check(v);
  if (*is_bool) {
    *out = v == Py_True ? 1 : 0;
    return true;
  }
  if (!PyLong_CheckExact(v)) return false;
  int overflow = 0;
  *out = PyLong_AsLongLongAndOverflow(v, &overflow);
  return overflow == 0;
}

// A tensor leaf being placed: sample 0, the pattern every other sample must match, and where
// the samples' bytes go. The column walk (tensor_leaf) and the many-field pass (fused_columns)
// both judge and route each sample through it (Walker::begin_tensor sets it up).
struct TensorColumn {
  const at::Tensor* t0 = nullptr;
  caffe2::TypeMeta dtype;
  c10::DispatchKeySet keys;
  size_t per = 0;     // bytes per sample
  size_t offset = 0;  // of the leaf in the arena
  bool bits = false;  // conjugate / negative bit: copied by a conversion
  at::MemoryFormat fmt = at::MemoryFormat::Contiguous;
  std::vector<int64_t> fmt_strides;  // per sample, torch.stack's format; empty: a contiguous batch

  // Whether sample t (after sample 0) joins the leaf. Another dtype means type promotion (and,
  // in a worker, casting rules); equal dispatch keys mean the same device, layout, and
  // conj/neg/zero bits as sample 0; anything else is torch's to decide, via the reference.
  bool matches(const at::Tensor& t) const {
    return t.dtype() == dtype && t.key_set() == keys && t.sizes() == t0->sizes() && !t.requires_grad() &&
           (fmt_strides.empty() || t.suggest_memory_format() == fmt);
  }

  // How sample t's bytes reach the arena: one memcpy piece when laid out as the batch is; a
  // strided source as add_strided copies it (a transpose, or ATen's copy_); else (conj/neg bits,
  // another memory format) an ATen conversion into the batch's layout.
  enum class Route { Dense, Strided, Convert };
  Route route(const at::Tensor& t) const {
    if (!bits && (fmt_strides.empty() ? t.is_contiguous() : t.strides() == c10::IntArrayRef(fmt_strides))) {
      return Route::Dense;
    }
    return fmt_strides.empty() && !bits ? Route::Strided : Route::Convert;
  }

  Conversion conversion(const at::Tensor& t, size_t dst) const {
    return {t, t.scalar_type(), t.sizes().vec(), dst, fmt_strides};
  }
};

// A column of the fused sample-major pass (see Walker::fused_columns).
struct FusedColumn {
  enum Kind : uint8_t { kNone, kTensor, kFloat, kInt };
  Kind kind = kNone;
  bool ok = true;
  bool all_bool = true;
  TensorColumn tensor;
  std::vector<Conversion> conversions;
  std::vector<std::pair<const at::Tensor*, size_t>> strided;  // (sample, dst): add_strided on success
  std::vector<double> floats;
  std::vector<int64_t> ints;
};

class Walker {
 public:
  Walker(Plan& plan, py::handle batch, py::handle defer_fn, const PadConfig* pad, bool keep_formats)
      : plan_(plan), batch_(batch), defer_fn_(defer_fn), pad_(pad), keep_formats_(keep_formats) {}

  void walk(Node& node, Samples samples, Parent parent, int depth) {
    if (depth > kMaxDepth) return defer(node, samples, parent);
    PyObject* e = samples[0];
    const PyTypes& T = types();
    if (pad_ != nullptr && parent == Parent::Top && !(PyDict_Check(e) || isinstance(e, T.mapping))) {
      return defer(node, samples, parent);  // pad= needs mapping samples: the reference says so
    }
    if (THPVariable_CheckExact(e)) return tensor_leaf(node, samples, parent, /*numpy=*/false);
    if (THPVariable_Check(e)) return defer(node, samples, parent);  // subclasses: torch.stack decides
    if (T.ndarray != nullptr && PyObject_TypeCheck(e, T.ndarray)) return numpy_leaf(node, samples, parent);
    if (T.np_scalars != nullptr && isinstance(e, T.np_scalars)) return numpy_scalar_leaf(node, samples, parent);
    if (PyFloat_Check(e)) return float_leaf(node, samples, parent);
    if (PyLong_Check(e)) return int_leaf(node, samples, parent);
    if (PyUnicode_Check(e) || PyBytes_Check(e)) {
      node.kind = NodeKind::Object;
      node.obj = container(samples, parent);
      return;
    }
    if (PyDict_Check(e) || isinstance(e, T.mapping)) return mapping(node, samples, parent, depth);
    if (PyTuple_Check(e) && !PyTuple_CheckExact(e) && PyObject_HasAttrString(e, "_fields")) {
      return named_tuple(node, samples, parent, depth);
    }
    if (PyList_Check(e) || PyTuple_Check(e) || isinstance(e, T.sequence)) return sequence(node, samples, parent, depth);
    defer(node, samples, parent);  // the reference raises default_collate's TypeError, with the path
  }

 private:
  // The samples as default_collate's recursion would hold them: the batch itself at the top,
  // a list under a mapping, a tuple (from zip) under a sequence.
  py::object container(Samples samples, Parent parent) {
    if (parent == Parent::Top) return py::reinterpret_borrow<py::object>(batch_);
    const Py_ssize_t n = static_cast<Py_ssize_t>(samples.size());
    if (parent == Parent::Mapping) {
      py::list out(n);
      for (Py_ssize_t i = 0; i < n; ++i) out[i] = py::reinterpret_borrow<py::object>(samples[i]);
      return std::move(out);
    }
    py::tuple out(n);
    for (Py_ssize_t i = 0; i < n; ++i) out[i] = py::reinterpret_borrow<py::object>(samples[i]);
    return std::move(out);
  }

  void defer(Node& node, Samples samples, Parent parent) {
    // with pad=, the structure of the whole batch is the padding reference's to judge
    py::object result = (pad_ != nullptr && parent == Parent::Top)
                            ? pad_->defer_batch(batch_)
                            : defer_fn_(container(samples, parent), py::tuple(py::cast(path_)));
    ++plan_.deferred;
    node.children.clear();
    node.keys.clear();
    if (THPVariable_CheckExact(result.ptr())) {
      const at::Tensor& t = THPVariable_Unpack(result.ptr());
      if (plain_tensor(t)) return place_tensor(plan_, node, t);
    }
    node.kind = NodeKind::Object;
    node.obj = std::move(result);
  }

  // torch.stack(samples) outside a worker is cat(samples, 0).view(B, ...): 4-D (5-D) samples
  // that all suggest channels_last (3d) give a batch in that format. The per-sample strides
  // of that format, or empty for a contiguous batch (and always empty in a worker).
  std::vector<int64_t> stack_format(const at::Tensor& t0, at::MemoryFormat* fmt) const {
    *fmt = at::MemoryFormat::Contiguous;
    if (!keep_formats_ || (t0.dim() != 4 && t0.dim() != 5)) return {};
    *fmt = t0.suggest_memory_format();
    if (*fmt == at::MemoryFormat::ChannelsLast) return c10::get_channels_last_strides_2d(t0.sizes());
    if (*fmt == at::MemoryFormat::ChannelsLast3d) return c10::get_channels_last_strides_3d(t0.sizes());
    return {};
  }

  // The batch's strides, as torch computes them: cat's [B*N, ...] output in `fmt`, viewed as
  // [B, N, ...] (size-1 dims get view's strides, not the format's). Empty: contiguous.
  static std::vector<int64_t> batch_strides(const std::vector<int64_t>& sample_strides, at::MemoryFormat fmt,
                                            c10::IntArrayRef sizes, size_t B) {
    if (sample_strides.empty()) return {};
    std::vector<int64_t> cat_sizes = sizes.vec();
    cat_sizes[0] *= static_cast<int64_t>(B);
    const std::vector<int64_t> cat_strides = fmt == at::MemoryFormat::ChannelsLast
                                                 ? c10::get_channels_last_strides_2d(cat_sizes)
                                                 : c10::get_channels_last_strides_3d(cat_sizes);
    std::vector<int64_t> out_sizes{static_cast<int64_t>(B)};
    out_sizes.insert(out_sizes.end(), sizes.begin(), sizes.end());
    auto out = at::detail::computeStride(cat_sizes, cat_strides, out_sizes);
    TORCH_CHECK(out.has_value(), "fastcollate: internal: a stacked batch's strides are not a view");
    return std::move(*out);
  }

  // Sample 0 of a tensor leaf of B samples: false when it is off the fast path (the reference
  // decides); else c describes the leaf and its bytes are reserved in the arena.
  bool begin_tensor(TensorColumn& c, const at::Tensor& t0, bool numpy, size_t B) {
    if (!plain_tensor(t0)) return false;
    c.bits = t0.is_conj() || t0.is_neg();
    // in a worker default_collate builds its out= from sample 0 (elem.new(storage)), which torch
    // refuses for a conj/neg view: its error, from the reference, rather than a batch it never gives
    if (c.bits && !keep_formats_) return false;
    c.t0 = &t0;
    c.dtype = t0.dtype();
    c.keys = t0.key_set();
    c.per = static_cast<size_t>(t0.numel()) * t0.element_size();
    if (!numpy) c.fmt_strides = stack_format(t0, &c.fmt);
    c.offset = plan_.reserve(c.per * B);
    return true;
  }

  // The leaf's node, once every sample has been placed.
  void tensor_node(Node& node, const TensorColumn& c, size_t B) {
    const c10::IntArrayRef sizes = c.t0->sizes();
    node.kind = NodeKind::Tensor;
    node.strides = batch_strides(c.fmt_strides, c.fmt, sizes, B);
    node.dtype = c.t0->scalar_type();
    node.sizes.reserve(sizes.size() + 1);
    node.sizes.push_back(static_cast<int64_t>(B));
    node.sizes.insert(node.sizes.end(), sizes.begin(), sizes.end());
    node.nbytes = c.per * B;
    node.offset = c.offset;
    ++plan_.tensor_leaves;
  }

  void tensor_leaf(Node& node, Samples samples, Parent parent, bool numpy) {
    const size_t B = samples.size();
    // Borrowed: the samples' Python objects (or `made`, for numpy) own these tensors.
    std::vector<const at::Tensor*> ts(B);
    std::vector<at::Tensor> made;
    if (numpy) {
      made.reserve(B);
      for (size_t i = 0; i < B; ++i) {
        at::Tensor t;
        if (numpy_to_tensor(samples[i], &t) != 1) return defer(node, samples, parent);  // the reference raises
        made.push_back(std::move(t));
        ts[i] = &made.back();
      }
    } else {
      for (size_t i = 0; i < B; ++i) {
        if (!THPVariable_CheckExact(samples[i])) return defer(node, samples, parent);
        ts[i] = &THPVariable_Unpack(samples[i]);
      }
    }
    // One pass checks each sample and records its piece; a sample that does not fit rolls the
    // leaf back (every route's pieces: memcpy, transpose, conversion) and defers it, so large
    // batches touch each tensor's metadata once and a deferred leaf has nothing left to copy.
    const Plan::Mark before = plan_.mark();
    TensorColumn c;
    if (!begin_tensor(c, *ts[0], numpy, B)) return defer(node, samples, parent);
    plan_.pieces.reserve(plan_.pieces.size() + B);
    if (!numpy) plan_.keep_objects.reserve(plan_.keep_objects.size() + B);
    for (size_t i = 0; i < B; ++i) {
      const at::Tensor& t = *ts[i];
      if (i > 0 && !c.matches(t)) {
        plan_.rollback(before);
        return defer(node, samples, parent);
      }
      if (c.per == 0) continue;
      const size_t dst = c.offset + i * c.per;
      switch (c.route(t)) {
        case TensorColumn::Route::Dense:
          plan_.pieces.push_back({static_cast<const uint8_t*>(t.const_data_ptr()), dst, c.per});
          if (numpy) plan_.keep_alive.push_back(t);
          else plan_.keep_objects.push_back(py::reinterpret_borrow<py::object>(samples[i]));
          break;
        case TensorColumn::Route::Strided:
          add_strided(plan_, t, dst);
          break;
        case TensorColumn::Route::Convert:
          plan_.conversions.push_back(c.conversion(t, dst));
          break;
      }
    }
    tensor_node(node, c, B);
  }

  void numpy_leaf(Node& node, Samples samples, Parent parent) {
    if (refused_numpy_dtype(samples[0])) return defer(node, samples, parent);  // the reference raises TypeError
    if (!numpy_direct(node, samples)) tensor_leaf(node, samples, parent, /*numpy=*/true);
  }

  // The common numpy column -- every array laid out as sample 0, C-contiguous -- read from the
  // arrays' buffers: one tensor made for sample 0 (its dtype, as torch.as_tensor gives it), a
  // buffer-protocol read for the rest. Anything else (and any doubt) goes the tensor way.
  bool numpy_direct(Node& node, Samples samples) {
    const size_t B = samples.size();
    at::Tensor t0;
    std::string format0;
    if (numpy_to_tensor(samples[0], &t0) != 1 || !plain_tensor(t0) || !t0.is_contiguous() ||
        !numpy_format(samples[0], &format0)) {
      return false;
    }
    const size_t per = static_cast<size_t>(t0.numel()) * t0.element_size();
    std::vector<const uint8_t*> srcs(B);
    srcs[0] = static_cast<const uint8_t*>(t0.const_data_ptr());
    for (size_t i = 1; i < B; ++i) {
      srcs[i] = numpy_like(samples[i], samples[0], format0, t0);
      if (srcs[i] == nullptr) return false;
    }
    const size_t offset = plan_.reserve(per * B);
    if (per > 0) {
      plan_.pieces.reserve(plan_.pieces.size() + B);
      plan_.keep_objects.reserve(plan_.keep_objects.size() + B);
      for (size_t i = 0; i < B; ++i) {
        plan_.pieces.push_back({srcs[i], offset + i * per, per});
        plan_.keep_objects.push_back(py::reinterpret_borrow<py::object>(samples[i]));
      }
    }
    node.kind = NodeKind::Tensor;
    node.dtype = t0.scalar_type();
    node.sizes.clear();
    node.sizes.push_back(static_cast<int64_t>(B));
    node.sizes.insert(node.sizes.end(), t0.sizes().begin(), t0.sizes().end());
    node.strides.clear();
    node.nbytes = per * B;
    node.offset = offset;
    ++plan_.tensor_leaves;
    return true;
  }

  // A 1-D leaf of one scalar per sample, written into the plan's scalar buffer.
  uint8_t* scalar_leaf(Node& node, at::ScalarType dtype, size_t B) {
    const size_t item = c10::elementSize(dtype);
    node.kind = NodeKind::Tensor;
    node.dtype = dtype;
    node.sizes = {static_cast<int64_t>(B)};
    node.nbytes = item * B;
    node.offset = plan_.reserve(node.nbytes);
    ++plan_.tensor_leaves;
    const size_t at = plan_.scalars.size();
    plan_.scalars.resize(at + node.nbytes);
    plan_.scalar_pieces.push_back({at, node.offset, node.nbytes});
    return plan_.scalars.data() + at;
  }

  void numpy_scalar_leaf(Node& node, Samples samples, Parent parent) {
    PyTypeObject* type = Py_TYPE(samples[0]);
    auto it = types().np_scalar_dtype.find(type);
    if (it == types().np_scalar_dtype.end()) return defer(node, samples, parent);
    for (PyObject* s : samples) {
      if (Py_TYPE(s) != type) return defer(node, samples, parent);  // mixed: torch.as_tensor promotes
    }
    const size_t item = c10::elementSize(it->second);
    uint8_t* out = scalar_leaf(node, it->second, samples.size());
    for (PyObject* s : samples) {
      numpy_scalar_bytes(s, out, item);
      out += item;
    }
  }

  void float_leaf(Node& node, Samples samples, Parent parent) {
    for (PyObject* s : samples) {
      if (!PyFloat_CheckExact(s)) return defer(node, samples, parent);
    }
    double* out = reinterpret_cast<double*>(scalar_leaf(node, at::kDouble, samples.size()));
    for (PyObject* s : samples) {
      const double v = PyFloat_AS_DOUBLE(s);
      std::memcpy(out++, &v, sizeof v);
    }
  }

  void int_leaf(Node& node, Samples samples, Parent parent) {
    std::vector<int64_t> values(samples.size());
    bool all_bool = true;
    for (size_t i = 0; i < samples.size(); ++i) {
      bool b;
      if (!read_int(samples[i], &values[i], &b)) return defer(node, samples, parent);
      all_bool = all_bool && b;
    }
    int_node(node, values, all_bool);
  }

  // A [B] leaf of the values read_int read: bool when every sample was a bool (default_collate
  // of bools), else int64 (of ints, or ints mixed with bools).
  void int_node(Node& node, const std::vector<int64_t>& values, bool all_bool) {
    const size_t B = values.size();
    if (all_bool) {
      uint8_t* out = scalar_leaf(node, at::kBool, B);
      for (size_t i = 0; i < B; ++i) out[i] = static_cast<uint8_t>(values[i]);
      return;
    }
    std::memcpy(scalar_leaf(node, at::kLong, B), values.data(), B * sizeof(int64_t));
  }

  void mapping(Node& node, Samples samples, Parent parent, int depth) {
    PyObject* e = samples[0];
    node.elem = py::reinterpret_borrow<py::object>(e);
    if (PyDict_CheckExact(e)) {
      node.kind = NodeKind::Dict;
      PyObject *key, *value;
      Py_ssize_t pos = 0;
      while (PyDict_Next(e, &pos, &key, &value)) node.keys.push_back(py::reinterpret_borrow<py::object>(key));
    } else {
      node.kind = isinstance(e, types().mutable_mapping) ? NodeKind::MappingCopy : NodeKind::MappingConstruct;
      for (py::handle key : py::reinterpret_borrow<py::iterable>(e)) node.keys.push_back(py::reinterpret_borrow<py::object>(key));
    }
    const size_t B = samples.size();
    const size_t K = node.keys.size();
    std::vector<PyObject*> table(K * B);  // column k is table[k*B .. k*B + B)
    std::vector<py::object> owned;        // values a non-dict __getitem__ returned as new references
    for (size_t i = 0; i < B; ++i) {
      PyObject* d = samples[i];
      // Samples built by the same code hold the same key objects in the same order: one pass
      // over the dict replaces K hash lookups.
      if (PyDict_CheckExact(d) && static_cast<size_t>(PyDict_GET_SIZE(d)) == K) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        size_t k = 0;
        while (k < K && PyDict_Next(d, &pos, &key, &value) && same_key(key, node.keys[k].ptr())) table[k++ * B + i] = value;
        if (k == K) continue;
      }
      for (size_t k = 0; k < K; ++k) {
        PyObject* v;
        if (PyDict_CheckExact(d)) {
          v = PyDict_GetItemWithError(d, node.keys[k].ptr());
          if (v == nullptr && PyErr_Occurred()) throw py::error_already_set();
        } else {
          v = PyObject_GetItem(d, node.keys[k].ptr());
          if (v != nullptr) owned.push_back(py::reinterpret_steal<py::object>(v));
          else PyErr_Clear();
        }
        if (v == nullptr) return defer(node, samples, parent);  // the reference names the missing key
        table[k * B + i] = v;
      }
    }
    const PadConfig* pad = parent == Parent::Top ? pad_ : nullptr;
    if (pad != nullptr) {
      // every padded key in sample 0, and no clash with the mask/lengths keys
      for (const auto& kv : pad->values) {
        if (std::none_of(node.keys.begin(), node.keys.end(), [&](const py::object& k) { return k.equal(kv.first); })) {
          return defer(node, samples, parent);
        }
      }
      for (const py::object* extra : {&pad->mask_key, &pad->lengths_key}) {
        if (!extra->is_none() &&
            std::any_of(node.keys.begin(), node.keys.end(), [&](const py::object& k) { return k.equal(*extra); })) {
          return defer(node, samples, parent);
        }
      }
    }
    node.children.resize(K);
    std::vector<char> done(K, 0);
    if (pad == nullptr) fused_columns(node, table, K, B, done);
    std::vector<int64_t> first_lengths;
    int64_t first_L = 0;
    for (size_t k = 0; k < K; ++k) {
      if (done[k]) continue;
      const py::object* value = pad != nullptr ? pad->value_for(node.keys[k].ptr()) : nullptr;
      if (value != nullptr) {
        std::vector<int64_t> lengths =
            pad_column(plan_, node.children[k], table.data() + k * B, B, node.keys[k], *value, *pad);
        if (node.keys[k].equal(pad->values[0].first)) {
          first_lengths = std::move(lengths);
          first_L = node.children[k].sizes.size() > 1 ? node.children[k].sizes[1] : 0;
        }
        continue;
      }
      path_.push_back(node.keys[k]);
      walk(node.children[k], Samples{table.data() + k * B, B}, Parent::Mapping, depth + 1);
      path_.pop_back();
    }
    if (pad != nullptr) {
      if (!pad->mask_key.is_none()) {
        node.keys.push_back(pad->mask_key);
        node.children.emplace_back();
        mask_leaf(plan_, node.children.back(), first_lengths, first_L, *pad);
      }
      if (!pad->lengths_key.is_none()) {
        node.keys.push_back(pad->lengths_key);
        node.children.emplace_back();
        lengths_leaf(plan_, node.children.back(), first_lengths);
      }
    }
  }

  // Every sample as a list/tuple of its items (zip(*batch) iterates them the same way).
  bool items_of(Samples samples, std::vector<py::object>& fast) {
    fast.reserve(samples.size());
    for (PyObject* s : samples) {
      PyObject* f = PySequence_Fast(s, "");
      if (f == nullptr) {
        PyErr_Clear();
        return false;
      }
      fast.push_back(py::reinterpret_steal<py::object>(f));
    }
    return true;
  }

  void columns(Node& node, const std::vector<py::object>& fast, size_t width, int depth) {
    const size_t B = fast.size();
    std::vector<PyObject*> table(width * B);  // column j is table[j*B .. j*B + B)
    for (size_t i = 0; i < B; ++i) {
      PyObject** items = PySequence_Fast_ITEMS(fast[i].ptr());
      for (size_t j = 0; j < width; ++j) table[j * B + i] = items[j];
    }
    node.children.resize(width);
    std::vector<char> done(width, 0);
    fused_columns(node, table, width, B, done);
    for (size_t j = 0; j < width; ++j) {
      if (done[j]) continue;
      path_.push_back(py::int_(j));
      walk(node.children[j], Samples{table.data() + j * B, B}, Parent::Sequence, depth + 1);
      path_.pop_back();
    }
  }

  // The columns whose sample-0 value is an exact tensor, float, int or bool, placed in ONE
  // sample-major pass: samples built by the same code allocate their leaves together, so
  // reading each sample's values together is cache-friendly where a walk key by key touches B
  // scattered TensorImpls and floats once per key. The checks are the column walk's own; a
  // column with any value off its pattern is left to the column walk (done[k] stays 0), which
  // then decides exactly as before (promotion, errors, the reference).
  void fused_columns(Node& node, const std::vector<PyObject*>& table, size_t K, size_t B, std::vector<char>& done) {
    std::vector<FusedColumn> cols(K);
    size_t eligible = 0;
    for (size_t k = 0; k < K; ++k) {
      PyObject* v0 = table[k * B];
      FusedColumn& c = cols[k];
      if (THPVariable_CheckExact(v0)) {
        // sample 0 off the fast path (a conj/neg view in a worker, say): the column walk decides
        if (!begin_tensor(c.tensor, THPVariable_Unpack(v0), /*numpy=*/false, B)) continue;
        c.kind = FusedColumn::kTensor;
      } else if (PyFloat_CheckExact(v0)) {
        c.kind = FusedColumn::kFloat;
        c.floats.resize(B);
      } else if (PyBool_Check(v0) || PyLong_CheckExact(v0)) {
        c.kind = FusedColumn::kInt;
        c.ints.resize(B);
      } else {
        continue;
      }
      ++eligible;
    }
    if (eligible == 0) return;
    // pieces go straight into the plan, in sample order (the sources are read in that order
    // too); a column that fails takes its own back out below
    const size_t pieces0 = plan_.pieces.size();
    plan_.pieces.reserve(pieces0 + eligible * B);
    bool failed_tensor = false;
    for (size_t i = 0; i < B; ++i) {
      for (size_t k = 0; k < K; ++k) {
        FusedColumn& c = cols[k];
        if (c.kind == FusedColumn::kNone || !c.ok) continue;
        PyObject* v = table[k * B + i];
        if (c.kind == FusedColumn::kTensor) {
          if (!THPVariable_CheckExact(v)) {
            c.ok = false;
            failed_tensor = true;
            continue;
          }
          const at::Tensor& t = THPVariable_Unpack(v);
          const TensorColumn& tc = c.tensor;
          if (i > 0 && !tc.matches(t)) {
            c.ok = false;
            failed_tensor = true;
            continue;
          }
          if (tc.per == 0) continue;
          const size_t dst = tc.offset + i * tc.per;
          switch (tc.route(t)) {  // strided and converted samples join the plan once the column is whole
            case TensorColumn::Route::Dense:
              plan_.pieces.push_back({static_cast<const uint8_t*>(t.const_data_ptr()), dst, tc.per});
              plan_.keep_objects.push_back(py::reinterpret_borrow<py::object>(v));
              break;
            case TensorColumn::Route::Strided:
              c.strided.push_back({&t, dst});
              break;
            case TensorColumn::Route::Convert:
              c.conversions.push_back(tc.conversion(t, dst));
              break;
          }
        } else if (c.kind == FusedColumn::kFloat) {
          if (PyFloat_CheckExact(v)) c.floats[i] = PyFloat_AS_DOUBLE(v);
          else c.ok = false;
        } else {
          bool b;
          if (read_int(v, &c.ints[i], &b)) c.all_bool = c.all_bool && b;
          else c.ok = false;  // int_leaf defers it
        }
      }
    }
    if (failed_tensor) {  // rare: drop the pieces of the columns the column walk will redo
      auto dropped = [&](const CopyPiece& p) {
        for (const FusedColumn& c : cols) {
          if (c.kind == FusedColumn::kTensor && !c.ok && p.dst_offset >= c.tensor.offset &&
              p.dst_offset < c.tensor.offset + c.tensor.per * B)
            return true;
        }
        return false;
      };
      plan_.pieces.erase(std::remove_if(plan_.pieces.begin() + pieces0, plan_.pieces.end(), dropped), plan_.pieces.end());
    }
    for (size_t k = 0; k < K; ++k) {
      FusedColumn& c = cols[k];
      if (c.kind == FusedColumn::kNone || !c.ok) continue;  // a tensor column's reservation stays as slack
      Node& child = node.children[k];
      done[k] = 1;
      if (c.kind == FusedColumn::kTensor) {
        for (auto& conv : c.conversions) plan_.conversions.push_back(std::move(conv));
        for (const auto& [t, dst] : c.strided) add_strided(plan_, *t, dst);
        tensor_node(child, c.tensor, B);
      } else if (c.kind == FusedColumn::kFloat) {
        std::memcpy(scalar_leaf(child, at::kDouble, B), c.floats.data(), B * sizeof(double));
      } else {
        int_node(child, c.ints, c.all_bool);
      }
    }
  }

  void named_tuple(Node& node, Samples samples, Parent parent, int depth) {
    std::vector<py::object> fast;
    if (!items_of(samples, fast)) return defer(node, samples, parent);
    size_t width = static_cast<size_t>(PySequence_Fast_GET_SIZE(fast[0].ptr()));
    for (const auto& f : fast) width = std::min(width, static_cast<size_t>(PySequence_Fast_GET_SIZE(f.ptr())));  // zip stops at the shortest
    // fewer fields than sample 0's type takes: default_collate raises when it builds the tuple,
    // before it looks at anything after it -- the reference does the same, in the same order
    if (width != static_cast<size_t>(PySequence_Fast_GET_SIZE(fast[0].ptr()))) return defer(node, samples, parent);
    node.kind = NodeKind::NamedTuple;
    node.elem = py::reinterpret_borrow<py::object>(samples[0]);
    columns(node, fast, width, depth);
  }

  void sequence(Node& node, Samples samples, Parent parent, int depth) {
    PyObject* e = samples[0];
    const Py_ssize_t width = PyObject_Length(e);
    if (width < 0) {
      PyErr_Clear();
      return defer(node, samples, parent);
    }
    for (PyObject* s : samples) {
      const Py_ssize_t n = PyObject_Length(s);
      if (n != width) {
        if (n < 0) PyErr_Clear();
        return defer(node, samples, parent);  // the reference raises the length RuntimeError
      }
    }
    std::vector<py::object> fast;
    if (!items_of(samples, fast)) return defer(node, samples, parent);
    for (const auto& f : fast) {
      if (PySequence_Fast_GET_SIZE(f.ptr()) != width) return defer(node, samples, parent);
    }
    if (PyTuple_Check(e) || PyList_CheckExact(e)) {
      node.kind = NodeKind::List;
    } else {
      node.kind = isinstance(e, types().mutable_sequence) ? NodeKind::SeqCopy : NodeKind::SeqConstruct;
    }
    node.elem = py::reinterpret_borrow<py::object>(e);
    columns(node, fast, static_cast<size_t>(width), depth);
  }

  Plan& plan_;
  py::handle batch_;
  py::handle defer_fn_;
  const PadConfig* pad_;
  const bool keep_formats_;  // false exactly in DataLoader workers
  std::vector<py::object> path_;
};

}  // namespace

Plan build_plan(py::handle batch, py::handle defer_fn, const PadConfig* pad, bool keep_formats) {
  Plan plan;
  Walker walker(plan, batch, defer_fn, pad, keep_formats);
  py::object fast;
  // only real sequences: PySequence_Fast would silently drain a generator default_collate rejects
  if (PySequence_Check(batch.ptr())) {
    PyObject* f = PySequence_Fast(batch.ptr(), "");
    if (f == nullptr) PyErr_Clear();
    else fast = py::reinterpret_steal<py::object>(f);
  }
  if (fast && PySequence_Fast_GET_SIZE(fast.ptr()) > 0) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast.ptr());
    walker.walk(plan.root, Samples{PySequence_Fast_ITEMS(fast.ptr()), static_cast<size_t>(n)}, Parent::Top, 0);
  } else {
    // empty or not a sequence: the reference raises default_collate's error, better worded
    plan.root.kind = NodeKind::Object;
    plan.root.obj = pad != nullptr ? pad->defer_batch(batch)
                                   : py::reinterpret_borrow<py::object>(defer_fn)(batch, py::tuple());
  }
  for (const ScalarPiece& s : plan.scalar_pieces) {
    plan.pieces.push_back({plan.scalars.data() + s.src_offset, s.dst_offset, s.nbytes});
  }
  return plan;
}

}  // namespace fastcollate
