// The plan of one batch: what the walk of the samples found (leaf shapes, dtypes, arena
// offsets, the byte pieces to copy) and the container skeleton to rebuild around the views.
#pragma once

#include <ATen/ATen.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/arena.h"

namespace fastcollate {

namespace py = pybind11;

enum class NodeKind : uint8_t {
  Tensor,            // a leaf living in the arena
  Object,            // put in the output as it is (lists of str, results left outside the arena)
  Dict,              // sample 0 is an exact dict: a new dict with the same keys, in order
  MappingCopy,       // other MutableMapping: copy.copy(sample 0), then update()
  MappingConstruct,  // other Mapping: type(sample 0)(dict)
  NamedTuple,        // type(sample 0)(*fields)
  List,              // tuples and lists: a new list
  SeqCopy,           // other MutableSequence: copy.copy(sample 0), then item assignment
  SeqConstruct,      // other Sequence: type(sample 0)(list)
};

struct Node {
  NodeKind kind = NodeKind::Object;
  // Tensor
  at::ScalarType dtype = at::kByte;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // empty: contiguous (else the memory format torch.stack gives)
  size_t offset = 0;
  size_t nbytes = 0;
  // Object
  py::object obj;
  // containers
  py::object elem;
  std::vector<py::object> keys;
  std::vector<Node> children;
};

struct ScalarPiece {
  size_t src_offset;  // into Plan::scalars
  size_t dst_offset;
  size_t nbytes;
};

// The writes into the arena (pieces, conversions, transposes, fills: engine/arena.h), run by
// the engine without the GIL, and what the walk needs around them.
struct Plan : ArenaWrites {
  Node root;
  size_t nbytes = 0;          // arena size
  size_t tensor_leaves = 0;   // leaves placed in the arena
  size_t deferred = 0;        // leaves (or subtrees) the Python reference computed
  std::vector<ScalarPiece> scalar_pieces;
  std::vector<uint8_t> scalars;
  // Owners of every CopyPiece::src, so the GIL-free copy reads live memory even if another
  // thread drops the samples meanwhile: the tensors' Python objects (cheap, non-atomic
  // references) or, for tensors made here (numpy, reference results), the tensors.
  std::vector<py::object> keep_objects;
  std::vector<at::Tensor> keep_alive;

  // Everything a leaf may have added to the plan, so that a leaf found off the fast path
  // half-way (a later sample's dtype, say) leaves no piece behind: no copy of any route
  // (memcpy, transpose, conversion, fill, scalar) runs for a leaf the reference computes.
  struct Mark {
    size_t nbytes, tensor_leaves, pieces, scalar_pieces, scalars, conversions, transposes, fills, keep_objects,
        keep_alive;
  };
  Mark mark() const {
    return {nbytes,      tensor_leaves,      pieces.size(), scalar_pieces.size(), scalars.size(), conversions.size(),
            transposes.size(), fills.size(), keep_objects.size(), keep_alive.size()};
  }
  void rollback(const Mark& m) {
    nbytes = m.nbytes;
    tensor_leaves = m.tensor_leaves;
    pieces.resize(m.pieces);
    scalar_pieces.resize(m.scalar_pieces);
    scalars.resize(m.scalars);
    conversions.erase(conversions.begin() + static_cast<std::ptrdiff_t>(m.conversions), conversions.end());
    transposes.resize(m.transposes);
    fills.resize(m.fills);
    keep_objects.erase(keep_objects.begin() + static_cast<std::ptrdiff_t>(m.keep_objects), keep_objects.end());
    keep_alive.erase(keep_alive.begin() + static_cast<std::ptrdiff_t>(m.keep_alive), keep_alive.end());
  }

  size_t reserve(size_t bytes) {
    const size_t off = (nbytes + kLeafAlign - 1) / kLeafAlign * kLeafAlign;
    nbytes = off + bytes;
    return off;
  }
};

// alloc_fn(nbytes), checked to be an arena a batch can be written into (contiguous 1-D uint8 CPU,
// large enough, aligned).
at::Tensor checked_arena(py::handle alloc_fn, size_t nbytes);

struct PadConfig;

// Walks the batch (GIL held). defer_fn(samples, path) is the Python reference, called for
// anything off the fast path; it returns the collated value or raises the error to report.
// keep_formats: leaves keep the memory format torch.stack gives them outside a DataLoader
// worker (channels_last samples stay channels_last); in a worker default_collate stacks into
// a contiguous out= tensor, so everything is contiguous there.
Plan build_plan(py::handle batch, py::handle defer_fn, const PadConfig* pad = nullptr, bool keep_formats = true);

// Rebuilds the containers around views of the arena (GIL held).
py::object assemble(Plan& plan, const at::Tensor& arena, py::handle batch);

}  // namespace fastcollate
