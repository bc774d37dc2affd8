// Test helper for plot_test (tests/integration/ops.cmake): writes <dir>/run.jsonl with
// eps_server/run_log.h, N steps of a plausible run (falling loss, steady throughput, a
// per-step time breakdown, a validation loss every 10 steps), so the test exercises the real writer with the real plotter.
//   l2l_ops_runlog_writer DIR N
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "eps_server/run_log.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s DIR STEPS\n", argv[0]);
    return 64;
  }
  const long n = std::strtol(argv[2], nullptr, 10);
  auto log = l2l::eps::RunLog::Open(argv[1]);
  if (!log.ok()) {
    std::fprintf(stderr, "runlog_writer: %s\n", log.status().ToString().c_str());
    return 1;
  }
  for (long s = 1; s <= n; ++s) {
    l2l::eps::StepRecord r;
    r.step = s;
    r.loss = 4.0 * std::exp(-0.05 * s) + 1.0;
    r.tokens_per_s = 5000.0 + 100.0 * std::sin(0.3 * s);
    r.lr = 3e-4 * std::min(1.0, s / 10.0);
    r.forward_s = 0.2;
    r.recompute_s = 0.15;
    r.backward_s = 0.3;
    r.wait_layer_s = 0.02 * (s % 3);
    r.wait_push_s = 0.01;
    r.update_s = 0.05;
    if (s % 10 == 0 || s == n) {  // in-job validation every 10 steps and at the last
      r.val_loss = 4.2 * std::exp(-0.04 * s) + 1.1;
      r.val_ppl = std::exp(*r.val_loss);
    }
    if (l2l::Status st = (*log)->Append(r); !st.ok()) {
      std::fprintf(stderr, "runlog_writer: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  std::printf("%s\n", (*log)->path().c_str());
  return 0;
}
