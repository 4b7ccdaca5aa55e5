// The persistent-memory step's protocol (accumplan/persistent_step.h).
#include "accumplan/persistent_step.h"

#include <cmath>
#include <string>

#include "accumplan/errors.h"
#include "accumplan/search.h"
#include "accumplan/units.h"

namespace accumplan {

Trial PersistentStep::measured(int64_t peak_bytes, double seconds) const {
  // Judged against the budget also when the attempt ran without it: persistent memory over it.
  return Trial{"probe", kPersistentWindowSamples, !budget_bytes_ || peak_bytes <= *budget_bytes_, peak_bytes, seconds,
               {kPersistentWindowSamples}, std::nullopt};
}

void PersistentStep::check_loss(double loss) {
  if (std::isfinite(loss)) return;
  const std::string value = std::isnan(loss) ? "nan" : loss > 0 ? "inf" : "-inf";
  throw InputError("the loss of the first window (" + std::to_string(kPersistentWindowSamples) + " samples) is " + value +
                   ", so the optimizer cannot step and the memory training holds cannot be measured; check the data "
                   "and the model's output for NaN or inf");
}

Trial PersistentStep::out_of_memory(double seconds, const std::string& device_name) {
  if (over_budget_ || !budget_bytes_) {
    const std::string where = over_budget_ && lifted_cap_bytes_
                                  ? " even without the budget, within the host-data limit of " +
                                        format_bytes(*lifted_cap_bytes_) + " (ACCUMPLAN_MAX_HOST_DATA raises it)"
                                  : " even without a budget";
    throw InfeasibleError("the model's weights, gradients and optimizer state do not fit on " + device_name + where +
                          "; use a smaller model, an optimizer with less state (sgd keeps none), or a larger device");
  }
  over_budget_ = true;
  return Trial{"probe", kPersistentWindowSamples, false, 0, seconds, {kPersistentWindowSamples}, std::nullopt};
}

}  // namespace accumplan
