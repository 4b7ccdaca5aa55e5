// python/core/loss_rules.cpp — the loss rules of accumplan/setup_rules.h, bound into accumplan._core.
//
// What it is: _core.normalizes_by_tokens, the one normalization rule (`accumplan run` and the
// exporters read it too), which accumplan.resolve_normalization (accumplan/losses.py) calls with
// its target's dimensions and whether it is floating; its InputError (a ValueError) names
// `normalization`, as Python's argument is named. _core.probability_row_tolerance, how far a row
// of class probabilities may sum from 1, which accumplan.loss_sum allows as the CLI does.
// What it is not: the loss itself (Python computes it with torch; the CLI in src/runtime/loss.cpp).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "accumplan/setup_rules.h"

namespace py = pybind11;

namespace accumplan {

void bind_loss_rules(py::module_& m) {
  m.def("normalizes_by_tokens",
        [](const std::string& normalization, const std::string& loss, int64_t target_dims, bool target_is_floating) {
          return normalizes_by_tokens(normalization, loss, target_dims, target_is_floating);
        },
        py::arg("normalization"), py::arg("loss"), py::arg("target_dims"), py::arg("target_is_floating"),
        "whether `normalization` ('samples', 'tokens', 'auto') divides `loss` by valid tokens: 'auto' is tokens "
        "for cross_entropy over a target of class indices with more than one dimension; a floating target "
        "(class probabilities) is normalized by samples. InputError for an unknown name or an impossible one");
  m.def("probability_row_tolerance", &probability_row_tolerance, py::arg("dtype"),
        "how far from 1 a row of class probabilities of `dtype` ('float32', 'bfloat16') may sum, as the CLI's "
        "data check allows");
}

}  // namespace accumplan
