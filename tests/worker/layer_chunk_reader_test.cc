// Tests for worker/layer_chunk_reader.h (ReadLayerChunk, the worker's FetchLayer chunk
// parser): every input is made by the generated protobuf serializer (LayerChunk of
// proto/data.proto; non-canonical orders by concatenating serialized messages, which
// protobuf defines as a merge; unknown fields through the message's UnknownFieldSet), cut
// into one or many grpc slices. The expected fields are the ones the test set (for merges:
// the merge rules, cross-checked with the generated parser). Checked: the fast in-place
// path for canonical messages, the generic path for data-not-last and unknown fields, a
// place() refusal, and that truncated or garbled buffers are rejected without a crash
// (their acceptance must agree with the generated parser's).
#include <catch2/catch.hpp>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <google/protobuf/unknown_field_set.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "proto/data.pb.h"
#include "worker/layer_chunk_reader.h"

namespace l2l::worker {
namespace {

namespace data = ::l2l::data::v1;

// `bytes` as a ByteBuffer of slices cut at `cuts` (sorted offsets inside bytes).
grpc::ByteBuffer Buffer(const std::string& bytes, const std::vector<size_t>& cuts = {}) {
  std::vector<grpc::Slice> slices;
  size_t from = 0;
  for (size_t c : cuts) {
    slices.emplace_back(bytes.data() + from, c - from);
    from = c;
  }
  slices.emplace_back(bytes.data() + from, bytes.size() - from);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// Slicings of an n-byte message: one slice, every byte its own slice (small n), and
// random cuts.
std::vector<std::vector<size_t>> Slicings(size_t n, std::mt19937* rng) {
  std::vector<std::vector<size_t>> out = {{}};
  if (n > 1 && n <= 64) {
    std::vector<size_t> each;
    for (size_t i = 1; i < n; ++i) each.push_back(i);
    out.push_back(each);
  }
  for (int k = 0; k < 3 && n > 1; ++k) {
    std::set<size_t> cuts;
    const size_t count = 1 + (*rng)() % std::min<size_t>(n - 1, 24);
    while (cuts.size() < count) cuts.insert(1 + (*rng)() % (n - 1));
    out.emplace_back(cuts.begin(), cuts.end());
  }
  return out;
}

struct Parsed {
  bool ok = false;
  LayerChunkPath path = LayerChunkPath::kFast;
  int64_t bad_offset = -1;
  int calls = 0;  // place() calls
  int64_t layer = -1, version = -1, numel = -1, offset = -1;
  int dtype = -1;
  std::string data;
};

// Runs ReadLayerChunk with a place() that records the header and hands out a buffer of
// exactly the size asked (refuse: returns nullptr).
Parsed Read(grpc::ByteBuffer* buf, bool refuse = false) {
  Parsed p;
  auto place = [&](const data::LayerChunk& h, size_t n) -> char* {
    ++p.calls;
    p.layer = h.layer();
    p.version = h.version();
    p.dtype = static_cast<int>(h.dtype());
    p.numel = h.numel();
    p.offset = h.offset();
    p.data.assign(n, '\xee');
    return refuse ? nullptr : p.data.data();
  };
  p.ok = ReadLayerChunk(buf, place, &p.bad_offset, &p.path);
  return p;
}

void CheckEquals(const Parsed& p, const data::LayerChunk& want) {
  CHECK(p.ok);
  CHECK(p.calls == 1);
  CHECK(p.layer == want.layer());
  CHECK(p.version == want.version());
  CHECK(p.dtype == static_cast<int>(want.dtype()));
  CHECK(p.numel == want.numel());
  CHECK(p.offset == want.offset());
  CHECK(p.bad_offset == want.offset());
  CHECK(p.data == want.data());
}

std::string Bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

data::LayerChunk Chunk(int64_t layer, int64_t version, data::DType dtype, int64_t numel, int64_t offset,
                       std::string bytes) {
  data::LayerChunk c;
  c.set_layer(layer);
  c.set_version(version);
  c.set_dtype(dtype);
  c.set_numel(numel);
  c.set_offset(offset);
  c.set_data(std::move(bytes));
  return c;
}

TEST_CASE("ReadLayerChunk: canonical messages take the fast path and keep every field", "[worker][grpc]") {
  std::mt19937 rng(7);
  const std::vector<data::LayerChunk> cases = {
      Chunk(3, 17, data::DTYPE_F32, 1000, 4096, Bytes(100, 1)),
      Chunk(0, 0, data::DTYPE_UNSPECIFIED, 0, 0, Bytes(5, 2)),              // only data present
      Chunk(0, 1, data::DTYPE_BF16, 0, 0, Bytes(1, 3)),                     // some headers absent
      Chunk(int64_t{1} << 40, -1, data::DTYPE_BF16, (int64_t{1} << 36) - 1,  // 10-byte varints
            (int64_t{1} << 33) + 3, Bytes(300, 4)),
      Chunk(11, 2, data::DTYPE_F32, 3 << 20, 12 << 20, Bytes((size_t{4} << 20) + 7, 5)),  // > 4 MiB, 3-byte length
  };
  for (const data::LayerChunk& want : cases) {
    std::string wire;
    REQUIRE(want.SerializeToString(&wire));
    for (const auto& cuts : Slicings(wire.size(), &rng)) {
      INFO("layer " << want.layer() << " bytes " << wire.size() << " slices " << cuts.size() + 1);
      grpc::ByteBuffer buf = Buffer(wire, cuts);
      const Parsed p = Read(&buf);
      CHECK(p.path == LayerChunkPath::kFast);
      CheckEquals(p, want);
    }
  }
}

TEST_CASE("ReadLayerChunk: data not last, unknown fields and no data go through the generic parser",
          "[worker][grpc]") {
  std::mt19937 rng(11);
  const data::LayerChunk full = Chunk(5, 9, data::DTYPE_BF16, 640, 256, Bytes(64, 6));
  data::LayerChunk only_data, header;
  only_data.set_data(full.data());
  header = full;
  header.clear_data();
  std::string data_wire, header_wire;
  REQUIRE(only_data.SerializeToString(&data_wire));
  REQUIRE(header.SerializeToString(&header_wire));

  // Unknown fields of every wire type (a newer EPS's fields), before and after the data.
  data::LayerChunk unknown;
  auto* u = unknown.GetReflection()->MutableUnknownFields(&unknown);
  u->AddVarint(99, 12345);
  u->AddLengthDelimited(100, "future");
  u->AddFixed32(101, 7);
  u->AddFixed64(102, 8);
  std::string unknown_wire;
  REQUIRE(unknown.SerializeToString(&unknown_wire));
  REQUIRE(!unknown_wire.empty());
  data::LayerChunk full_unknown = full;  // the serializer writes unknown fields last
  full_unknown.GetReflection()->MutableUnknownFields(&full_unknown)->AddVarint(99, 1);
  std::string full_unknown_wire;
  REQUIRE(full_unknown.SerializeToString(&full_unknown_wire));

  // A header field repeated after the data: the last value wins (protobuf merge).
  data::LayerChunk later_layer;
  later_layer.set_layer(42);
  std::string later_layer_wire;
  REQUIRE(later_layer.SerializeToString(&later_layer_wire));
  data::LayerChunk merged = full;
  merged.set_layer(42);

  struct Case {
    std::string name, wire;
    data::LayerChunk want;
  };
  const std::vector<Case> cases = {
      {"data first, header after", data_wire + header_wire, full},
      {"data between header fields", header_wire.substr(0, 2) + data_wire + header_wire.substr(2), full},
      {"unknown fields first", unknown_wire + header_wire + data_wire, full},
      {"unknown fields between header and data", header_wire + unknown_wire + data_wire, full},
      {"unknown field after data (serializer order)", full_unknown_wire, full},
      {"header field repeated after data", header_wire + data_wire + later_layer_wire, merged},
      {"no data field", header_wire, header},
  };
  REQUIRE(header_wire.substr(0, 2) == std::string("\x08\x05", 2));  // layer = 5: one whole field
  for (const Case& c : cases) {
    // The expected message is also what the generated parser makes of the bytes.
    data::LayerChunk oracle;
    REQUIRE(oracle.ParseFromString(c.wire));
    REQUIRE(oracle.layer() == c.want.layer());
    REQUIRE(oracle.data() == c.want.data());
    for (const auto& cuts : Slicings(c.wire.size(), &rng)) {
      INFO(c.name << ", slices " << cuts.size() + 1);
      grpc::ByteBuffer buf = Buffer(c.wire, cuts);
      const Parsed p = Read(&buf);
      CHECK(p.path == LayerChunkPath::kGeneric);
      CheckEquals(p, c.want);
    }
  }
}

TEST_CASE("ReadLayerChunk: a refusal by place() fails on either path and reports the offset", "[worker][grpc]") {
  const data::LayerChunk want = Chunk(2, 3, data::DTYPE_F32, 100, 40, Bytes(16, 8));
  std::string canonical;
  REQUIRE(want.SerializeToString(&canonical));
  data::LayerChunk only_data;
  only_data.set_data(want.data());
  data::LayerChunk header = want;
  header.clear_data();
  const std::string reordered = only_data.SerializeAsString() + header.SerializeAsString();
  for (const auto& [wire, path] : {std::pair{canonical, LayerChunkPath::kFast},
                                   std::pair{reordered, LayerChunkPath::kGeneric}}) {
    grpc::ByteBuffer buf = Buffer(wire);
    const Parsed p = Read(&buf, /*refuse=*/true);
    CHECK(!p.ok);
    CHECK(p.calls == 1);
    CHECK(p.path == path);
    CHECK(p.bad_offset == 40);
  }
}

TEST_CASE("ReadLayerChunk: truncated and garbled buffers are rejected, not crashed on", "[worker][grpc]") {
  const data::LayerChunk want = Chunk(7, 4, data::DTYPE_BF16, 300, 128, Bytes(40, 9));
  std::string wire;
  REQUIRE(want.SerializeToString(&wire));
  const size_t data_at = wire.size() - want.data().size() - 2;  // the data field's tag (1-byte length)
  REQUIRE(static_cast<uint8_t>(wire[data_at]) == ((6 << 3) | 2));

  // Every prefix: a cut inside the data field (tag, length or bytes) or inside a varint is
  // an error; a cut between whole header fields is a valid (data-less) chunk. Either way
  // the answer is the generated parser's.
  std::mt19937 rng(13);
  int rejected = 0;
  for (size_t n = 0; n < wire.size(); ++n) {
    const std::string cut = wire.substr(0, n);
    data::LayerChunk oracle;
    const bool valid = oracle.ParseFromString(cut);
    for (const auto& cuts : Slicings(n, &rng)) {
      INFO("prefix " << n << " of " << wire.size() << ", slices " << cuts.size() + 1);
      grpc::ByteBuffer buf = Buffer(cut, cuts);
      const Parsed p = Read(&buf);
      CHECK(p.ok == valid);
      if (n > data_at) CHECK(!p.ok);
      if (p.ok && valid) CheckEquals(p, oracle);
      rejected += !p.ok;
    }
  }
  CHECK(rejected > 0);

  // A length that claims more bytes than follow, on a field the fast path reads.
  {
    std::string lie = wire;
    lie[data_at + 1] = static_cast<char>(want.data().size() + 1);
    grpc::ByteBuffer buf = Buffer(lie);
    CHECK(!Read(&buf).ok);
  }
  // An unterminated 11-byte varint in a header field.
  {
    const std::string bad = std::string("\x08", 1) + std::string(11, '\xff') + wire.substr(data_at);
    grpc::ByteBuffer buf = Buffer(bad);
    CHECK(!Read(&buf).ok);
  }

  // Random garbling (flipped bytes, random bytes): acceptance agrees with the generated
  // parser and an accepted chunk holds what it parsed.
  std::mt19937 grng(17);
  int garbled_rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string g = wire;
    const int flips = 1 + static_cast<int>(grng() % 4);
    for (int k = 0; k < flips; ++k) g[grng() % g.size()] = static_cast<char>(grng());
    if (trial % 10 == 0) g = Bytes(1 + grng() % 60, grng());
    data::LayerChunk oracle;
    const bool valid = oracle.ParseFromString(g);
    std::vector<size_t> cuts;
    if (trial % 2 == 1 && g.size() > 2) cuts.push_back(1 + grng() % (g.size() - 1));
    grpc::ByteBuffer buf = Buffer(g, cuts);
    const Parsed p = Read(&buf);
    INFO("trial " << trial);
    REQUIRE(p.ok == valid);
    if (p.ok) {
      // Fields other than LayerChunk's (garbled tags) are dropped by both parsers.
      CHECK(p.layer == oracle.layer());
      CHECK(p.version == oracle.version());
      CHECK(p.dtype == static_cast<int>(oracle.dtype()));
      CHECK(p.numel == oracle.numel());
      CHECK(p.offset == oracle.offset());
      CHECK(p.data == oracle.data());
    }
    garbled_rejected += !p.ok;
  }
  CHECK(garbled_rejected > 100);
}

}  // namespace
}  // namespace l2l::worker
