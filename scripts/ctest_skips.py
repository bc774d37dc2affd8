#!/usr/bin/env python3
"""Reads ctest's JUnit report (ctest --output-junit FILE) of one stage of scripts/test.sh and
prints the line CI's log shows at the end of the stage:

  <stage>: SKIPPED: 2 tests: netns (SKIP_RETURN_CODE=77), bf16 Gemm ... (L2L-SKIPPED: why)
  <stage>: SKIPPED: none (412 tests ran)

ctest counts a test skipped when it exits with its SKIP_RETURN_CODE (netns: 77) or its
output matches its SKIP_REGULAR_EXPRESSION (every Catch2 case: "L2L-SKIPPED:", which a case
that cannot run here prints, tests/testing/cpu_bf16_mode.h); a DISABLED test is listed too.
Exit status: 1 when CI=true and a skipped test is not allowed to skip, else 0.

Allowed to skip in CI (ALLOWED below, or the regex in $L2L_ALLOWED_SKIPS): only the CPU
bf16 GEMM cases, and only because nothing can run them on a CPU without AVX-512 (oneDNN 2.x
has no bf16 matmul below AVX-512; with AVX-512 but no AVX512_BF16 they run on its
emulation instead, tests/testing/cpu_bf16_mode.h). Every other skip fails CI; the allowed
ones are still listed.

Usage: ctest_skips.py STAGE JUNIT_XML
"""
import os
import re
import sys
import xml.etree.ElementTree as ET

ALLOWED = r"^(bf16 |L2L_CPU_GEMM selects the mode|l2l-worker --compute bf16 )"


def reason(case):
    sk = case.find("skipped")
    why = sk.get("message", "") if sk is not None else case.get("status", "")
    out = case.findtext("system-out") or ""
    m = re.search(r"L2L-SKIPPED: *(.*)", out)
    if m:
        why = m.group(1).strip()[:200]
    return why


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    stage, path = sys.argv[1], sys.argv[2]
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        print("%s: SKIPPED: unknown: ctest's JUnit report %s unreadable (%s)" % (stage, path, e))
        return 1 if os.environ.get("CI") == "true" else 0
    cases = root.iter("testcase")
    ran, skipped = 0, []
    for c in cases:
        if c.get("status") in ("notrun", "disabled"):
            skipped.append((c.get("name", "?"), reason(c)))
        else:
            ran += 1
    if not skipped:
        print("%s: SKIPPED: none (%d tests ran)" % (stage, ran))
        return 0
    allowed_re = re.compile(os.environ.get("L2L_ALLOWED_SKIPS", ALLOWED))
    bad = [n for n, _ in skipped if not allowed_re.search(n)]
    print("%s: SKIPPED: %d tests: %s" % (stage, len(skipped), "; ".join("%s (%s)" % s for s in skipped)))
    if os.environ.get("CI") == "true" and bad:
        print("%s: FAILED: CI=true and %d tests skipped that may not skip: %s" % (stage, len(bad), "; ".join(bad)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
