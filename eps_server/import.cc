// See eps_server/import.h.
#include "eps_server/import.h"

#include <vector>

#include "eps_server/param_store.h"

namespace l2l::eps {

JobStart ImportStart(std::shared_ptr<const Pretrained> model) {
  JobStart start;
  start.description = model->path();
  start.load = [model](ParamStore* store) -> Status {
    if (store->num_layers() != static_cast<int64_t>(model->layout().size())) {
      return InvalidArgument(model->path() + ": " + std::to_string(model->layout().size()) + " layers, the store has " +
                             std::to_string(store->num_layers()));
    }
    std::vector<float> master, zeros;
    for (int64_t l = 0; l < store->num_layers(); ++l) {
      const size_t n = store->layout(l).numel;
      if (n != model->layout()[static_cast<size_t>(l)].numel) {
        return InvalidArgument(model->path() + ": layer " + std::to_string(l) + " size differs from the store's");
      }
      master.assign(n, 0.0f);
      zeros.assign(n, 0.0f);
      L2L_RETURN_IF_ERROR(model->LoadLayer(l, master.data()));
      L2L_RETURN_IF_ERROR(store->WriteLayer(l, master.data(), zeros.data(), zeros.data()));
    }
    return Status::Ok();
  };
  return start;
}

}  // namespace l2l::eps
