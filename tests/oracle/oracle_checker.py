"""Tolerance checks shared by the oracle scripts (torch_oracle.py, hf_oracle.py).

Checker collects failures instead of stopping at the first, so one run reports every
array that disagrees; the script exits non-zero when `failures` is not empty. Each check
prints one line: the name padded to `width`, the worst difference and ok/FAIL.
"""

import numpy as np


class Checker:
    def __init__(self, width=56):
        self.failures = []
        self.width = width

    def close(self, what, ours, ref, atol, rtol):
        """|ours - ref| <= atol + rtol * |ref| elementwise, shapes equal."""
        ours = np.asarray(ours, dtype=np.float64)
        ref = np.asarray(ref, dtype=np.float64)
        if ours.shape != ref.shape:
            self.failures.append("%s: shape %s, reference %s" % (what, ours.shape, ref.shape))
            print("  %-*s shape %s vs %s FAIL" % (self.width, what, ours.shape, ref.shape))
            return
        diff = np.abs(ours - ref)
        bound = atol + rtol * np.abs(ref)
        worst = float(np.max(diff / bound)) if diff.size else 0.0
        status = "ok" if worst <= 1.0 else "FAIL"
        print("  %-*s max|diff| %.3e  (%.3f of tolerance) %s"
              % (self.width, what, float(diff.max()) if diff.size else 0.0, worst, status))
        if worst > 1.0:
            i = np.unravel_index(np.argmax(diff / bound), diff.shape)
            self.failures.append("%s: at %s ours %.9g reference %.9g" % (what, i, ours[i], ref[i]))

    def true(self, what, cond):
        print("  %-*s %s" % (self.width, what, "ok" if cond else "FAIL"))
        if not cond:
            self.failures.append(what)
