// Reading sample leaves: the Python/numpy types the walk dispatches on, numpy arrays as tensor
// views, which tensors the arena can hold, and the copy pieces that move their bytes.
#pragma once

#include <string>
#include <unordered_map>

#include "python/plan.h"

namespace fastcollate {

// Types looked up once (GIL held) and kept for the life of the process.
struct PyTypes {
  PyObject* mapping = nullptr;
  PyObject* mutable_mapping = nullptr;
  PyObject* sequence = nullptr;
  PyObject* mutable_sequence = nullptr;
  PyTypeObject* ndarray = nullptr;   // null without numpy
  PyObject* np_scalars = nullptr;    // (np.bool_, np.number, np.object_), as default_collate uses
  std::unordered_map<PyTypeObject*, at::ScalarType> np_scalar_dtype;
};

const PyTypes& types();

// isinstance(), raising the Python error if the check itself fails.
bool isinstance(PyObject* obj, PyObject* cls);

// default_collate's test on sample 0 of a numpy leaf: a str/bytes/object dtype ([SaUO]).
bool refused_numpy_dtype(PyObject* array);

// A tensor whose bytes the arena can hold exactly as torch.stack would produce them.
bool plain_tensor(const at::Tensor& t);

// numpy array -> a tensor sharing its memory: 1, and *out set; 0: not an ndarray; -1: an
// ndarray torch.as_tensor would refuse (or that needs its error message).
int numpy_to_tensor(PyObject* obj, at::Tensor* out);

// The buffer-protocol format string of an ndarray (false: it exports no buffer).
bool numpy_format(PyObject* obj, std::string* format);

// An ndarray's bytes read straight from its memory (no tensor made) when it is laid out as
// sample 0 (`first`, whose tensor is t0: same dtype, shape, C order); nullptr otherwise.
const uint8_t* numpy_like(PyObject* obj, PyObject* first, const std::string& format0, const at::Tensor& t0);

// The value of a numpy scalar of a built-in numeric type (exact type), `item` bytes, into out.
void numpy_scalar_bytes(PyObject* scalar, uint8_t* out, size_t item);

// Whether numpy leaves are read from numpy's structs (built with its headers) or through the
// buffer protocol.
bool numpy_structs();

// A sample tensor's first `rows` rows, copied to dst_offset (memcpy piece, or a conversion for
// strided / conjugated sources). keep: hold a reference for the GIL-free copy.
void add_rows(Plan& plan, const at::Tensor& t, int64_t rows, size_t dst_offset, bool keep);

// A sample that is not contiguous (nor conjugated), copied to a contiguous dst_offset: a
// transpose piece when it is one (HWC memory seen as CHW), else a conversion (ATen's copy_).
// Holds a reference to t for the GIL-free copy.
void add_strided(Plan& plan, const at::Tensor& t, size_t dst_offset);

// Places an already-collated tensor in the arena as `node` (a Tensor leaf).
void place_tensor(Plan& plan, Node& node, const at::Tensor& t);

}  // namespace fastcollate
