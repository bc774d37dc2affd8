// The kernel table of the families (see registry.h): the one place that lists them.
#include "kernels/layers/registry.h"

namespace l2l::layers {

const FamilyLayers& LayersFor(ModelFamily family) {
  for (const FamilyLayers* f : {&Gpt2Layers(), &LlamaLayers(), &BertLayers(), &Gemma3Layers()}) {
    if (f->family == family) return *f;
  }
  L2L_CHECK(false) << "model family " << ToString(family) << " has no kernels registered";
  return Gpt2Layers();
}

}  // namespace l2l::layers
