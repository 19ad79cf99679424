// Padding of variable-length leaves straight into the arena: tensors, numpy arrays and flat
// lists of numbers, padded to the batch's longest (rounded up, truncated), left or right, with
// a mask and per-sample lengths. Semantics: fastcollate/pad.py (its reference).
#pragma once

#include <optional>
#include <vector>

#include "python/plan.h"

namespace fastcollate {

struct PadConfig {
  std::vector<std::pair<py::object, py::object>> values;  // key -> pad value, the user's order
  int64_t multiple = 0;
  int64_t max_length = -1;
  bool left = false;
  py::object mask_key;     // None: no mask
  at::ScalarType mask_dtype = at::kLong;
  py::object lengths_key;  // None: no lengths
  py::object defer_column;  // (samples, key) -> (padded tensor, lengths): the reference, for anything irregular
  py::object defer_batch;   // (batch) -> the whole padded batch (errors of the batch's structure)

  static PadConfig parse(py::handle spec);
  const py::object* value_for(PyObject* key) const;
};

// Fills `node` with the padded column of `key`; returns the per-sample lengths.
std::vector<int64_t> pad_column(Plan& plan, Node& node, PyObject* const* samples, size_t n, const py::object& key,
                                const py::object& value, const PadConfig& cfg);

// [B, L] mask: 1 on real positions, 0 on padding.
void mask_leaf(Plan& plan, Node& node, const std::vector<int64_t>& lengths, int64_t L, const PadConfig& cfg);

// [B] int64 lengths.
void lengths_leaf(Plan& plan, Node& node, const std::vector<int64_t>& lengths);

}  // namespace fastcollate
