// ReadLayerChunk: parses one serialized l2l.data.v1.LayerChunk (proto/data.proto) from a
// gRPC ByteBuffer with one copy of its data, for the worker's FetchLayer stream
// (worker/eps_client_grpc.cc). In a header of its own so tests/worker/layer_chunk_reader_test.cc
// can feed it messages made by the generated serializer and check both of its paths.
//
// Ownership: reads *msg (not consumed); the destination belongs to the caller's `place`.
// Thread-safety: a free function; concurrent calls on different buffers are fine.
#pragma once

#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <cstdint>
#include <cstring>

#include "proto/data.pb.h"

namespace l2l::worker {

// Which parser read a chunk (reported for tests and diagnostics).
enum class LayerChunkPath { kFast, kGeneric };

// Reads one LayerChunk message without protobuf's copies: the header fields (1-5) are
// parsed in place and data (6) is copied once, to place(header, data_bytes) (nullptr:
// reject). That fast path needs protobuf's canonical order (fields by number, data last),
// which the EPS and every protobuf serializer write; other orders (or unknown fields) go
// through the generated parser. false: malformed or rejected (*bad_offset: its offset).
// *path (when not null): the parser that decided, set also when it returns false.
template <typename Place>
bool ReadLayerChunk(grpc::ByteBuffer* msg, Place&& place, int64_t* bad_offset, LayerChunkPath* path = nullptr) {
  namespace data = ::l2l::data::v1;
  enum { kOk, kBad, kGeneric };
  auto fast = [&]() {
    grpc::ProtoBufferReader stream(msg);
    google::protobuf::io::CodedInputStream in(&stream);
    data::LayerChunk header;
    for (uint32_t tag; (tag = in.ReadTag()) != 0;) {
      const uint32_t field = tag >> 3, wire = tag & 7;
      if (field == data::LayerChunk::kDataFieldNumber && wire == 2) {
        uint32_t n = 0;
        if (!in.ReadVarint32(&n)) return kBad;
        if (static_cast<size_t>(in.CurrentPosition()) + n != msg->Length()) return kGeneric;  // not last
        *bad_offset = header.offset();
        char* dst = place(header, n);
        return dst != nullptr && in.ReadRaw(dst, static_cast<int>(n)) ? kOk : kBad;
      }
      uint64_t v = 0;
      if (wire != 0) return kGeneric;  // an unknown field: let protobuf handle it
      if (!in.ReadVarint64(&v)) return kBad;
      switch (field) {
        case data::LayerChunk::kLayerFieldNumber: header.set_layer(static_cast<int64_t>(v)); break;
        case data::LayerChunk::kVersionFieldNumber: header.set_version(static_cast<int64_t>(v)); break;
        case data::LayerChunk::kDtypeFieldNumber: header.set_dtype(static_cast<data::DType>(v)); break;
        case data::LayerChunk::kNumelFieldNumber: header.set_numel(static_cast<int64_t>(v)); break;
        case data::LayerChunk::kOffsetFieldNumber: header.set_offset(static_cast<int64_t>(v)); break;
        default: return kGeneric;
      }
    }
    return kGeneric;  // no data field (an empty chunk) or a read error: the parser decides
  };
  if (path != nullptr) *path = LayerChunkPath::kFast;
  if (const int r = fast(); r != kGeneric) return r == kOk;
  if (path != nullptr) *path = LayerChunkPath::kGeneric;
  data::LayerChunk c;
  grpc::ProtoBufferReader stream(msg);
  if (!c.ParseFromZeroCopyStream(&stream)) return false;
  *bad_offset = c.offset();
  char* dst = place(c, c.data().size());
  if (dst == nullptr) return false;
  std::memcpy(dst, c.data().data(), c.data().size());
  return true;
}

}  // namespace l2l::worker
