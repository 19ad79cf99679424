// After the copy: the plan's container skeleton is rebuilt around views of the arena, with
// default_collate's rules for which container type comes back.
#include <torch/csrc/autograd/python_variable.h>

#include "python/plan.h"

namespace fastcollate {
namespace {

py::object copy_copy(py::handle obj) {
  static py::handle fn = py::object(py::module_::import("copy").attr("copy")).release();
  return fn(obj);
}

class Assembler {
 public:
  explicit Assembler(const at::Tensor& arena) : arena_(arena) {}

  py::object build(const Node& node) {
    switch (node.kind) {
      case NodeKind::Tensor:
        return py::reinterpret_steal<py::object>(THPVariable_Wrap(arena_view(arena_, node.offset, node.dtype, node.sizes,
                                                                                 node.strides)));
      case NodeKind::Object:
        return node.obj;
      case NodeKind::Dict:
        return values_dict(node);
      case NodeKind::MappingCopy: {
        py::dict values = values_dict(node);
        return or_on_type_error(values, [&] {
          py::object clone = copy_copy(node.elem);
          clone.attr("update")(values);
          return clone;
        });
      }
      case NodeKind::MappingConstruct: {
        py::dict values = values_dict(node);
        return or_on_type_error(values, [&] { return py::object(py::type::of(node.elem)(values)); });
      }
      case NodeKind::NamedTuple: {
        py::tuple fields = py::tuple(values_list(node));
        auto out = py::reinterpret_steal<py::object>(PyObject_Call(py::type::of(node.elem).ptr(), fields.ptr(), nullptr));
        if (!out) throw py::error_already_set();
        return out;
      }
      case NodeKind::List:
        return values_list(node);
      case NodeKind::SeqCopy: {
        py::list values = values_list(node);
        return or_on_type_error(values, [&] {
          py::object clone = copy_copy(node.elem);
          for (size_t i = 0; i < values.size(); ++i) clone[py::int_(i)] = values[i];
          return clone;
        });
      }
      case NodeKind::SeqConstruct: {
        py::list values = values_list(node);
        return or_on_type_error(values, [&] { return py::object(py::type::of(node.elem)(values)); });
      }
    }
    throw std::logic_error("fastcollate: unknown plan node");
  }

 private:
  py::dict values_dict(const Node& node) {
    py::dict d;
    for (size_t k = 0; k < node.keys.size(); ++k) d[node.keys[k]] = build(node.children[k]);
    return d;
  }

  py::list values_list(const Node& node) {
    py::list l(node.children.size());
    for (size_t i = 0; i < node.children.size(); ++i) l[i] = build(node.children[i]);
    return l;
  }

  // default_collate falls back to a plain dict / list when rebuilding the sample's own type
  // raises TypeError; any other error propagates.
  template <typename F>
  py::object or_on_type_error(py::object fallback, F&& rebuild) {
    try {
      return rebuild();
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_TypeError)) throw;
      return fallback;
    }
  }

  const at::Tensor& arena_;
};

}  // namespace

py::object assemble(Plan& plan, const at::Tensor& arena, py::handle batch) {
  return Assembler(arena).build(plan.root);
}

}  // namespace fastcollate
