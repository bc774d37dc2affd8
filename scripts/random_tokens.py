#!/usr/bin/env python3
"""Writes N uniformly random token ids below VOCAB (random.Random(SEED)) as a tokens file
(common/formats/tokens_file.h: 256 int32 header words, magic 20240520, version 1, count; uint16
tokens): the data of the CPU benchmarks, whose speed does not depend on what they read.
Usage: random_tokens.py OUT N VOCAB SEED"""
import array
import random
import sys

if len(sys.argv) != 5:
    sys.exit(__doc__)
out, n, vocab, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if n <= 0 or not 0 < vocab <= 65536:
    sys.exit(f"random_tokens.py: need N > 0 and 0 < VOCAB <= 65536, got N={n} VOCAB={vocab}")
rnd = random.Random(seed)
hdr = array.array("i", [20240520, 1, n] + [0] * 253)
tok = array.array("H", (rnd.randrange(vocab) for _ in range(n)))
if sys.byteorder != "little":
    hdr.byteswap()
    tok.byteswap()
with open(out, "wb") as f:
    hdr.tofile(f)
    tok.tofile(f)
